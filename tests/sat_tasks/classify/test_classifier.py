"""Tests of the attempt record and the failure classifier (sat_tasks.attempt, sat_tasks.classify)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

import pytest

from sat_tasks.classify import (
    Verdict,
    VerdictKind,
    classify,
    load_record,
    record_from_pod,
)
from sat_tasks.cli.classify import register as register_cli
from sat_tasks.cli.classify import run_classify_cli
from sat_tasks.core.attempt import AttemptRecord
from tests.support.paths import REPO, SAT_FIXTURES

FIXTURES = SAT_FIXTURES / "attempts"
CASES = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
XID13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"


def load_case(case: str) -> AttemptRecord:
    """Load a fixture the way `sat classify` does: main file plus the side files present."""
    folder = FIXTURES / case
    main = folder / "pod.json" if (folder / "pod.json").exists() else folder / "record.json"
    side = {
        "log": folder / "container.log",
        "node_log": folder / "node.log",
        "events": folder / "events.json",
        "node": folder / "node.json",
    }
    return load_record(str(main), **{key: str(path) for key, path in side.items() if path.exists()})


def record(**fields) -> AttemptRecord:
    base = {"job": "demo", "attempt": 1, "backend": "local", "node": "local-0"}
    return AttemptRecord(**{**base, **fields})


# ------------------------------------------------------------------ recorded cases

def test_fixture_set_is_large_and_covers_every_kind():
    assert len(CASES) >= 40
    kinds = {json.loads((FIXTURES / case / "expected.json").read_text())["kind"] for case in CASES}
    # Not the classifier's: core.node_health derives SUSPECT_NODE from an ambiguous HARDWARE verdict, core.policy
    # STOPPED from a person's stop request and PLANNED_RESTART from the record's planned restart.
    derived = {VerdictKind.SUSPECT_NODE.value, VerdictKind.STOPPED.value, VerdictKind.PLANNED_RESTART.value}
    assert kinds == {kind.value for kind in VerdictKind} - derived


@pytest.mark.parametrize("case", [pytest.param(case, id=case) for case in CASES])
def test_recorded_case(case: str):
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    verdict = classify(load_case(case))
    assert verdict.kind.value == expected["kind"], verdict
    joined = "\n".join(verdict.evidence)
    for needle in expected["evidence_contains"]:
        assert needle in joined, f"{needle!r} not in evidence {verdict.evidence}"
    assert verdict.reason
    assert 1 <= len(verdict.evidence) <= 10


# -------------------------------------------------------------------- tricky rules

def test_hardware_xid_outranks_application_xid_in_same_log():
    verdict = classify(record(exit_code=1, node_log=[XID13, XID79]))
    assert verdict.kind is VerdictKind.HARDWARE
    assert verdict.evidence == [XID79]
    assert "79" in verdict.reason


@pytest.mark.parametrize("xid", [45, 63, 92, 121])
def test_non_fault_xids_alone_are_not_hardware(xid: int):
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=python, corrected event"
    assert classify(record(exit_code=1, node_log=[line])).kind is VerdictKind.INTERNAL
    assert classify(record(exit_code=0, node_log=[line])).kind is VerdictKind.SUCCEEDED


def test_a_contained_memory_error_alone_relocates_and_never_fails_a_clean_exit():
    """Xid 94: the application that hit the contained error must restart (the catalog's RESTART_APP), the others
    are unaffected, and the GPU is reset when convenient: not the job's code, so not INTERNAL; relocation decides."""
    line = "NVRM: Xid (PCI:0000:3b:00): 94, pid=1, name=python, Contained: SM (0x1). RST: No, D-RST: No"
    verdict = classify(record(exit_code=1, node_log=[line]))
    assert verdict.kind is VerdictKind.HARDWARE and verdict.reason.startswith("ambiguous:"), verdict
    assert classify(record(exit_code=0, node_log=[line])).kind is VerdictKind.SUCCEEDED


@pytest.mark.parametrize("xid", [48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143, 144, 147, 150, 155, 158, 171])
def test_catalog_hardware_xids(xid: int):
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=python, something"
    verdict = classify(record(exit_code=1, node_log=[line]))
    assert verdict.kind is VerdictKind.HARDWARE
    assert verdict.evidence == [line]


@pytest.mark.parametrize("xid", [13, 31, 43, 137])
def test_application_xids_are_internal_evidence(xid: int):
    line = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=python, app fault"
    verdict = classify(record(exit_code=1, node_log=[line]))
    assert verdict.kind is VerdictKind.INTERNAL
    assert line in verdict.evidence


def test_xid154_recovery_action():
    prefix = "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from"
    reboot = f"{prefix} 0x0 (None) to 0x2 (Node Reboot Required)"
    cleared = f"{prefix} 0x2 (Node Reboot Required) to 0x0 (None)"
    assert classify(record(exit_code=1, node_log=[reboot])).kind is VerdictKind.HARDWARE
    assert classify(record(exit_code=1, node_log=[cleared])).kind is VerdictKind.INTERNAL


def test_oomkilled_with_exit_137_is_internal_not_a_bare_sigkill():
    verdict = classify(record(backend="kubernetes", exit_code=137, termination_reason="OOMKilled"))
    assert verdict.kind is VerdictKind.INTERNAL
    assert "OOMKilled" in verdict.reason


def test_traceback_plus_nccl_remote_error_is_hardware():
    log = [
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, "
        "remote process exited or there was a network error, NCCL version 2.23.4",
    ]
    verdict = classify(record(exit_code=1, log_tail=log))
    assert verdict.kind is VerdictKind.HARDWARE
    assert log[-1] in verdict.evidence


def test_hardware_evidence_outranks_exit_code_zero_but_network_noise_does_not():
    assert classify(record(exit_code=0, node_log=[XID79])).kind is VerdictKind.HARDWARE
    noise = "host:1:2 [0] NCCL WARN NET/Socket : peer 10.0.0.2<1> closed connection: Connection reset by peer"
    assert classify(record(exit_code=0, log_tail=[noise])).kind is VerdictKind.SUCCEEDED
    notready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
    assert classify(record(exit_code=0, node_conditions=[notready])).kind is VerdictKind.SUCCEEDED
    assert classify(record(exit_code=1, node_conditions=[notready])).kind is VerdictKind.HARDWARE


def test_preemption_outranks_peer_network_errors_and_exit_zero():
    remote = "ncclRemoteError: remote process exited or there was a network error"
    assert classify(record(exit_code=1, preemption_notice=True, log_tail=[remote])).kind is VerdictKind.PREEMPTED
    assert classify(record(exit_code=0, preemption_notice=True)).kind is VerdictKind.PREEMPTED


def test_heartbeat_timeout_is_hardware_even_with_a_traceback():
    log = ["Traceback (most recent call last):", '  File "t.py", line 1', "KeyboardInterrupt"]
    verdict = classify(record(exit_code=137, signal=9, heartbeat_timeout=True, progress={"step": 41}, log_tail=log))
    assert verdict.kind is VerdictKind.HARDWARE
    assert "step 41" in verdict.evidence[0]


@pytest.mark.parametrize(
    ("fields", "kind"),
    [
        # An outside kill with no evidence of a fault: interrupted, resumed without blame (issue 43, ADR 0004).
        ({"exit_code": 137, "signal": 9}, VerdictKind.PREEMPTED),  # bare SIGKILL
        ({"exit_code": -9}, VerdictKind.PREEMPTED),  # subprocess style
        ({"exit_code": 143}, VerdictKind.PREEMPTED),  # bare SIGTERM
        ({"exit_code": 139}, VerdictKind.INTERNAL),  # SIGSEGV in the process's own code
        ({"exit_code": 134}, VerdictKind.INTERNAL),  # SIGABRT
        ({"exit_code": 135}, VerdictKind.INTERNAL),  # SIGBUS without memory-failure lines
        ({"exit_code": 1}, VerdictKind.INTERNAL),
        ({"exit_code": 127}, VerdictKind.INTERNAL),
        ({"exit_code": 255}, VerdictKind.INTERNAL),
        ({"exit_code": None}, VerdictKind.PREEMPTED),  # no exit status, no sign the node failed
        ({"exit_code": 0}, VerdictKind.SUCCEEDED),
    ],
)
def test_exit_status_alone(fields, kind):
    assert classify(record(**fields)).kind is kind


def test_kernel_oom_turns_a_bare_sigkill_into_internal():
    oom = "Memory cgroup out of memory: Killed process 4321 (python) total-vm:81230kB"
    verdict = classify(record(exit_code=137, signal=9, node_log=[oom]))
    assert verdict.kind is VerdictKind.INTERNAL
    assert oom in verdict.evidence


def test_disruption_target_reasons():
    def with_condition(reason: str, message: str = "") -> VerdictKind:
        condition = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}
        return classify(record(backend="kubernetes", exit_code=143, pod_conditions=[condition])).kind

    assert with_condition("PreemptionByScheduler") is VerdictKind.PREEMPTED
    assert with_condition("TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.") \
        is VerdictKind.PREEMPTED
    assert with_condition("TerminationByKubelet", "The node was low on resource: memory.") is VerdictKind.HARDWARE
    assert with_condition("DeletionByTaintManager") is VerdictKind.HARDWARE
    assert with_condition("EvictionByEvictionAPI") is VerdictKind.PREEMPTED  # a drain: a controller, no fault
    assert with_condition("DeletionByPodGC") is VerdictKind.HARDWARE


def test_false_disruption_condition_is_ignored():
    condition = {"type": "DisruptionTarget", "status": "False", "reason": "PreemptionByScheduler"}
    assert classify(record(exit_code=1, pod_conditions=[condition])).kind is VerdictKind.INTERNAL


def test_nccl_system_error_needs_a_socket_error_to_be_hardware():
    system = "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error."
    assert classify(record(exit_code=1, log_tail=[system])).kind is VerdictKind.INTERNAL
    reset = "NCCL WARN socketProgress: Connection reset by peer"
    assert classify(record(exit_code=1, log_tail=[reset, system])).kind is VerdictKind.HARDWARE


def test_torchrun_wrapper_traceback_is_not_the_cause():
    log = [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "  exitcode  : -9 (pid: 77)",
        "  traceback : Signal 9 (SIGKILL) received by PID 77",
    ]
    verdict = classify(record(exit_code=1, log_tail=log))
    assert verdict.kind is VerdictKind.PREEMPTED and verdict.reason.startswith("interrupted:")
    assert log[-1] in verdict.evidence


# torch 2.13's torchrun, as a Spot notice leaves it (tests/ckpt_engine/test_ckpt_multirank.py
# runs a 2-node job so): the pod that got SIGTERM, and its peer whose rank stopped for it.
TORCHRUN_SIGTERMED = [
    "W1130 07:12:42.647000 30047 torch/distributed/elastic/multiprocessing/api.py:1028] "
    "Sending process 30050 closing signal SIGTERM",
    "2026-11-30 07:12:42,648 WARNING [Concurrent Checkpoint] SIGTERM received: finishing the in-flight "
    "checkpoint and taking a final one within 60s",
    "Traceback (most recent call last):",
    '  File "/opt/venv/bin/torchrun", line 6, in <module>',
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py", line 84, '
    "in _terminate_process_handler",
    '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 30047 got signal: 15",
]
TORCHRUN_PEER_STOPPED = [
    "2026-11-30 07:11:27,100 WARNING [Concurrent Checkpoint] another rank received SIGTERM: finishing the "
    "in-flight checkpoint and taking a final one within 60s",
    "E1130 07:11:28.824000 29623 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 143) "
    "local_rank: 0 (pid: 29628) of binary: /opt/venv/bin/python3.11",
    "Traceback (most recent call last):",
    '  File "/opt/venv/bin/torchrun", line 6, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 143 (pid: 29628)",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
]


@pytest.mark.parametrize("log", [pytest.param(TORCHRUN_SIGTERMED, id="torchrun-got-sigterm"),
                                 pytest.param(TORCHRUN_PEER_STOPPED, id="rank-stopped-for-a-peer")])
def test_torchrun_stopped_by_sigterm_is_not_an_internal_error(log):
    """Before: INTERNAL ("the training script raised SignalException" / "exited with code 1"), so a
    Spot notice without Kubernetes evidence stopped the job instead of resuming it."""
    verdict = classify(record(exit_code=1, log_tail=log))
    # An outside SIGTERM with no fault evidence: interrupted, resumed without blame (issue 43).
    assert verdict.kind is VerdictKind.PREEMPTED and verdict.reason.startswith("interrupted:")
    if log is TORCHRUN_SIGTERMED:
        assert "killed by SIGTERM from outside" in verdict.reason and log[-1] in verdict.evidence
    else:  # the engine said why this rank stopped
        assert "after another rank received SIGTERM" in verdict.reason
        assert log[-2] in verdict.evidence and log[0] in verdict.evidence
    # With the Spot notice on record (the local backend's flag; Kubernetes: events, conditions) it is a preemption.
    assert classify(record(exit_code=1, log_tail=log, preemption_notice=True)).kind is VerdictKind.PREEMPTED


def test_a_child_exit_status_below_129_is_not_a_signal():
    log = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "  exitcode  : 2 (pid: 5)"]
    assert classify(record(exit_code=1, log_tail=log)).kind is VerdictKind.INTERNAL


def test_rank_and_timestamp_prefixes_are_understood():
    log = [
        "2026-11-29T03:12:11.123456789Z [rank3]: Traceback (most recent call last):",
        '2026-11-29T03:12:11.123456789Z [rank3]:   File "train.py", line 9, in <module>',
        "2026-11-29T03:12:11.123456789Z [rank3]: ZeroDivisionError: division by zero",
    ]
    verdict = classify(record(exit_code=1, log_tail=log))
    assert verdict.kind is VerdictKind.INTERNAL
    assert verdict.evidence[0] == log[-1]
    assert "ZeroDivisionError" in verdict.reason


def test_node_log_outside_the_attempt_window_is_ignored():
    started = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    finished = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)
    stale = "2026-11-28T21:40:02,118231+00:00 " + XID79
    later = "2026-11-29T05:00:00+0000 gpu-node-07 kernel: " + XID79
    during = "2026-11-29T03:30:00+00:00 " + XID79
    base = {"exit_code": 1, "started_at": started, "finished_at": finished}
    assert classify(record(node_log=[stale, later], **base)).kind is VerdictKind.INTERNAL
    assert classify(record(node_log=[stale, during], **base)).evidence == [during]
    assert classify(record(node_log=["[ 4417.3] " + XID79], **base)).kind is VerdictKind.HARDWARE  # no wall time


def test_image_pull_only_when_the_container_never_ran():
    waiting = {"name": "base", "state": {"waiting": {"reason": "ErrImagePull", "message": "401 Unauthorized"}}}
    assert classify(record(backend="kubernetes", container_states=[waiting])).kind is VerdictKind.IMAGE_PULL
    restarted = {**waiting, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    assert classify(record(backend="kubernetes", exit_code=1, container_states=[restarted])).kind \
        is VerdictKind.INTERNAL


def test_verdict_round_trips_through_xcom_json():
    verdict = classify(record(exit_code=1, node_log=[XID79]))
    data = verdict.to_xcom()
    assert data["kind"] == "HARDWARE" and data["evidence"] == [XID79] and data["reason"]
    assert data["attempt"] == verdict.attempt and data["node"] == verdict.node
    assert json.loads(json.dumps(data)) == data
    assert Verdict.from_xcom(data) == verdict
    assert Verdict.from_xcom(data).kind is VerdictKind.HARDWARE


def test_classify_never_raises_on_an_empty_record():
    verdict = classify(record())
    assert verdict.kind is VerdictKind.PREEMPTED and verdict.reason.startswith("interrupted:")
    assert verdict.evidence


# ------------------------------------------------------------------ attempt record

def test_attempt_record_json_round_trip_and_last_committed_step():
    original = record(
        exit_code=137, signal=9, log_tail="a\nb", started_at="2026-11-29T03:00:00Z",
        progress={"step": 130, "last_committed_step": 100}, preemption_notice=True,
    )
    assert original.log_tail == ["a", "b"]
    assert original.last_committed_step == 100
    again = AttemptRecord.model_validate(json.loads(json.dumps(original.model_dump(mode="json"))))
    assert again == original
    assert record().last_committed_step is None
    assert record(progress={"step": 3}).last_committed_step is None


def test_attempt_must_be_one_based():
    with pytest.raises(ValueError):
        record(attempt=0)


def test_record_from_pod_reads_states_conditions_and_node():
    folder = FIXTURES / "k8s-node-notready-kubelet-stopped"
    pod = json.loads((folder / "pod.json").read_text())
    node = json.loads((folder / "node.json").read_text())
    events = json.loads((folder / "events.json").read_text())["items"]
    built = record_from_pod(pod, job="llama-ft", attempt=1, log="one\ntwo\n", node_log=None, events=events, node=node)
    assert built.backend == "kubernetes"
    assert built.node == "gpu-node-07"
    assert built.exit_code == 137 and built.termination_reason == "Error"
    assert built.started_at == datetime(2026, 11, 29, 2, 1, 10, tzinfo=UTC)
    assert built.image.startswith("registry.example.com/ml/llama-train")
    assert built.log_tail == ["one", "two"]
    assert any(c["type"] == "Ready" and c["status"] == "Unknown" for c in built.node_conditions)
    assert built.node_taints == node["spec"]["taints"]  # the node's own taints, nothing added
    assert built.node_labels == node["metadata"]["labels"]
    assert built.container_states[0]["name"] == "base"
    assert AttemptRecord.model_validate(built.model_dump(mode="json")) == built


def test_spot_capacity_is_read_from_node_labels_and_real_taints():
    lost = {"termination_reason": "NodeLost", "backend": "kubernetes"}
    spot = record(**lost, node_labels={"karpenter.sh/capacity-type": "spot", "kubernetes.io/os": "linux"})
    verdict = classify(spot)
    assert verdict.kind is VerdictKind.PREEMPTED and "node label karpenter.sh/capacity-type=spot" in verdict.evidence
    on_demand = record(**lost, node_labels={"karpenter.sh/capacity-type": "on-demand"})
    assert classify(on_demand).kind is VerdictKind.HARDWARE
    # A real Spot taint (AKS taints its Spot pools) marks the capacity, not an interruption.
    aks = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}
    assert classify(record(**lost, node_taints=[aks])).kind is VerdictKind.PREEMPTED
    assert classify(record(exit_code=1, node_taints=[aks])).kind is VerdictKind.INTERNAL


def test_record_from_pod_keeps_the_pods_spot_selector_when_the_node_is_gone():
    pod = {"spec": {"nodeName": "n", "nodeSelector": {"cloud.google.com/gke-spot": "true"}},
           "status": {"reason": "NodeLost", "message": "node n which was running pod train-0 is unresponsive"}}
    built = record_from_pod(pod, job="j", attempt=1)
    assert built.node_labels == {}
    assert built.node_taints == [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "",
                                  "source": "pod nodeSelector"}]
    verdict = classify(built)
    assert verdict.kind is VerdictKind.PREEMPTED
    assert "pod nodeSelector cloud.google.com/gke-spot=true" in verdict.evidence
    # With the node object there, its labels are read and reported first.
    node = {"metadata": {"name": "n", "labels": {"cloud.google.com/gke-spot": "true"}}}
    with_node = record_from_pod(pod, job="j", attempt=1, node=node)
    assert with_node.node_labels == {"cloud.google.com/gke-spot": "true"}
    assert classify(with_node).evidence[0] == "node label cloud.google.com/gke-spot=true"


def test_record_from_pod_prefers_pod_reason_and_uses_last_state():
    pod = json.loads((FIXTURES / "k8s-evicted-memory-pressure" / "pod.json").read_text())
    built = record_from_pod(pod, job="j", attempt=2)
    assert built.termination_reason == "Evicted"
    assert "low on resource" in built.termination_message
    crash = json.loads((FIXTURES / "k8s-crashloop-last-state-exit1" / "pod.json").read_text())
    assert record_from_pod(crash, job="j", attempt=1).exit_code == 1


# ----------------------------------------------------------------------------- CLI

def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sat")
    register_cli(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_pod_with_node_log_as_json(capsys):
    folder = FIXTURES / "k8s-xid79-fallen-off-bus"
    args = parse(["classify", str(folder / "pod.json"), "--log", str(folder / "container.log"),
                  "--node-log", str(folder / "node.log"), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "HARDWARE"
    assert any("Xid (PCI:0000:3b:00): 79" in line for line in out["evidence"])


def test_cli_record_as_text(capsys):
    args = parse(["classify", str(FIXTURES / "local-broken-script" / "record.json")])
    assert run_classify_cli(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("INTERNAL: the training script raised NameError")
    assert "NameError: name 'modle' is not defined" in out


def test_cli_log_option_replaces_the_record_log(tmp_path, capsys):
    log = tmp_path / "container.log"
    log.write_text("ncclRemoteError: remote process exited or there was a network error\n")
    args = parse(["classify", str(FIXTURES / "local-exit3-no-output" / "record.json"), "--log", str(log), "--json"])
    assert run_classify_cli(args) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "HARDWARE"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("{not json", "is not JSON"), ("[1, 2]", "JSON list"), ('{"job": "x"}', "neither a pod")],
)
def test_cli_unreadable_input_exits_2_with_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "input.json"
    if content is not None:
        path.write_text(content)
    assert run_classify_cli(parse(["classify", str(path)])) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and captured.err.count("\n") == 1


def test_cli_refuses_a_record_over_the_bound_in_one_line(tmp_path, capsys, monkeypatch):
    from sat_tasks.core import bounded

    path = tmp_path / "record.json"
    path.write_text(json.dumps({"job": "x", "padding": "p" * 5000}))
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 4096)
    assert run_classify_cli(parse(["classify", str(path)])) == 2
    captured = capsys.readouterr()
    assert "record.json holds 4.9 KiB, more than the 4.0 KiB" in captured.err and captured.err.count("\n") == 1


def test_cli_as_a_subprocess(tmp_path):
    import subprocess
    import sys

    script = (
        "import argparse, sys; from sat_tasks.cli.classify import register as register_cli; "
        "p = argparse.ArgumentParser(prog='sat'); register_cli(p.add_subparsers()); "
        "a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
    )
    folder = FIXTURES / "k8s-err-image-pull-401"
    result = subprocess.run(
        [sys.executable, "-c", script, "classify", str(folder / "pod.json"), "--events", str(folder / "events.json"),
         "--json"],
        capture_output=True, text=True, check=False, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kind"] == "IMAGE_PULL"


# ---- start-up vs hang (ADR 0010) ---------------------------------------------------------------------
def test_a_start_up_timeout_is_internal_not_hardware():
    verdict = classify(record(exit_code=137, signal=9, startup_timeout=True))
    assert verdict.kind is VerdictKind.INTERNAL and "start-up" in verdict.reason
    assert verdict.evidence[0].startswith("start-up timeout")


def test_a_hang_after_start_up_is_hardware():
    assert classify(record(exit_code=137, signal=9, heartbeat_timeout=True)).kind is VerdictKind.HARDWARE


@pytest.mark.parametrize(("message", "kind"), [
    pytest.param("Startup probe failed: ", VerdictKind.INTERNAL, id="startup-probe"),
    pytest.param("Container base failed startup probe, will be restarted", VerdictKind.INTERNAL,
                 id="killed-for-startup-probe"),
    pytest.param("Liveness probe failed: ", VerdictKind.HARDWARE, id="liveness-probe"),
])
def test_the_kubelets_probe_events_tell_start_up_from_a_hang(message, kind):
    event = {"type": "Warning", "reason": "Unhealthy" if "probe failed" in message else "Killing",
             "message": message, "involvedObject": {"kind": "Pod", "name": "sat-x-a1-r0"}}
    rec = record(backend="kubernetes", exit_code=137, termination_reason="Error", events=[event])
    verdict = classify(rec)
    assert verdict.kind is kind and any(message.strip() in line for line in verdict.evidence)
