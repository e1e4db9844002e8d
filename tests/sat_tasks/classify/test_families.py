"""The classifier's rule families (issue 27): the CUDA error table, kernel-log and collective families,
preemption sources, and `sat classify --explain`."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from sat_tasks.classify import CUDA_ERRORS, VerdictKind, classify, explain, load_record
from sat_tasks.classify.rules import (
    CUDA_AMBIGUOUS_RULES,
    CUDA_RULES,
    KUEUE_PREEMPTING_EVICTIONS,
)
from sat_tasks.cli.classify import register as register_cli
from sat_tasks.core.attempt import AttemptRecord
from tests.support.paths import SAT_FIXTURES

HW, INT, PRE = VerdictKind.HARDWARE, VerdictKind.INTERNAL, VerdictKind.PREEMPTED


def record(**fields) -> AttemptRecord:
    return AttemptRecord(**{"job": "demo", "attempt": 1, "backend": "kubernetes", "node": "gpu-1", **fields})


# ------------------------------------------------------------------ a GPU lost to the node (gpu-lost)
# The driver's and NVML's own phrasings decide; the same words in prose do not (issue 43 leftovers).
GPU_LOST = [
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    # the driver's multi-line report, its third line (NVIDIA/NVSentinel#155)
    "               NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.",
    # the open driver's check (NVIDIA/open-gpu-kernel-modules#688)
    ("Feb 17 08:00:34 abggdna-DGX-Station-A100 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from "
     "the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106"),
    # nvidia-smi, pynvml, go-nvml (leptonai/gpud#604), NVML's error string after a device call
    "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the system to recover this GPU",
    "pynvml.nvml.NVMLError_GpuIsLost: GPU is lost",
    ("failed to get remapped rows for GPU-ac896b35-5782-c478-4b2a-a661de07770f: failed to get device remapped rows: "
     "ERROR_GPU_IS_LOST"),
    'E0101 12:00:00.000000 1 health.go:123] "Failed to get device handle" device=0 err="GPU is lost"',
    "nvmlDeviceGetHandleByIndex(0) failed: GPU is lost",
]
GPU_LOST_NEAR_MISSES = [
    # a user's question quoting the driver or nvidia-smi
    "Why does my A100 say 'GPU has fallen off the bus' after a few hours?",
    "has anyone seen NVRM: GPU has fallen off the bus on H100s?",
    "Why does nvidia-smi show \"Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost\"?",
    "how do I recover from pynvml.NVMLError_GpuIsLost?",
    "nvidia-smi says the GPU is lost, how do I recover it?",
    "I think my GPU is lost after the driver update",
    # a health checker saying it is NOT lost, or quoting what it looked for
    "health: checked dmesg for 'NVRM: GPU has fallen off the bus': 0 matches",
    "[gpu-health] GPU 0 is not lost; no GPU has fallen off the bus",
    "gpu-health: nvml check passed, GPU is lost: false",
    "INFO nvml: device 0 healthy (GPU is lost = no)",
    # a job's own narration
    "The GPU has fallen off the bus in the first run, so we moved the job",
    # the first lines of the driver's multi-line report say nothing lost yet; the GPU's banner line neither
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "kernel: NVRM: GPU at PCI:0000:3b:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
]


@pytest.mark.parametrize("line", GPU_LOST)
def test_a_gpu_lost_in_the_drivers_or_nvmls_words_is_the_nodes(line):
    for exit_code in (1, 0):
        verdict = classify(record(exit_code=exit_code, node_log=[line]))
        assert verdict.kind is HW and not verdict.reason.startswith("ambiguous:"), verdict


@pytest.mark.parametrize("line", GPU_LOST_NEAR_MISSES)
def test_the_words_of_a_lost_gpu_in_prose_are_not_one(line):
    own = ["Traceback (most recent call last):", "ValueError: bad config"]
    assert classify(record(exit_code=1, log_tail=[*own, line])).kind is INT
    assert classify(record(exit_code=0, log_tail=[line])).kind is VerdictKind.SUCCEEDED


def test_the_gpu_lost_and_nvml_rules_stay_linear_on_a_huge_line():
    """Line-level guards (a question, the NVML context) are checked apart from the pattern: a 100 KB line of the
    context words, of question marks or of repeated NVRM prefixes is read in about a second, not minutes."""
    import time

    from sat_tasks.classify.evidence import find_text

    for line in (("nvml device 0 handle: ok " * 4000), "a?" * 50_000, "NVRM: Xid (PCI:0000:3b:00): 79, " * 3000):
        started = time.monotonic()
        list(find_text([line]))
        assert time.monotonic() - started < 60, line[:40]  # generous for a busy CI; the quadratic form took minutes


# ------------------------------------------------------------------ the CUDA error table

def test_every_cuda_code_is_decided_once_with_a_reason():
    names = [name for error in CUDA_ERRORS for name in error.names]
    assert len(names) == len(set(names)), "a CUDA code is decided twice"
    for error in CUDA_ERRORS:
        assert error.kind in (HW, INT) and len(error.reason) >= 10, error
        assert not (error.ambiguous and error.kind is INT), "ambiguous codes err toward HARDWARE (ADR 0004)"
    assert len(CUDA_RULES) + len(CUDA_AMBIGUOUS_RULES) == len(CUDA_ERRORS)


@pytest.mark.parametrize("error", [pytest.param(e, id=e.names[0]) for e in CUDA_ERRORS])
@pytest.mark.parametrize("prefix", [
    pytest.param("RuntimeError: CUDA error: ", id="pytorch"),
    pytest.param("torch.AcceleratorError: CUDA error: ", id="pytorch-2.8"),
    pytest.param("RuntimeError: CUDA driver error: ", id="pytorch-driver-api"),
    pytest.param("RuntimeError: Triton Error [CUDA]: ", id="triton"),
])
def test_each_cuda_code_as_the_frameworks_print_it(error, prefix):
    verdict = classify(record(exit_code=1, log_tail=[f"{prefix}{error.texts[0]}"]))
    assert verdict.kind is error.kind, verdict
    assert verdict.reason.startswith("ambiguous") is error.ambiguous


@pytest.mark.parametrize("line", [
    # NVIDIA's enum documentation words it with "was"; cudaGetErrorString without (pytorch/pytorch#58155)
    pytest.param("RuntimeError: CUDA error: uncorrectable NVLink error was detected during the execution", id="doc-was"),
    pytest.param("RuntimeError: CUDA error: an uncorrectable ECC error was encountered", id="doc-an-was"),
])
def test_a_codes_text_as_the_documentation_words_it(line):
    assert classify(record(exit_code=1, log_tail=[line])).kind is HW


def test_the_filler_word_tolerance_does_not_join_two_texts():
    """Only a filler word may stand between two words of a code's text, not another clause."""
    line = "RuntimeError: CUDA error: uncorrectable because a user NVLink error detected during the execution"
    assert classify(record(exit_code=1, log_tail=[line])).kind is INT


@pytest.mark.parametrize("error", [pytest.param(e, id=e.names[0]) for e in CUDA_ERRORS if e.kind is HW])
def test_the_enum_name_alone_decides_too(error):
    line = f"cupy.cuda.runtime.CUDARuntimeError: {error.names[0]}: {error.texts[0]}"
    assert classify(record(exit_code=1, log_tail=[line])).kind is HW


@pytest.mark.parametrize(("line", "kind", "ambiguous"), [
    # NCCL reporting a code from its own CUDA call: NCCL's rule decides unless the code is the device's.
    pytest.param("NCCL WARN Cuda failure 'uncorrectable ECC error encountered'", HW, False, id="nccl-ecc"),
    pytest.param("NCCL WARN Cuda failure 999 'unknown error'", HW, True, id="nccl-999-stays-nccls"),
    pytest.param("ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure 1 'invalid argument'",
                 HW, True, id="nccl-invalid-argument-stays-nccls"),
    # At device enumeration an initialization error is the node's, decisively.
    pytest.param("UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 3: "
                 "initialization error", HW, False, id="init-at-enumeration"),
    pytest.param("E0213 cuda_driver.cc:1368] could not retrieve CUDA device count: CUDA_ERROR_NOT_INITIALIZED: "
                 "initialization error", HW, False, id="jax-init-at-enumeration"),
    # Words of the family without a CUDA prefix are not CUDA errors.
    pytest.param("ValueError: unknown error while parsing row 12", INT, False, id="bare-unknown-error"),
    pytest.param("RuntimeError: invalid argument to the device map", INT, False, id="bare-device"),
])
def test_cuda_family_boundaries(line, kind, ambiguous):
    verdict = classify(record(exit_code=1, log_tail=[line]))
    assert verdict.kind is kind and verdict.reason.startswith("ambiguous") is ambiguous, verdict


def test_a_user_error_outranks_an_ambiguous_cuda_error_but_not_a_decisive_one():
    user = "ModuleNotFoundError: No module named 'flash_attn'"
    ambiguous = classify(record(exit_code=1, log_tail=["RuntimeError: CUDA error: unspecified launch failure", user]))
    assert ambiguous.kind is INT
    decisive = classify(record(exit_code=1, log_tail=["RuntimeError: CUDA error: system not yet initialized", user]))
    assert decisive.kind is HW


# ------------------------------------------------------------------ kernel log and collectives

@pytest.mark.parametrize(("line", "kind"), [
    pytest.param("pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:00:03.0", HW, id="aer-fatal"),
    pytest.param("pcieport 0000:80:1b.4: AER: Uncorrectable (Non-Fatal) error message received", HW, id="aer-nonfatal"),
    pytest.param("pcieport 0000:00:03.0: AER: device recovery failed", HW, id="aer-recovery-failed"),
    pytest.param("pcieport 0000:00:01.0: pciehp: Slot(1): Link Down", HW, id="link-down"),
    pytest.param("mlx5_core 0000:3b:00.0 ens1f0np0: Link down", HW, id="mlx5-link-down"),
    pytest.param("mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged", HW, id="mlx5-cable"),
    pytest.param("ib0: lost carrier", HW, id="ipoib-carrier"),
    pytest.param("mlx5_core 0000:ca:00.0: mlx5_health_try_recover:106:(pid 8): health compromised - reached miss count",
                 HW, id="mlx5-health"),
    pytest.param("NETDEV WATCHDOG: ens1f0np0 (mlx5_core): transmit queue 7 timed out", HW, id="nic-tx-timeout"),
    pytest.param("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 44 sourcetrack timeout error", HW,
                 id="nvswitch-fatal"),
    pytest.param("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Non-fatal, Link 30 LTSSM Fault Up", INT,
                 id="nvswitch-non-fatal-is-not-a-fault"),
    pytest.param("EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0", HW, id="edac-ue"),
    pytest.param("mce: Uncorrected hardware memory error in user-access at 3e8c9b000", HW, id="mce-uncorrected"),
    pytest.param("{1}[Hardware Error]: event severity: fatal", HW, id="ghes-fatal"),
    pytest.param("pcieport 0000:00:01.0: AER: Corrected error message received from 0000:01:00.0", INT,
                 id="aer-corrected-is-not-a-fault"),
    pytest.param("EDAC MC1: 1 CE memory scrubbing error on CPU_SrcID#1", INT, id="edac-ce-is-not-a-fault"),
    pytest.param("mce: [Hardware Error]: Machine check events logged", INT, id="mce-logged-is-not-a-fault"),
    pytest.param("{1}[Hardware Error]: event severity: corrected", INT, id="ghes-corrected-is-not-a-fault"),
    pytest.param("mlx5_core 0000:3b:00.0: Port module event: module 0, Cable plugged", INT, id="cable-plugged"),
])
def test_kernel_log_families(line, kind):
    assert classify(record(exit_code=1, node_log=[line])).kind is kind


@pytest.mark.parametrize("line", [
    pytest.param("RuntimeError: Timed out waiting 1800000ms for recv operation to complete", id="gloo-unnamed"),
    pytest.param("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Timed out", id="gloo-named"),
    pytest.param("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran "
                 "for 600046 milliseconds before timing out.", id="nccl-watchdog"),
    pytest.param("[Rank 0] Timeout at NCCL work: 1234, last enqueued NCCL work: 1234", id="nccl-work"),
    pytest.param("WorkHCCL(SeqNum=4, OpType=ALLGATHER) timed out after 1800000 ms", id="other-backend"),
    pytest.param("torch.distributed.DistStoreError: Socket Timeout", id="store"),
    pytest.param("wait timeout after 300000ms, keys: /rdzv/key", id="wait-timeout"),
    pytest.param("[Rank 0] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA "
                 "kernels, subsequent GPU operations might run on corrupted/incomplete data.", id="nccl-operations"),
    pytest.param("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", id="rendezvous"),
    pytest.param("RuntimeError: Rank 0 failed to pass monitoredBarrier in 1800000 ms", id="monitored-barrier"),
    pytest.param("RuntimeError: NCCL communicator was aborted on rank 3.", id="communicator-aborted"),
])
def test_collective_timeouts_are_peer_symptoms_whatever_the_backend(line):
    assert classify(record(exit_code=1, log_tail=[line])).kind is HW
    own = "ValueError: shapes (3,) and (4,) not aligned"
    assert classify(record(exit_code=1, log_tail=[own, line])).kind is INT  # the job's own error outranks it
    assert classify(record(exit_code=0, log_tail=[line])).kind is VerdictKind.SUCCEEDED


@pytest.mark.parametrize("line", [
    pytest.param("requests.exceptions.ConnectionError: Failed to send request to huggingface.co: timed out after 10 s",
                 id="http-send"),
    pytest.param("pymongo.errors.NetworkTimeout: localhost:27017: socket timeout", id="db-socket-timeout"),
    pytest.param("barrier_timeout set to 1800 seconds", id="config-print"),
])
def test_a_users_timeout_is_not_a_collective_timeout(line):
    assert classify(record(exit_code=1, log_tail=[line])).kind is INT


def test_a_collective_mismatch_is_the_code_even_with_peer_timeouts():
    mismatch = ("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
                "CollectiveFingerPrint(OpType=ALLREDUCE), but Rank 1 is running collective: REDUCE.")
    lines = [mismatch,
             "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=REDUCE)"]
    verdict = classify(record(exit_code=1, log_tail=lines))
    assert verdict.kind is INT and "different collectives" in verdict.reason


# ------------------------------------------------------------------ preemption sources

def condition(kind: str, reason: str, message: str = "") -> dict:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


@pytest.mark.parametrize(("reason", "kind"), [
    *[pytest.param(f"WorkloadEvictedDueTo{cause}", PRE, id=cause) for cause in KUEUE_PREEMPTING_EVICTIONS],
    pytest.param("WorkloadEvictedDueToNodeFailures", HW, id="NodeFailures"),
])
def test_kueue_termination_target(reason, kind):
    rec = record(exit_code=143, pod_conditions=[condition("TerminationTarget", reason)])
    assert classify(rec).kind is kind


def test_kueue_pods_ready_timeout_is_weak():
    event = {"reason": "EvictedDueToPodsReadyTimeout", "message": "Exceeded the PodsReady timeout ns/job",
             "source": {"component": "kueue-workload-controller"}}
    alone = classify(record(events=[event]))
    assert alone.kind is PRE and alone.reason.startswith("ambiguous")
    crash = classify(record(exit_code=1, events=[event], log_tail=["ImportError: cannot import name 'x' from 'y'"]))
    assert crash.kind is INT


@pytest.mark.parametrize(("pod_conditions", "kind"), [
    pytest.param([condition("DisruptionTarget", "PreemptionByScheduler")], PRE, id="PreemptionByScheduler"),
    pytest.param([condition("DisruptionTarget", "PreemptionByKubeScheduler")], PRE, id="PreemptionByKubeScheduler"),
    pytest.param([condition("DisruptionTarget", "TerminationByKubelet", "Pod was terminated in response to imminent "
                            "node shutdown.")], PRE, id="TerminationByKubelet-shutdown"),
    pytest.param([condition("DisruptionTarget", "TerminationByKubelet", "The node was low on resource: memory.")], HW,
                 id="TerminationByKubelet-pressure"),
    pytest.param([condition("DisruptionTarget", "DeletionByTaintManager")], HW, id="DeletionByTaintManager"),
    # a drain through the eviction API is a controller's interruption: no fault, resumed without blame (issue 43)
    pytest.param([condition("DisruptionTarget", "EvictionByEvictionAPI")], VerdictKind.PREEMPTED,
                 id="EvictionByEvictionAPI"),
    pytest.param([condition("DisruptionTarget", "DeletionByPodGC")], HW, id="DeletionByPodGC"),
])
def test_every_disruption_target_reason_on_demand(pod_conditions, kind):
    assert classify(record(exit_code=143, pod_conditions=pod_conditions)).kind is kind


@pytest.mark.parametrize("reason", ["DeletionByTaintManager", "EvictionByEvictionAPI", "DeletionByPodGC"])
def test_a_node_disruption_on_spot_capacity_is_a_reclaim_also_from_the_labels_at_start(reason):
    gone = record(pod_conditions=[condition("DisruptionTarget", reason)],
                  node_labels_at_start={"eks.amazonaws.com/capacityType": "SPOT"})
    verdict = classify(gone)
    assert verdict.kind is PRE and "at the attempt's start" in verdict.reason
    # The node's own labels, when it is still there, win over those read at the start.
    still_there = gone.model_copy(update={"node_labels": {"eks.amazonaws.com/capacityType": "ON_DEMAND"}})
    # ...then a node-side disruption is the node's; a drain through the eviction API a controller's (issue 43).
    assert classify(still_there).kind is (PRE if reason == "EvictionByEvictionAPI" else HW)


@pytest.mark.parametrize(("event", "exit_code", "kind"), [
    pytest.param({"reason": "DisruptionTerminating", "message": "Disrupting Node: Drifted/Replace"}, 143, PRE,
                 id="karpenter-drift-killed"),
    pytest.param({"reason": "DisruptionTerminating", "message": "Disrupting Node: Underutilized/Delete"}, 0,
                 VerdictKind.SUCCEEDED, id="karpenter-after-success"),
    pytest.param({"reason": "SpotInterrupted", "message": "Spot interruption warning was triggered"}, 1, PRE,
                 id="karpenter-spot-interrupted"),
    pytest.param({"reason": "TerminatingOnInterruption", "message": "Interruption triggered termination"}, 143, PRE,
                 id="karpenter-interruption"),
    pytest.param({"reason": "RebalanceRecommendation", "message": "EC2 rebalance recommendation"}, 1, INT,
                 id="rebalance-with-user-exit"),
    pytest.param({"reason": "SpotRebalanceRecommendation", "message": "Spot rebalance recommendation"}, 143, PRE,
                 id="rebalance-then-killed"),
    pytest.param({"reason": "Preempted", "message": "Preempted to accommodate a workload (UID: 1) due to "
                  "prioritization in the ClusterQueue", "source": {"component": "kueue-admission"}}, 143, PRE,
                 id="kueue-event"),
    pytest.param({"reason": "Evicted", "message": "Preempted to accommodate a higher priority Workload",
                  "source": {"component": "kueue"}}, 143, PRE, id="kueue-evicted-event"),
    pytest.param({"reason": "Evicted", "message": "The ClusterQueue is stopped",
                  "involvedObject": {"kind": "Workload", "name": "job-train"}}, 143, PRE,
                 id="kueue-workload-evicted-cause-in-message"),
    pytest.param({"reason": "Evicted", "message": "Workload was evicted as there was no replacement for a failed node: "
                  "gpu-1", "source": {"component": "kueue"}}, 143, VerdictKind.HARDWARE,
                 id="kueue-evicted-for-a-failed-node"),
    pytest.param({"reason": "EvictedDueToClusterQueueStopped", "message": "The ClusterQueue is stopped",
                  "involvedObject": {"kind": "Workload", "name": "job-train"}}, 143, PRE,
                 id="kueue-workload-cluster-queue-stopped"),
])
def test_preemption_events(event, exit_code, kind):
    assert classify(record(exit_code=exit_code, events=[event])).kind is kind


@pytest.mark.parametrize(("taint", "exit_code", "kind"), [
    pytest.param("karpenter.sh/disrupted", 143, PRE, id="karpenter-v1"),
    pytest.param("karpenter.sh/disruption", None, PRE, id="karpenter-beta-no-exit-status"),
    pytest.param("karpenter.sh/disrupted", 1, INT, id="karpenter-after-user-error"),
    pytest.param("aws-node-termination-handler/scheduled-maintenance", 143, PRE, id="nth-maintenance"),
    pytest.param("aws-node-termination-handler/rebalance-recommendation", 0, VerdictKind.SUCCEEDED,
                 id="rebalance-after-success"),
    pytest.param("aws-node-termination-handler/spot-itn", 1, PRE, id="spot-itn"),
])
def test_preemption_taints(taint, exit_code, kind):
    rec = record(exit_code=exit_code, node_taints=[{"key": taint, "effect": "NoSchedule"}])
    assert classify(rec).kind is kind


def test_azure_scheduled_events_conditions():
    preempt = record(exit_code=143, node_conditions=[condition("PreemptScheduled", "PreemptScheduled")])
    assert classify(preempt).kind is PRE
    terminate = record(exit_code=1, node_conditions=[condition("TerminateScheduled", "TerminateScheduled")],
                       log_tail=["TypeError: unsupported operand type(s) for +: 'int' and 'str'"])
    assert classify(terminate).kind is INT


# ------------------------------------------------------------------ --explain

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sat")
    register_cli(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_explain_names_each_matching_rule_and_the_deciding_step(tmp_path, capsys):
    rec = record(exit_code=1, log_tail=["ValueError: bad config",
                                        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)"])
    path = tmp_path / "record.json"
    path.write_text(rec.model_dump_json())
    args = parse(["classify", str(path), "--explain"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("INTERNAL: the training script raised ValueError")
    assert "[collective-timeout] HARDWARE: [Rank 1] Watchdog" in out and "peer symptom" in out
    assert "[last-exception] INTERNAL: ValueError: bad config" in out
    steps = out.split("precedence steps considered")[1].splitlines()[1:]
    assert out.split("\n\n", 1)[1].splitlines()[0].startswith("who ended it: the process itself (exit code 1)")
    assert [line.split(":")[0].strip() for line in steps] == ["0 who ended it", "1 PREEMPTED", "1a interrupted",
                                                              "2 HARDWARE", "=> 5 INTERNAL"]
    assert "outranks the peer symptoms" in steps[-1]


def test_explain_as_json_and_without_any_rule(tmp_path, capsys):
    path = tmp_path / "record.json"
    path.write_text(record(exit_code=137).model_dump_json())
    args = parse(["classify", str(path), "--explain", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    # An outside SIGKILL with nothing else: an interruption, resumed without blame (issue 43).
    assert out["kind"] == "PREEMPTED" and out["explain"]["findings"] == []
    assert out["explain"]["who_ended"]["who"] == "outside" and out["explain"]["who_ended"]["outside"] is True
    assert out["explain"]["steps"][0]["step"] == "0 who ended it"
    assert out["explain"]["steps"][-1]["step"] == "1a interrupted"
    assert re.search(r"SIGKILL", out["explain"]["steps"][-1]["outcome"])


@pytest.mark.parametrize("case", ["k8s-xid79-fallen-off-bus", "k8s-preemption-by-scheduler", "local-completed"])
def test_explain_agrees_with_classify(case):
    folder = SAT_FIXTURES / "attempts" / case
    main = folder / "pod.json" if (folder / "pod.json").exists() else folder / "record.json"
    side = {"log": "container.log", "node_log": "node.log", "events": "events.json", "node": "node.json"}
    rec = load_record(str(main), **{key: str(folder / name) for key, name in side.items() if (folder / name).exists()})
    why = explain(rec)
    assert why.verdict == classify(rec) and why.steps[-1][1].startswith("decided")
    assert json.loads((SAT_FIXTURES / "attempts" / case / "expected.json").read_text())["kind"] == why.verdict.kind.value
