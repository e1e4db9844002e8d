"""The lines a person follows while a job runs under `dag.test()`: each DAG step, each status change, training.

Read from the run's own records, not from Airflow's logs. An Airflow listener (the task
runner calls it in this process) says when a task starts and ends; one watcher thread
turns that into lines, reading what the run wrote: the status history, the verdicts and
SAT's `attempt_end` records (Object Storage), the engine's progress.json and the training
metrics (the run's local directory), as the local backend leaves them.

Call order: `RunWatcher(job, hook, console)` -> `with watcher.watching():` run the DAG.
The formatting functions below it are pure, for tests.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from ckpt_engine.contract import PROGRESS_NAME, ProgressRecord
from sat_tasks.cli.console import Console
from sat_tasks.core.attempt import attempt_in_task_id
from sat_tasks.core.bounded import json_objects, read_file, tail_file

# Airflow's own marker (`airflow.listeners.hookimpl` is this, for the project "airflow"): no Airflow import here.
hookimpl = pluggy.HookimplMarker("airflow")

POLL_S = 1.0  # training progress (local files) and queued task events
HANDLED_WAIT_S = 10.0  # how long a task's end waits for its line (the records it wrote are read first)
STATUS_POLL_S = 2.0  # the status history (Object Storage) between task events
METRICS_TAIL_BYTES = 16_384
TASK_WIDTH = 20


# ---- what the lines say (pure) ------------------------------------------------------------------
@dataclass(frozen=True)
class TrainingProgress:
    """Where the training of one attempt is, from progress.json and the newest training metrics."""

    attempt: int
    node: str | None = None
    step: int | None = None
    loss: float | None = None
    steps_per_second: float | None = None
    last_committed_step: int | None = None


def elapsed(seconds: float) -> str:
    """`[m:ss]` since the run started."""
    minutes, secs = divmod(int(max(seconds, 0)), 60)
    return f"[{minutes}:{secs:02d}]"


def status_line(entry: dict[str, Any]) -> str:
    """One status change, as the status history records it."""
    return f"status {entry.get('status')}: {entry.get('reason')}"


def task_line(task_id: str, outcome: str, seconds: float | None = None, detail: str = "") -> str:
    """One finished DAG step: its id, how it ended (or what it found), how long it ran, and why."""
    took = f" ({seconds:.1f}s)" if seconds is not None and seconds >= 0.05 else ""
    return f"{task_id:<{TASK_WIDTH}} {outcome}{took}" + (f": {detail}" if detail else "")


def verdict_outcome(verdict: dict[str, Any]) -> tuple[str, str]:
    """What classify found (verdict, node, the last committed checkpoint), and why."""
    checkpoint = verdict.get("last_committed_step")
    what = (f"{verdict.get('kind')} on {verdict.get('node')}, last checkpoint "
            f"{checkpoint if checkpoint is not None else 'none'}")
    return what, str(verdict.get("reason") or "")


def decision_outcome(record: dict[str, Any]) -> tuple[str, str]:
    """What decide chose, from SAT's `attempt_end` record: verdict -> action, and the checkpoint it resumes from."""
    text = f"{record.get('verdict')} -> {record.get('action')}"
    if record.get("action") in ("failover", "resume") and record.get("last_committed_step") is not None:
        text += f" from checkpoint {record['last_committed_step']}"
    return text, ""


def training_line(progress: TrainingProgress) -> str:
    """The training progress of an attempt: step, loss, steps/s, the last committed checkpoint."""
    where = f"attempt {progress.attempt}" + (f" on {progress.node}" if progress.node else "")
    if progress.step is None:
        return f"training: {where}, starting"
    parts = [f"step {progress.step}"]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if progress.steps_per_second is not None:
        parts.append(f"{progress.steps_per_second:.1f} steps/s")
    parts.append("checkpoint " + (str(progress.last_committed_step) if progress.last_committed_step is not None
                                  else "none yet"))
    return f"training: {where}, " + ", ".join(parts)


def read_training(output_dir: Path, metrics_dir: Path, attempt: int) -> TrainingProgress | None:
    """The attempt's progress from the run's local files, as the local backend leaves them.

    The engine's progress.json (in its checkpoint root, a folder of `output_dir`) and the
    newest training metrics (`<metrics_dir>/attempt-<k>/<node>/training.jsonl`). None when
    neither has anything of this attempt yet.
    """
    progress = next((ProgressRecord.from_dict(found) for found in map(_read_json, sorted(
        output_dir.glob(f"*/{PROGRESS_NAME}"))) if isinstance(found, dict) and found), None)
    if progress is not None and progress.attempt not in (None, attempt):
        progress = None
    node, records = None, []
    nodes = sorted((metrics_dir / f"attempt-{attempt}").glob("*/training.jsonl"))
    if nodes:
        node_file = next((p for p in nodes if not re.search(r"-r\d+$", p.parent.name)), nodes[0])  # node rank 0
        node, records = node_file.parent.name, _tail_records(node_file)
    if progress is None and not records:
        return None
    newest = records[-1] if records else {}
    loss = next((r["loss"] for r in reversed(records) if r.get("loss") is not None), None)
    steps = [s for s in (progress.step if progress else None, newest.get("global_step")) if s is not None]
    return TrainingProgress(attempt=attempt, node=node, step=max(steps) if steps else None, loss=loss,
                            steps_per_second=newest.get("steps_per_second"),
                            last_committed_step=progress.last_committed_step if progress else None)


def _read_json(path: Path) -> Any:
    """The JSON document at `path`, None when unreadable, not JSON or over the bound (the training writes it)."""
    try:
        return json.loads(read_file(path))
    except (OSError, ValueError):  # ObjectTooLargeError is a ValueError
        return None


def _tail_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of the end of `path` (a series file grows for the whole attempt)."""
    try:
        return json_objects(tail_file(path, METRICS_TAIL_BYTES)[0].decode("utf-8", "replace"))
    except OSError:
        return []


# ---- the watcher -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _TaskEvent:
    kind: str  # "start" or "end"
    task_id: str
    run_id: str
    at: float
    outcome: str = ""
    error: str = ""
    handled: threading.Event = field(default_factory=threading.Event)


class RunWatcher:
    """Prints a run's steps, status changes and training progress on `console` while `watching()` is open.

    `hook` is an S3Hook on the run's Object Storage, used only by the watcher's thread. `dag_id`:
    the DAG that runs the job, which scopes the run's results prefix as validate_spec records it
    (ADR 0024; None: the legacy prefix).
    """

    def __init__(self, job: Any, hook: Any, console: Console, clock: Callable[[], float] = time.monotonic, *,
                 dag_id: str | None = None) -> None:
        self.job = job
        self.dag_id = dag_id
        self.hook = hook
        self.console = console
        self.clock = clock
        self.started = clock()
        self._events: queue.Queue[_TaskEvent] = queue.Queue()
        self._stop = threading.Event()
        self._run: Any = None
        self._statuses_seen = 0
        self._status_polled = 0.0
        self._task_started: dict[str, float] = {}
        self._training: int | None = None  # the attempt whose launch runs
        self._checkpoint_shown: int | None | bool = False  # the checkpoint of its last progress line (False: none yet)

    @contextlib.contextmanager
    def watching(self) -> Iterator[RunWatcher]:
        """Listen to the task runner and follow the run's records until the block ends."""
        from airflow.sdk.listener import get_listener_manager

        listener = TaskListener(self)
        manager = get_listener_manager()
        manager.add_listener(listener)
        thread = threading.Thread(target=self._loop, name="sat-progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            manager.pm.unregister(listener)

    # ---- called by the listener (the task runner's thread) ----------------------------------------
    def task_started(self, task_id: str, run_id: str) -> None:
        self._events.put(_TaskEvent("start", task_id, run_id, self.clock()))

    def task_ended(self, task_id: str, run_id: str, outcome: str, error: str = "") -> None:
        """Queue the task's end and wait (a little) for its line: the next task's records come after it."""
        event = _TaskEvent("end", task_id, run_id, self.clock(), outcome, error)
        self._events.put(event)
        event.handled.wait(HANDLED_WAIT_S)

    # ---- the watcher's thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Empty):
                self._take(self._events.get(timeout=POLL_S))
            if self._run is not None and self.clock() - self._status_polled >= STATUS_POLL_S:
                self._guarded(self._poll_statuses)
            if self._training is not None:
                self._guarded(self._poll_training)
        while not self._events.empty():
            self._take(self._events.get())
        if self._run is not None:
            self._guarded(self._poll_statuses)

    def _take(self, event: _TaskEvent) -> None:
        try:
            self._guarded(self._handle, event)
        finally:
            event.handled.set()

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """A progress line that cannot be read is left out; the run goes on (the reason goes to the log)."""
        try:
            fn(*args)
        except Exception as error:  # noqa: BLE001 - the watcher must never stop the run
            print(f"[sat progress] {fn.__name__}: {type(error).__name__}: {error}", file=sys.stderr)

    def _say(self, at: float, text: str) -> None:
        self.console.line(f"{elapsed(at - self.started)} {text}")

    def _handle(self, event: _TaskEvent) -> None:
        if self._run is None:
            from sat_tasks.io.run_layout import JobRun

            self._run = JobRun.of(self.job, self.dag_id, event.run_id) if self.dag_id else JobRun(self.job, event.run_id)
        place = attempt_in_task_id(event.task_id)
        launch = place is not None and place[1].startswith("launch")
        if event.kind == "start":
            self._task_started[event.task_id] = event.at
            if launch:
                self._training, self._checkpoint_shown = place[0], False
            return
        if launch:
            self._training = None
        self._poll_statuses()  # what the task recorded comes before the line that says it ended
        started = self._task_started.pop(event.task_id, None)
        if event.outcome == "skipped":
            return  # not needed (a later attempt group, most often): nothing ran
        outcome, detail = event.outcome, event.error
        if event.outcome == "done" and place is not None:
            outcome, detail = self._attempt_outcome(*place) or (outcome, detail)
        self._say(event.at, task_line(event.task_id, outcome, None if started is None else event.at - started, detail))

    def _attempt_outcome(self, attempt: int, step: str) -> tuple[str, str] | None:
        from sat_tasks.io.object_storage import read_json

        if step == "classify":
            verdict = read_json(self.hook, self._run.verdict_uri(attempt))
            return verdict_outcome(verdict) if verdict else None
        if step == "decide":
            ends = [r for r in self._job_records() if r.get("event") == "attempt_end" and r.get("attempt") == attempt]
            return decision_outcome(ends[-1]) if ends else None
        return None

    def _job_records(self) -> list[dict[str, Any]]:
        """SAT's own job series (`attempt_end` and `final` records) of this run (a bounded read)."""
        from sat_tasks.io.metrics import read_job_records

        return read_job_records(self.hook, self._run.results_uri)

    def _poll_statuses(self) -> None:
        from sat_tasks.io.object_storage import read_json

        self._status_polled = self.clock()
        entries = read_json(self.hook, self._run.status_uri) or []
        for entry in entries[self._statuses_seen:]:
            self._say(self._status_polled, status_line(entry))
        self._statuses_seen = max(self._statuses_seen, len(entries))

    def _poll_training(self) -> None:
        attempt = self._training
        progress = read_training(self._run.output_dir, self._run.metrics_dir, attempt)
        if progress is None or progress.step is None or attempt != self._training:
            return
        milestone = progress.last_committed_step != self._checkpoint_shown  # the first step, a new checkpoint
        self._checkpoint_shown = progress.last_committed_step
        self.console.progress(f"{elapsed(self.clock() - self.started)} {training_line(progress)}", milestone)


class TaskListener:
    """The Airflow listener (`on_task_instance_*`) that tells a `RunWatcher` when tasks start and end."""

    def __init__(self, watcher: RunWatcher) -> None:
        self.watcher = watcher

    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        self.watcher.task_started(task_instance.task_id, task_instance.run_id)

    @hookimpl
    def on_task_instance_success(self, previous_state: Any, task_instance: Any) -> None:
        self.watcher.task_ended(task_instance.task_id, task_instance.run_id, "done")

    @hookimpl
    def on_task_instance_skipped(self, previous_state: Any, task_instance: Any) -> None:
        self.watcher.task_ended(task_instance.task_id, task_instance.run_id, "skipped")

    @hookimpl
    def on_task_instance_failed(self, previous_state: Any, task_instance: Any, error: Any) -> None:
        retry = str(getattr(task_instance, "state", "") or "").endswith("up_for_retry")
        message = str(error).splitlines()[0] if error else ""
        self.watcher.task_ended(task_instance.task_id, task_instance.run_id,
                                "failed, to be retried" if retry else "failed", message)
