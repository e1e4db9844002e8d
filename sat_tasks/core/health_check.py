"""The node's health check after a HARDWARE or SUSPECT_NODE verdict, as pure rules (issue 43 item 3, ADR 0004).

One pod cannot tell a bad device from a bad kernel; a short probe on the node can often say more
(how HyperPod's and AKS's node health checks decide): the GPU's error counters (NVML's volatile
uncorrectable ECC count, retired pages and pending retirements, row remapping failures), DCGM's
quick diagnostic where it is installed, and a small device kernel whose result is compared with
the CPU's. A probe is pluggable per backend (`sat_tasks.io.node_probe`: NVML through pynvml,
`dcgmi`, a kernel in a subprocess, and the local backend's fake device); this module only judges
what they read, and says what follows:

    result = probe(node)                               # io.node_probe: ProbeResult
    verdict, note = decide_with_probe(verdict, result) # a failed check decides a SUSPECT_NODE: HARDWARE
    event = probe_event(result, ...)                   # a failed check is a ledger event SAT observed

A failed check is evidence SAT itself read on the node: it turns a SUSPECT_NODE into HARDWARE
(the node's fault, no need to wait for the relocation's second node) and is recorded against the
node. A passed probe decides nothing alone: a clean probe does not prove a device sound (a fault
may show only under load), so the relocation still decides a suspect. A probe that could not run
(no NVML, no DCGM, no device) is UNKNOWN and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sat_tasks.core.handoffs import Verdict, VerdictKind
from sat_tasks.core.node_health import FaultEvent

HEALTH_CHECK = "health check:"  # the reason's prefix of a verdict a failed health check decided
PROBE_RULE = "health-check"  # `FaultEvent.by` of the ledger events a failed check records

#: Retired pages (double-bit ECC) from which NVIDIA's guidance is to replace the board: a GPU retires
#: at most 64 pages, and a board with this many is listed for RMA (NVIDIA, "Dynamic Page Retirement",
#: DA-08096-001; GPU Memory Error Management, R535+).
RETIRED_PAGES_LIMIT = 60


class CheckStatus(str, Enum):
    """One check's outcome."""

    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"  # could not run here (no NVML, no dcgmi, no device, not supported)


class Health(str, Enum):
    """What a probe says of the node."""

    HEALTHY = "HEALTHY"  # at least one check ran and none failed
    FAULTY = "FAULTY"  # a check failed
    UNKNOWN = "UNKNOWN"  # no check could run


class Check(BaseModel):
    """One check of a probe: its name (`nvml-ecc:gpu0`, `dcgm-diag`, `device-kernel`), outcome and why."""

    model_config = ConfigDict(frozen=True)

    name: str
    status: CheckStatus
    detail: str = ""

    def line(self) -> str:
        return f"{self.name}: {self.status.value}" + (f" ({self.detail})" if self.detail else "")


class ProbeResult(BaseModel):
    """What a probe read on `node` at `at` (epoch seconds): its checks, and which probe ran them."""

    model_config = ConfigDict(frozen=True)

    node: str
    at: float
    probe: str
    checks: list[Check] = Field(default_factory=list)

    @property
    def health(self) -> Health:
        if any(c.status is CheckStatus.FAIL for c in self.checks):
            return Health.FAULTY
        if any(c.status is CheckStatus.PASS for c in self.checks):
            return Health.HEALTHY
        return Health.UNKNOWN

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status is CheckStatus.FAIL]

    def summary(self) -> str:
        """One line: the health, then the failed checks (or every check when none failed)."""
        shown = self.failed or self.checks
        return f"{self.health.value} by {self.probe} on {self.node}: " + (
            "; ".join(c.line() for c in shown) if shown else "no check ran")


# ---- judging a device's counters (NVML, or the local backend's fake device) --------------------------------
def judge_counters(device: str, counters: Mapping[str, Any]) -> list[Check]:
    """The checks of one GPU's error counters, as NVML reports them (any missing counter: not judged).

    Counters (names as `io.node_probe` reads them):
      `ecc_uncorrected_volatile` (`nvmlDeviceGetTotalEccErrors`, uncorrected, volatile): > 0 fails;
      `ecc_corrected_volatile`: corrected errors, never a failure alone (reported);
      `retired_pages_double_bit` (`nvmlDeviceGetRetiredPages`, double-bit cause): >= RETIRED_PAGES_LIMIT fails;
      `retired_pages_pending` (`nvmlDeviceGetRetiredPagesPendingStatus`): True fails (a retirement waits for a
        reset: the memory behind it is still in use);
      `remapped_rows_pending` / `remapped_rows_failure` (`nvmlDeviceGetRemappedRows`, A100 and later): a pending
        remap fails until the GPU is reset, a failed remap fails (the bank has no spare row left);
      `xid_pending`: an Xid the driver holds for the device (the fake device's way to say it is broken).
    """
    checks: list[Check] = []

    def number(key: str) -> int | None:
        value = counters.get(key)
        if value is None or isinstance(value, bool):
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            return None

    uncorrected, corrected = number("ecc_uncorrected_volatile"), number("ecc_corrected_volatile")
    if uncorrected is not None:
        extra = f", {corrected} corrected" if corrected else ""
        checks.append(Check(name=f"ecc:{device}", status=CheckStatus.FAIL if uncorrected > 0 else CheckStatus.PASS,
                            detail=f"{uncorrected} uncorrectable ECC error(s) since the driver loaded{extra}"))
    retired = number("retired_pages_double_bit")
    pending = counters.get("retired_pages_pending")
    if retired is not None or pending is not None:
        bad = bool(pending) or (retired or 0) >= RETIRED_PAGES_LIMIT
        why = []
        if retired is not None:
            why.append(f"{retired} page(s) retired for double-bit ECC (limit {RETIRED_PAGES_LIMIT})")
        if pending:
            why.append("a page retirement is pending a GPU reset")
        checks.append(Check(name=f"retired-pages:{device}", status=CheckStatus.FAIL if bad else CheckStatus.PASS,
                            detail="; ".join(why)))
    remap_pending, remap_failure = counters.get("remapped_rows_pending"), counters.get("remapped_rows_failure")
    if remap_pending is not None or remap_failure is not None:
        bad = bool(remap_pending) or bool(remap_failure)
        remap = ("row remapping failed (no spare row left)" if remap_failure else
                 "a row remap is pending a GPU reset" if remap_pending else "no row remap pending or failed")
        checks.append(Check(name=f"remapped-rows:{device}", status=CheckStatus.FAIL if bad else CheckStatus.PASS,
                            detail=remap))
    xid = number("xid_pending")
    if xid:
        checks.append(Check(name=f"xid:{device}", status=CheckStatus.FAIL, detail=f"Xid {xid} held by the driver"))
    return checks


# ---- what follows ------------------------------------------------------------------------------------------
def decide_with_probe(verdict: Verdict, result: ProbeResult | None) -> tuple[Verdict, str]:
    """The verdict after the node's health check, and one line for the task log and the status history.

    A SUSPECT_NODE whose node failed a check is HARDWARE: the probe read the fault on the node, so the
    node is blamed now (the relocation still moves the job; its second node no longer decides). A
    HARDWARE verdict keeps its kind; a failed check adds its lines to the evidence (after the first line,
    the verdict's signature, which stays as it was). A passed or unknown
    probe changes nothing (a clean probe does not prove the device sound).
    """
    if result is None or verdict.kind not in (VerdictKind.SUSPECT_NODE, VerdictKind.HARDWARE):
        return verdict, ""
    health = result.health
    if health is Health.FAULTY:
        lines = [f"{PROBE_RULE} on {result.node}: {c.line()}" for c in result.failed]
        # after the verdict's first line, which stays first: it is the signature the relocation compares
        evidence = list(dict.fromkeys([*verdict.evidence[:1], *lines, *verdict.evidence[1:]]))[:8]
        if verdict.kind is VerdictKind.SUSPECT_NODE:
            reason = (f"{HEALTH_CHECK} {result.node} failed {result.failed[0].line()} after a suspect fault: the "
                      f"node's fault, not the job's ({verdict.reason})")
            note = f"{HEALTH_CHECK} {result.summary()}: the suspect fault is the node's (HARDWARE)"
            return verdict.model_copy(update={"kind": VerdictKind.HARDWARE, "reason": reason,
                                              "evidence": evidence}), note
        note = f"{HEALTH_CHECK} {result.summary()}: confirms the hardware fault"
        return verdict.model_copy(update={"evidence": evidence}), note
    if health is Health.HEALTHY:
        decides = "the relocation decides" if verdict.kind is VerdictKind.SUSPECT_NODE else "the verdict stands"
        return verdict, f"{HEALTH_CHECK} {result.summary()}: a passed probe proves nothing alone; {decides}"
    return verdict, f"{HEALTH_CHECK} {result.summary()}: nothing decided"


def probe_event(result: ProbeResult, *, job: str, run_id: str, attempt: int) -> FaultEvent | None:
    """The ledger event of a failed health check (SAT read it on the node): HARDWARE, by "health-check".
    None when no check failed: a passed probe is not a fault, and nothing else is recorded."""
    if result.health is not Health.FAULTY:
        return None
    first = result.failed[0]
    return FaultEvent(node=result.node, at=result.at, job=job, run_id=run_id, attempt=attempt,
                      kind=VerdictKind.HARDWARE.value, signature=f"{PROBE_RULE}: {first.name.split(':')[0]} failed",
                      evidence=[c.line() for c in result.failed][:3],
                      reason=f"{HEALTH_CHECK} {result.summary()}", by=PROBE_RULE)
