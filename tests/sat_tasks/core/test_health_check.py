"""The node's health check after a HARDWARE or SUSPECT_NODE verdict (issue 43 item 3), with a fake device.

The rules (`core.health_check`) judge what a probe read; the probes (`io.node_probe`) read a fake
device's counters from a file the test writes, NVML through a stand-in of pynvml's module, DCGM's
JSON and the device kernel's output. No GPU is needed; `test_the_host_probe_on_a_real_gpu` runs
where one is.
"""

from __future__ import annotations

import json
import sys

import pytest

from sat_tasks.core.handoffs import Verdict, VerdictKind
from sat_tasks.core.health_check import (
    PROBE_RULE,
    Check,
    CheckStatus,
    Health,
    ProbeResult,
    decide_with_probe,
    judge_counters,
    probe_event,
)
from sat_tasks.core.node_health import node_health
from sat_tasks.io.node_probe import (
    FAKE_DEVICE_FILE,
    DcgmProbe,
    FakeDeviceProbe,
    KernelProbe,
    NvmlProbe,
    Probes,
    dcgm_checks,
    kernel_checks,
    local_probe,
)

SUSPECT = Verdict(kind=VerdictKind.SUSPECT_NODE,
                  evidence=["RuntimeError: CUDA error: an illegal instruction was encountered"],
                  reason="ambiguous: cudaErrorIllegalInstruction", attempt=1, node="local-node-0")


def write_device(tmp_path, node: str, **counters) -> None:
    (tmp_path / node).mkdir(parents=True, exist_ok=True)
    (tmp_path / node / FAKE_DEVICE_FILE).write_text(json.dumps({"devices": [{"index": 0, **counters}]}))


HEALTHY = {"ecc_uncorrected_volatile": 0, "ecc_corrected_volatile": 12, "retired_pages_double_bit": 2,
           "retired_pages_pending": False, "remapped_rows_pending": False, "remapped_rows_failure": False,
           "kernel_ok": True}


# ---- the rules ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("counters", "failed"), [
    pytest.param(HEALTHY, [], id="healthy-corrected-errors-are-not-a-fault"),
    pytest.param({**HEALTHY, "ecc_uncorrected_volatile": 1}, ["ecc:gpu0"], id="uncorrectable-ecc"),
    pytest.param({**HEALTHY, "retired_pages_pending": True}, ["retired-pages:gpu0"], id="retirement-pending"),
    pytest.param({**HEALTHY, "retired_pages_double_bit": 60}, ["retired-pages:gpu0"], id="too-many-retired"),
    pytest.param({**HEALTHY, "remapped_rows_failure": True}, ["remapped-rows:gpu0"], id="remap-failed"),
    pytest.param({**HEALTHY, "remapped_rows_pending": True}, ["remapped-rows:gpu0"], id="remap-pending"),
    pytest.param({"xid_pending": 79}, ["xid:gpu0"], id="xid-held"),
])
def test_counters_are_judged(counters, failed):
    checks = judge_counters("gpu0", counters)
    assert [c.name for c in checks if c.status is CheckStatus.FAIL] == failed
    assert checks  # something was judged


def test_unknown_or_unsupported_counters_are_not_judged():
    assert judge_counters("gpu0", {}) == []
    assert judge_counters("gpu0", {"ecc_uncorrected_volatile": "n/a", "retired_pages_double_bit": None}) == []


def test_a_failed_check_decides_a_suspect_node_and_is_recorded_against_the_node(tmp_path):
    write_device(tmp_path, "local-node-0", **{**HEALTHY, "ecc_uncorrected_volatile": 3})
    result = FakeDeviceProbe(tmp_path)("local-node-0")
    assert result.health is Health.FAULTY
    verdict, note = decide_with_probe(SUSPECT, result)
    assert verdict.kind is VerdictKind.HARDWARE
    assert verdict.reason.startswith("health check: local-node-0 failed ecc:gpu0: fail (3 uncorrectable")
    assert verdict.reason.endswith("(ambiguous: cudaErrorIllegalInstruction)")  # what made it suspect stays said
    assert verdict.evidence[0] == SUSPECT.evidence[0]  # the signature the relocation compares is unchanged
    assert verdict.evidence[1].startswith(f"{PROBE_RULE} on local-node-0: ecc:gpu0: fail")
    assert "the suspect fault is the node's" in note
    event = probe_event(result, job="j", run_id="r", attempt=1)
    assert (event.node, event.kind, event.by) == ("local-node-0", "HARDWARE", PROBE_RULE)
    assert event.signature == "health-check: ecc failed"
    # the ledger counts it as any hardware event: two jobs' failed probes quarantine the node
    other = probe_event(result, job="k", run_id="r", attempt=1)
    assert node_health("local-node-0", [event, other], [], now=result.at + 1, window=3600).quarantined


def test_a_passed_probe_decides_nothing(tmp_path):
    write_device(tmp_path, "local-node-0", **HEALTHY)
    result = FakeDeviceProbe(tmp_path)("local-node-0")
    assert result.health is Health.HEALTHY
    verdict, note = decide_with_probe(SUSPECT, result)
    assert verdict == SUSPECT and "the relocation decides" in note
    assert probe_event(result, job="j", run_id="r", attempt=1) is None


def test_a_probe_that_could_not_run_is_unknown_and_decides_nothing(tmp_path):
    result = FakeDeviceProbe(tmp_path)("local-node-9")  # no file
    assert result.health is Health.UNKNOWN and "no gpu-counters.json" in result.summary()
    assert decide_with_probe(SUSPECT, result)[0] == SUSPECT
    (tmp_path / "local-node-9").mkdir()
    (tmp_path / "local-node-9" / FAKE_DEVICE_FILE).write_text("{not json")
    assert FakeDeviceProbe(tmp_path)("local-node-9").health is Health.UNKNOWN


def test_a_hardware_verdict_keeps_its_kind_and_gains_the_probes_line(tmp_path):
    write_device(tmp_path, "n", kernel_ok=False)
    hardware = SUSPECT.model_copy(update={"kind": VerdictKind.HARDWARE, "reason": "Xid 79", "node": "n"})
    verdict, note = decide_with_probe(hardware, FakeDeviceProbe(tmp_path)("n"))
    assert verdict.kind is VerdictKind.HARDWARE and verdict.reason == "Xid 79"
    assert verdict.evidence[1] == f"{PROBE_RULE} on n: device-kernel:gpu0: fail (matmul gave a wrong answer or none)"
    assert "confirms" in note


@pytest.mark.parametrize("kind", [VerdictKind.SUCCEEDED, VerdictKind.INTERNAL, VerdictKind.PREEMPTED])
def test_other_verdicts_are_not_probed(kind, tmp_path):
    write_device(tmp_path, "n", ecc_uncorrected_volatile=5)
    other = SUSPECT.model_copy(update={"kind": kind})
    assert decide_with_probe(other, FakeDeviceProbe(tmp_path)("n")) == (other, "")


# ---- the probes -----------------------------------------------------------------------------------------------
class FakeNvml:
    """pynvml's module as far as `NvmlProbe` calls it, over per-GPU counters."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC = 1, 0, 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict], init_error: bool = False) -> None:
        self.gpus, self.init_error, self.shut = gpus, init_error, False

    def nvmlInit(self):  # pynvml's names
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def _get(self, gpu, key):
        if key not in gpu:
            raise self.NVMLError("Not Supported")
        return gpu[key]

    def nvmlDeviceGetTotalEccErrors(self, gpu, kind, _counter):
        return self._get(gpu, "unc" if kind == 1 else "cor")

    def nvmlDeviceGetRetiredPages(self, gpu, _cause):
        return [0x1000] * self._get(gpu, "retired")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu):
        return self._get(gpu, "pending")

    def nvmlDeviceGetRemappedRows(self, gpu):
        return self._get(gpu, "remap")


def test_nvml_probe_reads_each_gpu_and_skips_what_is_not_supported():
    nvml = FakeNvml([{"unc": 0, "cor": 4, "retired": 0, "pending": 0, "remap": (0, 0, 0, 0)},
                     {"unc": 2, "cor": 0}, {}])
    result = NvmlProbe(nvml)("gpu-node-1")
    assert nvml.shut
    assert result.health is Health.FAULTY
    assert [c.name for c in result.failed] == ["ecc:gpu1"]
    assert any(c.name == "nvml:gpu2" and c.status is CheckStatus.SKIPPED for c in result.checks)
    assert NvmlProbe(FakeNvml([], init_error=True))("n").health is Health.UNKNOWN


def test_dcgm_diag_json_is_read_by_test():
    report = {"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "Blacklist", "results": [{"gpu_id": "0", "status": "Pass"}]},
            {"name": "Persistence Mode", "results": [{"gpu_id": "0", "status": "Skip"}]}]},
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Fail",
                                                "warnings": "Error using CUDA API cudaMalloc"}]}]}]}}
    checks = dcgm_checks(report)
    assert [(c.name, c.status) for c in checks] == [("dcgm:Blacklist", CheckStatus.PASS),
                                                    ("dcgm:GPU Memory", CheckStatus.FAIL)]
    assert "cudaMalloc" in checks[1].detail


def test_dcgm_probe_runs_dcgmi(tmp_path):
    assert DcgmProbe(dcgmi=str(tmp_path / "no-dcgmi"))("n").health is Health.UNKNOWN
    fake = tmp_path / "dcgmi"
    fake.write_text("#!/bin/sh\necho '{\"test_categories\": [{\"tests\": [{\"name\": \"PCIe\", \"results\": "
                    "[{\"gpu_id\": 1, \"status\": \"Fail\", \"warnings\": \"replay rate\"}]}]}]}'\n")
    fake.chmod(0o755)
    result = DcgmProbe(dcgmi=str(fake))("n")
    assert result.health is Health.FAULTY and result.failed[0].detail == "failed on GPU 1: replay rate"


def test_the_kernel_probes_output_is_judged():
    assert kernel_checks({"skipped": "no CUDA device"})[0].status is CheckStatus.SKIPPED
    checks = kernel_checks({"devices": [{"index": 0, "ok": True, "max_error": 1e-4},
                                        {"index": 1, "ok": False, "error": "RuntimeError: CUDA error: an illegal "
                                                                           "memory access was encountered"}]})
    assert [c.status for c in checks] == [CheckStatus.PASS, CheckStatus.FAIL]
    assert "illegal memory access" in checks[1].detail


def test_the_kernel_probe_fails_a_device_that_hangs_and_skips_without_one(tmp_path):
    hung = tmp_path / "python"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    result = KernelProbe(python=str(hung), timeout=0.5)("n")
    assert result.health is Health.FAULTY and "did not end" in result.failed[0].detail
    assert KernelProbe(python=str(tmp_path / "none"))("n").health is Health.UNKNOWN


def test_probes_compose_and_a_broken_probe_stops_none():
    class Broken:
        name = "broken"

        def __call__(self, node):
            raise RuntimeError("boom")

    class Passing:
        name = "passing"

        def __call__(self, node):
            return ProbeResult(node=node, at=0, probe="passing", checks=[Check(name="x", status=CheckStatus.PASS)])

    result = Probes([Broken(), Passing()])("n")
    assert result.probe == "broken+passing" and result.health is Health.HEALTHY


def test_the_local_probe_reads_the_fake_device_where_there_is_one(tmp_path):
    write_device(tmp_path, "local-node-1", xid_pending=48)
    assert local_probe(tmp_path)("local-node-1").probe == "fake-device"
    assert local_probe(tmp_path)("local-node-1").health is Health.FAULTY


@pytest.mark.gpu
def test_the_host_probe_on_a_real_gpu():
    """On a GPU machine: NVML reads every GPU and the kernel agrees with the CPU (a healthy device)."""
    from sat_tasks.io.node_probe import host_probe

    result = host_probe()("this-host")
    ran = {c.name.split(":")[0] for c in result.checks if c.status is not CheckStatus.SKIPPED}
    assert {"ecc", "device-kernel"} <= ran, result.summary()
    assert result.health is Health.HEALTHY, result.summary()
    assert sys.executable  # the kernel ran in this interpreter's environment


def test_the_probe_command_prints_one_json_line_its_reader_parses(tmp_path, capsys):
    from sat_tasks.io.node_probe import main

    write_device(tmp_path, "gpu-node-3", remapped_rows_failure=True)
    assert main(["gpu-node-3", "--fake-nodes-dir", str(tmp_path)]) == 1
    result = ProbeResult.model_validate_json(capsys.readouterr().out.strip())
    assert result.node == "gpu-node-3" and result.health is Health.FAULTY
    assert [c.name for c in result.failed] == ["remapped-rows:gpu0"]
