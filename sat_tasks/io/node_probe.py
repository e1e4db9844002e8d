"""Health probes of a node's devices (issue 43 item 3; the rules are `sat_tasks.core.health_check`).

A probe reads the node and returns a `ProbeResult`; it never raises (a check that cannot run is
SKIPPED, with why). What each reads:

- `NvmlProbe`: through pynvml (when installed, on the host it runs on): per GPU the volatile
  uncorrectable and corrected ECC counts, pages retired for double-bit errors and a pending
  retirement, remapped rows pending or failed (A100 and later). Not supported counters are skipped.
- `DcgmProbe`: `dcgmi diag -r 1 -j` (DCGM's quick diagnostic) where `dcgmi` is on PATH; a test
  whose result is Fail fails the check.
- `KernelProbe`: a small matrix product on each CUDA device in a subprocess with a deadline
  (a wedged GPU hangs it), compared with the CPU's; skipped without torch or a device.
- `FakeDeviceProbe`: the local backend's fake device: the counters a test (or the demo) writes to
  `<nodes dir>/<node>/gpu-counters.json` (`FAKE_DEVICE_FILE`), judged by the same rules as NVML's.

Pluggable per backend: the local backend probes its fake device when the file is there and this
host's devices otherwise (`local_probe`); the Kubernetes form is a probe pod bound to the node,
running `main` below (`sat_tasks.backends.kubernetes.probe`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sat_tasks.core.health_check import Check, CheckStatus, ProbeResult, judge_counters

FAKE_DEVICE_FILE = "gpu-counters.json"
KERNEL_TIMEOUT_S = 120.0
DCGM_TIMEOUT_S = 300.0


class NodeProbe(Protocol):
    """Reads `node`'s devices; never raises."""

    name: str

    def __call__(self, node: str) -> ProbeResult: ...


def _skipped(name: str, why: str) -> Check:
    return Check(name=name, status=CheckStatus.SKIPPED, detail=why)


# ---- the local backend's fake device ----------------------------------------------------------------------
class FakeDeviceProbe:
    """Reads the fake device's counters from `<nodes_dir>/<node>/gpu-counters.json`.

    The file: `{"devices": [{"index": 0, "ecc_uncorrected_volatile": 0, "retired_pages_double_bit": 0,
    "retired_pages_pending": false, "remapped_rows_pending": false, "remapped_rows_failure": false,
    "kernel_ok": true}]}` (any counter may be left out; `kernel_ok` false: the device kernel gave a
    wrong answer or none). No file: every check skipped (UNKNOWN).
    """

    name = "fake-device"

    def __init__(self, nodes_dir: Path | Callable[[str], Path]) -> None:
        self._path = nodes_dir if callable(nodes_dir) else (lambda node: Path(nodes_dir) / node / FAKE_DEVICE_FILE)

    def __call__(self, node: str) -> ProbeResult:
        path = self._path(node)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return ProbeResult(node=node, at=time.time(), probe=self.name,
                               checks=[_skipped("fake-device", f"no {path.name} for {node}")])
        except (OSError, ValueError) as exc:
            return ProbeResult(node=node, at=time.time(), probe=self.name,
                               checks=[_skipped("fake-device", f"{path.name} unreadable: {type(exc).__name__}")])
        checks: list[Check] = []
        devices = data.get("devices") if isinstance(data, dict) else None
        for n, device in enumerate(devices if isinstance(devices, list) else []):
            if not isinstance(device, dict):
                continue
            label = f"gpu{device.get('index', n)}"
            checks += judge_counters(label, device)
            if "kernel_ok" in device:
                ok = device.get("kernel_ok") is True
                checks.append(Check(name=f"device-kernel:{label}", status=CheckStatus.PASS if ok else CheckStatus.FAIL,
                                    detail="matmul agrees with the CPU" if ok else "matmul gave a wrong answer or none"))
        return ProbeResult(node=node, at=time.time(), probe=self.name,
                           checks=checks or [_skipped("fake-device", "no device counters in the file")])


# ---- NVML --------------------------------------------------------------------------------------------------
def nvml_counters(nvml: Any, handle: Any) -> dict[str, Any]:
    """One GPU's counters through the pynvml module `nvml` (a counter the GPU does not support is left out)."""
    counters: dict[str, Any] = {}

    def read(key: str, fn: Callable[[], Any]) -> None:
        try:
            counters[key] = fn()
        except nvml.NVMLError:  # not supported (consumer boards, ECC off), or not this generation's
            pass

    read("ecc_uncorrected_volatile", lambda: nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
    read("ecc_corrected_volatile", lambda: nvml.nvmlDeviceGetTotalEccErrors(
        handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC))
    read("retired_pages_double_bit", lambda: len(nvml.nvmlDeviceGetRetiredPages(
        handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
    read("retired_pages_pending", lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)))

    def remapped() -> tuple[bool, bool]:
        _corrected, _uncorrected, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
        return bool(pending), bool(failure)

    try:
        counters["remapped_rows_pending"], counters["remapped_rows_failure"] = remapped()
    except (nvml.NVMLError, AttributeError):  # AttributeError: a pynvml older than the call
        pass
    return counters


class NvmlProbe:
    """The GPUs of the host it runs on, through pynvml (`nvml`: the module, for tests; default: import it)."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml

    def __call__(self, node: str) -> ProbeResult:
        return ProbeResult(node=node, at=time.time(), probe=self.name, checks=self.checks())

    def checks(self) -> list[Check]:
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return [_skipped("nvml", "pynvml is not installed")]
        try:
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no driver, no device: nothing to read here
            return [_skipped("nvml", f"NVML did not start: {exc}")]
        try:
            count = nvml.nvmlDeviceGetCount()
            checks: list[Check] = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                found = judge_counters(f"gpu{index}", nvml_counters(nvml, handle))
                checks += found or [_skipped(f"nvml:gpu{index}", "no error counter supported")]
            return checks or [_skipped("nvml", "no GPU")]
        except Exception as exc:  # noqa: BLE001 - a GPU lost while reading it is what the probe is for
            return [Check(name="nvml", status=CheckStatus.FAIL, detail=f"reading the GPUs failed: {exc}")]
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001,S110 - shutting NVML down is best effort
                pass


# ---- DCGM ---------------------------------------------------------------------------------------------------
def dcgm_checks(report: dict[str, Any]) -> list[Check]:
    """The checks of `dcgmi diag -j`'s JSON: each test's result (Pass, Fail, Warn, Skip) over its GPUs."""
    checks: list[Check] = []
    categories = report.get("DCGM GPU Diagnostic", report).get("test_categories", [])
    for category in categories if isinstance(categories, list) else []:
        for test in category.get("tests", []) if isinstance(category, dict) else []:
            name = str(test.get("name") or "?")
            results = [r for r in test.get("results", []) if isinstance(r, dict)]
            failed = [r for r in results if str(r.get("status", "")).lower() == "fail"]
            ran = [r for r in results if str(r.get("status", "")).lower() in {"pass", "warn", "fail"}]
            if failed:
                gpus = ", ".join(str(r.get("gpu_id", "?")) for r in failed)
                warning = str(failed[0].get("warnings") or failed[0].get("info") or "").strip()
                checks.append(Check(name=f"dcgm:{name}", status=CheckStatus.FAIL,
                                    detail=f"failed on GPU {gpus}" + (f": {warning}" if warning else "")))
            elif ran:
                checks.append(Check(name=f"dcgm:{name}", status=CheckStatus.PASS, detail=f"{len(ran)} GPU(s)"))
    return checks


class DcgmProbe:
    """DCGM's quick diagnostic (`dcgmi diag -r 1 -j`) where `dcgmi` is installed."""

    name = "dcgm"

    def __init__(self, dcgmi: str | None = None, timeout: float = DCGM_TIMEOUT_S) -> None:
        self._dcgmi, self._timeout = dcgmi, timeout

    def __call__(self, node: str) -> ProbeResult:
        return ProbeResult(node=node, at=time.time(), probe=self.name, checks=self.checks())

    def checks(self) -> list[Check]:
        dcgmi = self._dcgmi or shutil.which("dcgmi")
        if not dcgmi:
            return [_skipped("dcgm", "dcgmi is not installed")]
        try:
            done = subprocess.run([dcgmi, "diag", "-r", "1", "-j"], capture_output=True, text=True,
                                  timeout=self._timeout, check=False)
        except subprocess.TimeoutExpired:
            return [Check(name="dcgm", status=CheckStatus.FAIL, detail=f"dcgmi diag did not end in {self._timeout:.0f}s")]
        except OSError as exc:
            return [_skipped("dcgm", f"dcgmi could not run: {exc}")]
        try:
            report = json.loads(done.stdout)
        except ValueError:
            return [_skipped("dcgm", f"dcgmi diag exit {done.returncode}, no JSON: {done.stderr.strip()[:200]}")]
        return dcgm_checks(report if isinstance(report, dict) else {}) or [_skipped("dcgm", "no test ran")]


# ---- a small device kernel ----------------------------------------------------------------------------------
KERNEL_SCRIPT = """
import json, sys
try:
    import torch
except ImportError:
    print(json.dumps({"skipped": "torch is not installed"})); sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"skipped": "no CUDA device"})); sys.exit(0)
out = []
g = torch.Generator().manual_seed(43)
a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
want = a @ b
for i in range(torch.cuda.device_count()):
    try:
        got = (a.to(f"cuda:{i}") @ b.to(f"cuda:{i}")).cpu()
        torch.cuda.synchronize(i)
        err = float((got - want).abs().max())
        out.append({"index": i, "ok": err < 1e-1, "max_error": err})
    except Exception as exc:
        out.append({"index": i, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
print(json.dumps({"devices": out}))
"""


def kernel_checks(output: dict[str, Any]) -> list[Check]:
    """The checks of `KERNEL_SCRIPT`'s JSON line."""
    if output.get("skipped"):
        return [_skipped("device-kernel", str(output["skipped"]))]
    checks = []
    for device in output.get("devices", []):
        label = f"device-kernel:gpu{device.get('index', '?')}"
        if device.get("ok"):
            checks.append(Check(name=label, status=CheckStatus.PASS,
                                detail=f"512x512 matmul agrees with the CPU (max error {device.get('max_error', 0):.2g})"))
        else:
            why = device.get("error") or f"matmul differs from the CPU by {device.get('max_error')}"
            checks.append(Check(name=label, status=CheckStatus.FAIL, detail=str(why)))
    return checks or [_skipped("device-kernel", "no device")]


class KernelProbe:
    """A 512x512 matrix product on each CUDA device, compared with the CPU's, in a subprocess with a deadline."""

    name = "device-kernel"

    def __init__(self, python: str = sys.executable, timeout: float = KERNEL_TIMEOUT_S) -> None:
        self._python, self._timeout = python, timeout

    def __call__(self, node: str) -> ProbeResult:
        return ProbeResult(node=node, at=time.time(), probe=self.name, checks=self.checks())

    def checks(self) -> list[Check]:
        try:
            done = subprocess.run([self._python, "-c", KERNEL_SCRIPT], capture_output=True, text=True,
                                  timeout=self._timeout, check=False)
        except subprocess.TimeoutExpired:
            return [Check(name="device-kernel", status=CheckStatus.FAIL,
                          detail=f"the kernel did not end in {self._timeout:.0f}s (a wedged device?)")]
        except OSError as exc:
            return [_skipped("device-kernel", f"could not start python: {exc}")]
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if not lines:
            return [Check(name="device-kernel", status=CheckStatus.FAIL,
                          detail=f"exit {done.returncode}: {done.stderr.strip()[-300:]}")]
        return kernel_checks(json.loads(lines[-1]))


# ---- composed ---------------------------------------------------------------------------------------------------
class Probes:
    """Several probes as one: every check of each, under one name."""

    def __init__(self, probes: Sequence[NodeProbe]) -> None:
        self._probes = list(probes)
        self.name = "+".join(p.name for p in self._probes)

    def __call__(self, node: str) -> ProbeResult:
        checks: list[Check] = []
        for probe in self._probes:
            try:
                checks += probe(node).checks
            except Exception as exc:  # noqa: BLE001 - a probe never stops the others
                checks.append(_skipped(probe.name, f"{type(exc).__name__}: {exc}"))
        return ProbeResult(node=node, at=time.time(), probe=self.name, checks=checks)


def host_probe() -> Probes:
    """This host's devices: NVML's counters, DCGM's quick diagnostic, a small kernel."""
    return Probes([NvmlProbe(), DcgmProbe(), KernelProbe()])


def local_probe(nodes_dir: Path) -> NodeProbe:
    """The local backend's probe: the fake device where a test wrote one, else this host's devices."""
    fake, host = FakeDeviceProbe(nodes_dir), host_probe()

    def probe(node: str) -> ProbeResult:
        if (Path(nodes_dir) / node / FAKE_DEVICE_FILE).exists():
            return fake(node)
        return host(node)

    probe.name = "local"  # type: ignore[attr-defined]
    return probe  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sat_tasks.io.node_probe NODE [--fake-nodes-dir DIR]`: probe this host (or the fake device under
    DIR) as NODE and print the ProbeResult as one JSON line: what a probe pod pinned to the node runs, and its
    reader parses (`ProbeResult.model_validate_json`). Exit 0 HEALTHY or UNKNOWN, 1 FAULTY."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sat_tasks.io.node_probe", description=main.__doc__)
    parser.add_argument("node")
    parser.add_argument("--fake-nodes-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    probe: NodeProbe = FakeDeviceProbe(args.fake_nodes_dir) if args.fake_nodes_dir else host_probe()
    result = probe(args.node)
    print(result.model_dump_json())
    return 1 if result.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
