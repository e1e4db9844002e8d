"""Classification rehearsals through the real DAG on the local backend (issue 43, "Done when"; ADR 0004).

- An outside SIGTERM with no fault evidence: a process outside SAT (this test, as a reclaimer
  or a person's `kill` would) signals the training's processes, found by their `SAT_ATTEMPT_TAG`;
  nothing of SAT's own stop or pre-emption paths is used. The attempt is resumed without blame:
  no failover, no ledger entry.
- An ambiguous device error the training prints ('CUDA error: an illegal instruction was
  encountered', exit 1) relocates once; the second node's outcome decides, and the status
  history says which rule decided and what the second node did.
- A job that prints an Xid line of its own quarantines nothing, not even when two jobs print
  one on the same node.

Local backend, embedded S3, dag.test(), the stand-in trainers of tests/e2e/scripts. Five DAG runs:
~105 s on two cores with other suites beside them (45 s the outside SIGTERM's, which trains 400 steps).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from sat_tasks.io.node_ledger import NodeLedger
from tests.e2e.test_job_dags import SCRIPTS, make_job, run, statuses

ILLEGAL_INSTRUCTION = "RuntimeError: CUDA error: an illegal instruction was encountered"
PRINTED_XID = ("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.")


@pytest.fixture(scope="module")
def scripts(s3_hook, demo_bucket, airflow_db):
    """The stand-in trainers in the demo bucket, under test-scripts/ (as test_job_dags's fixture puts them)."""
    for path in SCRIPTS.glob("*.py"):
        s3_hook.load_file(filename=path, key=f"test-scripts/{path.name}", bucket_name=demo_bucket, replace=True)
    return f"s3://{demo_bucket}/test-scripts/"


def printing_job(name: str, lines: str, on_attempts: str, **fields):
    """A job whose training prints `lines` and exits 1 on `on_attempts` ("1", "all"), and trains cleanly otherwise."""
    env = {"FAKE_STEPS": "30", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05",
           "PRINT_LINES": lines, "PRINT_ON_ATTEMPTS": on_attempts, "PRINT_AT_STEP": "3"}
    return make_job(name, script="printing_train.py", env=env,
                    storage={"script_url": "s3://sat-demo/test-scripts/"}, **fields)


def ledger_events(job, hook) -> list[tuple[str, str, str]]:
    """The node health ledger's events of this job: (node, kind, the rule that wrote it)."""
    return [(e.node, e.kind, e.by) for e in NodeLedger.for_job(job, hook).events() if e.job == job.name]


def reasons(report: dict) -> list[str]:
    return [entry["reason"] for entry in report["history"]]


# ---- an outside SIGTERM ---------------------------------------------------------------------------------
def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.decode("utf-8", "replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)


def _tagged(job_name: str, attempt: int) -> dict[int, dict[str, str]]:
    """The running processes of the job's attempt, found as any outside process could: their environment."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(int(entry))
        if env.get("SAT_ATTEMPT_TAG") and env.get("SAT_JOB_NAME") == job_name and env.get("SAT_ATTEMPT") == str(attempt):
            found[int(entry)] = env
    return found


class OutsideSigterm(threading.Thread):
    """A process outside SAT: once the attempt has trained `at_step` steps, SIGTERM to each of its processes."""

    def __init__(self, job_name: str, attempt: int, at_step: int, deadline_s: float = 300) -> None:
        super().__init__(daemon=True)
        self.job_name, self.attempt, self.at_step, self.deadline_s = job_name, attempt, at_step, deadline_s
        self.signalled: list[int] = []
        self.step_seen: int | None = None
        self._done = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.deadline_s
        while not self._done.is_set() and time.monotonic() < end:
            procs = _tagged(self.job_name, self.attempt)
            step = self._step(procs)
            if step is not None and step >= self.at_step:
                self.step_seen = step
                for pid in procs:
                    try:
                        os.kill(pid, signal.SIGTERM)
                        self.signalled.append(pid)
                    except ProcessLookupError:
                        pass
                return
            self._done.wait(0.05)

    def _step(self, procs: dict[int, dict[str, str]]) -> int | None:
        for env in procs.values():
            try:
                progress = json.loads((Path(env["SAT_OUTPUT_DIR"]) / "concurrent_checkpoint" / "progress.json")
                                      .read_text())
            except (OSError, KeyError, ValueError):
                continue
            if progress.get("attempt") == self.attempt and progress.get("step") is not None:
                return int(progress["step"])
        return None

    def stop(self) -> None:
        self._done.set()


def test_an_outside_sigterm_with_no_fault_evidence_resumes_without_a_failover_or_a_ledger_entry(scripts, s3_hook):
    # 400 steps of 0.05 s: the signal must find the first attempt training even on a loaded machine.
    job = make_job("e2e-outside-sigterm",
                   env={"FAKE_STEPS": "400", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05"})
    killer = OutsideSigterm(job.name, attempt=1, at_step=8)
    killer.start()
    try:
        report, attempts = run(job)
    finally:
        killer.stop()
        killer.join(timeout=10)
    assert killer.signalled, "the outside SIGTERM never found the first attempt's processes"
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["PREEMPTED", "SUCCEEDED"]
    assert "Pending - failoverinprogress" not in statuses(report)
    assert statuses(report) == ["Pending", "Running", "Pending - preempted", "Running", "Completed"]
    interrupted = next(e for e in report["history"] if e["status"] == "Pending - preempted")
    assert "no failover spent" in interrupted["reason"], interrupted
    assert attempts[0]["node"] == attempts[1]["node"]  # not moved: the node is not blamed
    assert attempts[1]["resumed_from"] == attempts[0]["last_committed_step"]  # its final checkpoint
    assert ledger_events(job, s3_hook) == []


# ---- an ambiguous device error --------------------------------------------------------------------------
def test_an_ambiguous_device_error_relocates_and_a_clean_second_node_blames_the_first(scripts, s3_hook):
    job = printing_job("e2e-ambiguous-clean", ILLEGAL_INSTRUCTION, on_attempts="1")
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["SUSPECT_NODE", "SUCCEEDED"]
    first, second = attempts[0]["node"], attempts[1]["node"]
    assert first != second
    assert any("illegal instruction" in line for line in attempts[0]["evidence"])
    assert "Pending - failoverinprogress" in statuses(report)
    said = reasons(report)
    assert any(r.startswith(f"suspect node {first}: ") and "relocating once" in r for r in said), said
    assert any(r.startswith(f"relocation: attempt 2 ran clean on {second} after attempt 1's suspect fault on "
                            f"{first}: {first} is blamed") for r in said), said
    # the printed line is the job's evidence, not the node's: only the relocation's own blame (SAT saw the second
    # node run clean) is recorded against the first node
    assert ledger_events(job, s3_hook) == [(first, "HARDWARE", "relocation")]


def test_an_ambiguous_device_error_on_both_nodes_is_the_jobs_own(scripts, s3_hook):
    job = printing_job("e2e-ambiguous-twice", ILLEGAL_INSTRUCTION, on_attempts="all")
    report, attempts = run(job)
    assert report["status"] == "Pending - internalerror"
    assert [a["verdict"] for a in attempts] == ["SUSPECT_NODE", "INTERNAL"]
    first, second = attempts[0]["node"], attempts[1]["node"]
    assert first != second
    ended = report["history"][-1]
    assert ended["status"] == "Pending - internalerror"
    assert f"relocation: failed the same way on {first} (attempt 1) and {second} (attempt 2)" in ended["reason"], ended
    # nothing against either node: the relocation clears the first node's suspect fault (ADR 0004's table)
    assert ledger_events(job, s3_hook) == [(first, "CLEARED", "relocation")]


# ---- a printed Xid line ---------------------------------------------------------------------------------
def test_a_job_that_prints_an_xid_line_quarantines_nothing(scripts, s3_hook):
    nodes = []
    jobs = [printing_job(f"e2e-printed-xid-{n}", PRINTED_XID, on_attempts="1") for n in "ab"]
    for job in jobs:  # two jobs' faults on one node would quarantine it, were they the node's
        report, attempts = run(job)
        assert report["status"] == "Completed"
        assert [a["verdict"] for a in attempts] == ["HARDWARE", "SUCCEEDED"]  # still the job's verdict: failed over
        assert any("Xid" in line for line in attempts[0]["evidence"])
        nodes.append(attempts[0]["node"])
        assert ledger_events(job, s3_hook) == []
    assert nodes[0] == nodes[1]
    assert nodes[0] not in NodeLedger.for_job(jobs[0], s3_hook).quarantined()


# ---- the suspect node's health check (ADR 0004) ------------------------------------------------------------
def _history_says(report: dict, text: str) -> bool:
    return any(text in entry["reason"] for entry in report["history"])


def test_a_hardware_fault_is_confirmed_by_the_nodes_health_check_and_recorded_by_it(scripts, s3_hook):
    """Xid 79 (off the bus): the fake device's kernel check fails afterwards; the probe's lines join the evidence,
    and the ledger holds the health check's own event beside classify's."""
    job = make_job("e2e-probe-confirms", faults=[{"kind": "hardware", "attempt": 1, "at_step": 3, "xid": 79}])
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["HARDWARE", "SUCCEEDED"]
    first = attempts[0]["node"]
    assert any(line.startswith(f"health-check on {first}: device-kernel:gpu0") for line in attempts[0]["evidence"]), (
        attempts[0]["evidence"])
    assert (first, "HARDWARE", "health-check") in ledger_events(job, s3_hook)


def test_an_ambiguous_xid_on_a_node_that_probes_clean_is_left_to_the_relocation(scripts, s3_hook):
    """Xid 24 (a semaphore timeout: the application, the driver or the device) is SUSPECT_NODE; a clean probe
    decides nothing, so the job relocates once and the second node's clean run blames the first."""
    job = make_job("e2e-probe-clean", faults=[{"kind": "hardware", "attempt": 1, "at_step": 3, "xid": 24}])
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["SUSPECT_NODE", "SUCCEEDED"]
    first = attempts[0]["node"]
    assert not any("health-check" in line for line in attempts[0]["evidence"])
    # SAT read the Xid in the node's kernel log: the suspect is recorded, then the relocation's blame
    assert ledger_events(job, s3_hook) == [(first, "SUSPECT_NODE", "classify"), (first, "HARDWARE", "relocation")]
