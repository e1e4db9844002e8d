"""The node health ledger: every job's node faults in Object Storage, one object per event, read by every task.

Layout under a ledger root (`[sat] node_ledger_uri`, else `<results destination>/_node-health/`
of each job; `_` cannot start a job name, so no job's results collide with it):

    nodes/<node>/events/<ms since epoch>-<run>-a<attempt>-<kind>.json   a FaultEvent
    nodes/<node>/releases/<ms since epoch>.json                         a NodeRelease

Each event and each release is its own object, written once: two tasks on two workers never
update the same object, so no write is lost and no lock is needed. The rules that read them
are `sat_tasks.core.node_health`. Call order: `diagnose_attempt` after each classify (the
relocation and three-node rules, then the events recorded); `quarantined_nodes` before a
placement; `NodeLedger.release` when a person lifts a quarantine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from sat_tasks.config import safe_run_id, sat_setting
from sat_tasks.core.handoffs import Log, Verdict
from sat_tasks.core.health_check import ProbeResult, decide_with_probe, probe_event
from sat_tasks.core.node_health import (
    LEDGER_KINDS,
    RELOCATION,
    FaultEvent,
    NodeHealth,
    NodeRelease,
    diagnose,
    fault_events,
    fleet_health,
    node_health,
    suspect_node,
)
from sat_tasks.core.status import JobStatus
from sat_tasks.io import object_storage as storage
from sat_tasks.spec import TrainingJob, split_s3_uri

LEDGER_PREFIX = "_node-health/"


def ledger_root(job: TrainingJob) -> str:
    """Where `job` records its faults: `[sat] node_ledger_uri`, else `<results destination>/_node-health/`."""
    return storage.sat_root("node_ledger_uri", LEDGER_PREFIX, job.results.destination)


def ledger_roots() -> list[str]:
    """Every root the deployment's jobs write to: `[sat] node_ledger_uri`, else those of the specs in `[sat] jobs_dir`."""
    return storage.sat_roots("node_ledger_uri", LEDGER_PREFIX)


def window_seconds() -> float:
    """`[sat] node_quarantine_window_seconds`: how far back faults count towards a quarantine."""
    return float(sat_setting("node_quarantine_window_seconds"))


def _stamp(at: float) -> str:
    return f"{int(at * 1000):015d}"


def _safe(name: str) -> str:
    return safe_run_id(name)


class NodeLedger:
    """The ledger under one or more roots: events are written to the first, everything is read from all.

    Call order: `record(event)` after a verdict; `events(since=...)`, `releases()`,
    `health(...)`, `quarantined(...)` to read; `release(node, by=...)` to lift a quarantine
    (written under every root, so every job sees it).
    """

    def __init__(self, hook: Any, roots: Sequence[str]) -> None:
        self.hook = hook
        self.roots = list(dict.fromkeys(r.rstrip("/") + "/" for r in roots))

    @classmethod
    def for_job(cls, job: TrainingJob, hook: Any) -> NodeLedger:
        """The job's own root first (where it writes), then the deployment's other roots."""
        return cls(hook, [ledger_root(job), *ledger_roots()])

    @classmethod
    def for_deployment(cls, hook: Any, roots: Sequence[str] | None = None) -> NodeLedger:
        return cls(hook, list(roots) if roots else ledger_roots())

    # ---- writing -----------------------------------------------------------------------------
    def record(self, event: FaultEvent) -> str:
        """Write one fault event (its own object); returns its URI."""
        name = f"{_stamp(event.at)}-{_safe(event.run_id)}-a{event.attempt}-{event.kind.lower()}.json"
        uri = f"{self.roots[0]}nodes/{_safe(event.node)}/events/{name}"
        storage.write_json(self.hook, uri, event.model_dump(mode="json"))
        return uri

    def release(self, node: str, *, by: str, note: str = "", now: float | None = None) -> NodeRelease:
        """Lift the node's quarantine: faults before now no longer count (a marker under every root)."""
        marker = NodeRelease(node=node, at=time.time() if now is None else now, by=by, note=note)
        for root in self.roots:
            storage.write_json(self.hook, f"{root}nodes/{_safe(node)}/releases/{_stamp(marker.at)}.json",
                               marker.model_dump(mode="json"))
        return marker

    # ---- reading -----------------------------------------------------------------------------
    def _objects(self, part: str, since: float | None) -> list[dict[str, Any]]:
        found = []
        for root in self.roots:
            bucket, prefix = split_s3_uri(root + "nodes/")
            for key in self.hook.list_keys(bucket_name=bucket, prefix=prefix) or []:
                parent, _, name = key.rpartition("/")
                if not parent.endswith("/" + part) or not name.endswith(".json"):
                    continue
                stamp = name.split("-", 1)[0].removesuffix(".json")
                if since is not None and stamp.isdigit() and int(stamp) / 1000 < since:
                    continue  # older than the window: not read at all
                data = storage.read_json(self.hook, f"s3://{bucket}/{key}")
                if isinstance(data, dict):
                    found.append(data)
        return found

    def events(self, *, since: float | None = None) -> list[FaultEvent]:
        """Every fault event (at or after `since`, epoch seconds), oldest first."""
        events = [FaultEvent.model_validate(d) for d in self._objects("events", since)]
        unique = {(e.node, e.at, e.run_id, e.attempt, e.kind): e for e in events}  # a root may be listed twice
        return sorted(unique.values(), key=lambda e: e.at)

    def releases(self) -> list[NodeRelease]:
        return sorted((NodeRelease.model_validate(d) for d in self._objects("releases", None)), key=lambda r: r.at)

    def health(self, *, now: float | None = None, window: float | None = None) -> list[NodeHealth]:
        """Every node the ledger knows: quarantined first, with the faults that count."""
        now = time.time() if now is None else now
        window = window_seconds() if window is None else window
        return fleet_health(self.events(since=now - window), self.releases(), now=now, window=window)

    def quarantined(self, *, now: float | None = None, window: float | None = None) -> list[str]:
        return [h.node for h in self.health(now=now, window=window) if h.quarantined]


# ---- what the pipeline and the backends call ------------------------------------------------------
def diagnose_attempt(run: Any, verdict: Verdict, log: Log = print, probe: Callable[[str], ProbeResult] | None = None
                     ) -> Verdict:
    """The verdict after the rules across attempts, nodes and jobs; records it in the ledger (best effort).

    `run` is the attempt's `JobRun`. An ambiguous HARDWARE verdict becomes SUSPECT_NODE; the
    relocation rule reads this run's earlier verdicts; the three-node rule and the quarantine
    read the ledger. A ledger that cannot be read or written is logged, never fatal: the
    relocation rule still holds within the run.

    `probe` (a backend's node health check, `sat_tasks.io.node_probe`; None: none) runs on the
    node of a HARDWARE or SUSPECT_NODE verdict first: a failed check makes a SUSPECT_NODE
    HARDWARE and is recorded against the node (SAT read it there), and the status history says
    so (`core.health_check`). A probe that raises is logged and decides nothing.
    """
    job, now, window = run.job, time.time(), window_seconds()
    verdict = suspect_node(verdict)
    probed = _health_check(run, verdict, probe, log) if probe is not None else None
    if probed is not None:
        verdict = probed[0]
    earlier = [v for v in (run.load_verdict(k) for k in range(1, verdict.attempt or 1)) if v is not None]
    ledger = NodeLedger.for_job(job, run.hook())
    try:
        events, releases = ledger.events(since=now - window), ledger.releases()
    except Exception as exc:  # noqa: BLE001 - the job's verdict does not wait for the ledger
        log(f"[sat] node health: could not read the ledger ({type(exc).__name__}: {exc}); this run's attempts only")
        events, releases, ledger = [], [], None
    diagnosis = diagnose(verdict, earlier, [e for e in events if e.job == job.name], job=job.name,
                         run_id=run.run_id)
    if diagnosis.rule:
        log(f"[sat] node health: {diagnosis.note}")
    if diagnosis.rule == RELOCATION and diagnosis.blamed:  # the verdict stands; the history says what was learnt
        history = run.history(log)
        history.record(JobStatus(history.current() or JobStatus.RUNNING.value), diagnosis.note,
                       attempt=verdict.attempt, task="classify")
    new = fault_events(diagnosis, job=job.name, run_id=run.run_id, now=now)
    if new and diagnosis.verdict.kind in LEDGER_KINDS and not _sat_observed(run, diagnosis.verdict, log):
        # What the training printed is the job's evidence for its verdict, never a node's (ADR 0004).
        new = [e for e in new if not (e.by == "classify" and e.node == diagnosis.verdict.node)]
    if probed is not None and probed[1] is not None:
        new.append(probed[1])  # a failed health check: SAT read it on the node
    if ledger is not None and new:
        try:
            for event in new:
                ledger.record(event)
                log(f"[sat] node health: recorded {event.kind} on {event.node} ({event.signature})")
        except Exception as exc:  # noqa: BLE001
            log(f"[sat] node health: could not record in the ledger: {type(exc).__name__}: {exc}")
        for node in dict.fromkeys(e.node for e in new):
            health = node_health(node, [*events, *new], releases, now=now, window=window)
            if health.quarantined:
                log(f"[sat] node health: {node} is quarantined: {health.summary} within {window:.0f}s; "
                    f"no job is placed there until a person releases it (`sat nodes release {node}`)")
    return diagnosis.verdict


def _health_check(run: Any, verdict: Verdict, probe: Callable[[str], ProbeResult], log: Log
                  ) -> tuple[Verdict, FaultEvent | None] | None:
    """Probe the verdict's node after a HARDWARE or SUSPECT_NODE verdict: the verdict it leaves, and the ledger
    event of a failed check. None when there is nothing to probe or the probe could not run."""
    if verdict.kind not in LEDGER_KINDS or not verdict.node:
        return None
    try:
        result = probe(verdict.node)
    except Exception as exc:  # noqa: BLE001 - a probe never decides by failing to run
        log(f"[sat] node health: the health check of {verdict.node} could not run ({type(exc).__name__}: {exc})")
        return None
    decided, note = decide_with_probe(verdict, result)
    if note:
        log(f"[sat] node health: {note}")
    if decided.kind is not verdict.kind:  # the check decided the suspect: the status history says which rule
        history = run.history(log)
        history.record(JobStatus(history.current() or JobStatus.RUNNING.value), note,
                       attempt=verdict.attempt, task="classify")
    return decided, probe_event(result, job=run.job.name, run_id=run.run_id, attempt=verdict.attempt or 0)


def _sat_observed(run: Any, verdict: Verdict, log: Log) -> bool:
    """Whether SAT itself read evidence against the verdict's node (`classify.node_evidence`): its kernel log,
    conditions, events, the runtime's state. True when the attempt's record cannot be read (as before)."""
    from sat_tasks.classify import node_evidence

    try:
        record = run.load_record(verdict.attempt or 0)
    except Exception as exc:  # noqa: BLE001 - the ledger is best effort
        log(f"[sat] node health: could not read attempt {verdict.attempt}'s record ({type(exc).__name__}); "
            "counting the verdict against its node")
        return True
    if record is None or node_evidence(record):
        return True
    log(f"[sat] node health: attempt {verdict.attempt}'s {verdict.kind.value} rests only on what the training "
        f"printed, not on what SAT read of {verdict.node}: nothing recorded against {verdict.node}")
    return False


def quarantined_nodes(job: TrainingJob, hook: Any, log: Log = print) -> list[str]:
    """The nodes no attempt of `job` may be placed on; [] (logged) when the ledger cannot be read."""
    try:
        nodes = NodeLedger.for_job(job, hook).quarantined()
    except Exception as exc:  # noqa: BLE001 - placement goes on without the ledger
        log(f"[sat] node health: could not read the ledger ({type(exc).__name__}: {exc}); placing without it")
        return []
    if nodes:
        log(f"[sat] node health: not placing on quarantined node(s) {', '.join(nodes)} "
            "(`sat nodes ls` says why; `sat nodes release NODE` lifts it)")
    return nodes


def describe(health: NodeHealth) -> list[str]:
    """The lines `sat nodes ls` and the Nodes page show for one node: its state, then each fault."""
    lines = [f"{health.node}  {health.summary}"]
    if health.released is not None:
        lines.append(f"  released {_when(health.released.at)} by {health.released.by}"
                     + (f": {health.released.note}" if health.released.note else ""))
    for fault in health.faults:
        lines.append(f"  {_when(fault.at)}  {fault.kind:<12} job {fault.job} run {fault.run_id} "
                     f"attempt {fault.attempt}  {fault.signature}")
    return lines


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def to_json(health: NodeHealth) -> dict[str, Any]:
    """One node as `sat nodes ls --json` and `GET /sat/api/nodes` give it (with its one-line summary)."""
    return {**health.model_dump(mode="json"), "summary": health.summary}
