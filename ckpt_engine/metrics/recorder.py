"""One process's metrics series: what the training thread notes, what the sampler thread writes and uploads.

``training`` (global rank 0): global step, loss, learning rate, epoch, steps/s, samples/s and
tokens/s over the interval; ``checkpoint`` (global rank 0): one ``save`` record per committed
checkpoint and a ``state`` record per interval; ``system`` (local rank 0): the node's CPU and
memory (psutil) and its GPUs (``gpu.GpuReader``); ``job`` (global rank 0): status, attempt,
failovers used, goodput so far. Files and names: ``ckpt_engine.contract`` (``series_path``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_engine.contract import (
    ATTEMPT_ENV,
    FAILOVERS_USED_ENV,
    HOST_DEVICE,
    JOB_NAME_ENV,
    METRICS_INTERVAL_ENV,
    METRICS_URL_ENV,
    NODE_ENV,
    OTLP_ENV,
    RUN_ID_ENV,
    SERIES,
    env_int,
    series_path,
)
from ckpt_engine.metrics.gpu import GpuReader
from ckpt_engine.metrics.otlp import OtlpExport

log = logging.getLogger("ckpt_engine")

DEFAULT_INTERVAL_S = 300.0


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


@dataclass
class _Training:
    losses: list[float] = field(default_factory=list)
    step: int | None = None
    learning_rate: float | None = None
    epoch: float | None = None
    tokens: float | None = None
    samples_per_step: float | None = None
    last: tuple[float, int, float | None] | None = None  # (time, step, tokens) at the previous sample
    first_step_at: float | None = None
    first: tuple[float, int, float | None] | None = None  # (time, step, tokens) at the first step seen


class MetricsRecorder:
    """Writes this process's series; the call order is in ``ckpt_engine.metrics``'s docstring.

    ``global_rank`` 0 writes training, checkpoint and job; ``local_rank`` 0 writes system;
    ``series`` overrides that choice (the sidecar: system and job; a training process beside
    a sidecar: training and checkpoint). ``gpu_reader`` and ``clock`` are for tests.
    """

    def __init__(self, directory: str | os.PathLike[str], *, interval_s: float = DEFAULT_INTERVAL_S,
                 url: str | None = None, job: str = "", run: str = "", attempt: int | None = None,
                 node: str = "", node_rank: int | None = None, global_rank: int = 0, local_rank: int = 0,
                 failovers_used: int | None = None, otlp_endpoint: str | None = None, gpu_reader: GpuReader | None = None,
                 say: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time,
                 series: tuple[str, ...] | None = None) -> None:
        self.directory = Path(directory)
        self.interval_s = max(float(interval_s), 0.05)
        self.url = url
        self.identity = {"job": job, "run": run, "attempt": attempt, "node": node}
        self.node_rank = node_rank
        self.global_rank, self.local_rank = global_rank, local_rank
        if series is None:
            series = (("training", "checkpoint", "job") if global_rank == 0 else ()) + (
                ("system",) if local_rank == 0 else ())
        unknown = set(series) - set(SERIES)
        if unknown:
            raise ValueError(f"unknown metrics series {sorted(unknown)}; known: {', '.join(SERIES)}")
        self.series = tuple(series)
        self.failovers_used = failovers_used
        self.say = say or (lambda message: log.warning("%s", message))
        self.clock = clock
        self.started_at = clock()
        self.status = "Running"
        self._pending: list[dict[str, Any]] = []  # records noted by the training thread, written by the sampler
        self._training = _Training()
        self._checkpoint: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flush = threading.Event()  # a record the training thread noted should be written now
        self._thread: threading.Thread | None = None
        self._remote: Any = None
        self._remote_failed = False
        self._closed = False
        self._gpu = gpu_reader
        self._psutil: Any = None
        self.otlp: OtlpExport | None = None
        if otlp_endpoint and self.writes_any:
            try:
                self.otlp = OtlpExport(otlp_endpoint, self.interval_s, {
                    k: str(v) for k, v in self.identity.items() if v not in (None, "")} | {"run": run})
            except Exception as exc:  # noqa: BLE001 - no SDK in the image: the JSON lines still go on
                self.say(f"[sat metrics] OTLP export off: {type(exc).__name__}: {exc}")

    @classmethod
    def from_env(cls, directory: str | os.PathLike[str], series: tuple[str, ...] | None = None) -> MetricsRecorder:
        """A recorder (not started) for this process, from the environment SAT sets (``ckpt_engine.contract``)."""
        return cls(
            directory,
            interval_s=_env_float(METRICS_INTERVAL_ENV) or DEFAULT_INTERVAL_S,
            url=os.environ.get(METRICS_URL_ENV) or None,
            job=os.environ.get(JOB_NAME_ENV, ""),
            run=os.environ.get(RUN_ID_ENV, ""),
            attempt=env_int(ATTEMPT_ENV),
            node=os.environ.get(NODE_ENV, "") or os.environ.get("HOSTNAME", ""),
            node_rank=env_int("NODE_RANK") or env_int("GROUP_RANK"),
            global_rank=env_int("RANK") or 0,
            local_rank=env_int("LOCAL_RANK") or 0,
            failovers_used=env_int(FAILOVERS_USED_ENV),
            otlp_endpoint=os.environ.get(OTLP_ENV) or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
            series=series,
        )

    @property
    def writes_any(self) -> bool:
        return bool(self.series)

    # ---- what the training thread calls: appends only ----------------------------------------
    def note_log(self, logs: dict[str, Any], step: int, samples_per_step: float | None = None,
                 tokens_seen: float | None = None) -> None:
        """A Trainer log entry (``on_log``): loss, learning rate, epoch."""
        t = self._training
        if isinstance(logs.get("loss"), (int, float)):
            t.losses.append(float(logs["loss"]))
        if isinstance(logs.get("learning_rate"), (int, float)):
            t.learning_rate = float(logs["learning_rate"])
        if isinstance(logs.get("epoch"), (int, float)):
            t.epoch = float(logs["epoch"])
        self.note_step(step, samples_per_step, tokens_seen)

    def note_step(self, step: int, samples_per_step: float | None = None, tokens_seen: float | None = None) -> None:
        """The Trainer's global step (``on_step_end``), with the batch size and the token count when known."""
        t = self._training
        t.step = step
        if t.first_step_at is None:
            t.first_step_at = self.clock()
        if samples_per_step:
            t.samples_per_step = samples_per_step
        if tokens_seen:
            t.tokens = float(tokens_seen)
        if t.first is None:
            t.first = (self.clock(), step, t.tokens)

    def note_save(self, step: int, timings: dict[str, float]) -> None:
        """A committed checkpoint (the engine's ``on_commit``): its timings and size."""
        record = {"event": "save", "step": step, **{k: float(v) for k, v in timings.items()}}
        self._checkpoint["last_committed_step"] = step
        self._pending.append(self._stamp("checkpoint", record))

    def note_first_step(self, step: int, status: str = "Running") -> None:
        """The attempt's first training step as seen from outside the trainer (the sidecar, from progress.json).

        From here the job records say ``status`` (set with the record, so no sample falls between).
        """
        with self._lock:  # not the training thread: it may wait for a sample in progress
            if self._training.first_step_at is not None:
                return
            self.status = status
            self._training.first_step_at = self.clock()
            self._pending.append(self._stamp("job", {"event": "first_step", "step": step,
                                                     "attempt": self.identity["attempt"]}))

    def note_restore(self, *, step: int | None, started_at: float, restored_at: float | None,
                     first_step: int, first_step_at: float) -> None:
        """How this attempt's training started (the training thread, at its first step; once per process).

        One ``checkpoint`` record ``restore``: ``started_at`` (the script handed over to the
        trainer: its imports, model and data are ready), ``restored_at`` (the checkpoint
        ``step`` is loaded, None when unknown; ``step`` None: a fresh start) and
        ``first_step_at`` (its first optimizer step ``first_step`` is done). The job report
        splits each fault's recovery with them. Written at once (the sampler is woken), not
        an interval later: the attempt may be killed before its next sample.
        """
        if "checkpoint" not in self.series:
            return
        self._pending.append(self._stamp("checkpoint", {
            "event": "restore", "step": step, "started_at": round(started_at, 3),
            "restored_at": round(restored_at, 3) if restored_at is not None else None,
            "first_step": first_step, "first_step_at": round(first_step_at, 3)}))
        self._flush.set()

    def note_checkpoint_state(self, **state: Any) -> None:
        """Newest committed / mirrored step (the engine's progress)."""
        self._checkpoint.update({k: v for k, v in state.items() if v is not None})

    # ---- the sampler ----------------------------------------------------------------------------
    def start(self, *, idle: bool = False) -> MetricsRecorder:
        """Start the sampler thread (daemon) and flush at exit.

        ``idle``: the thread runs under ``SCHED_IDLE`` instead of nice 19 (the node's sidecar,
        whose periodic samples may wait; its first, ``first_step`` and last samples are taken
        by its main thread, which stays at nice 19).
        """
        if self._thread is None and self.writes_any:
            self._thread = threading.Thread(target=self._run, args=(idle,), name="sat-metrics", daemon=True)
            self._thread.start()
            atexit.register(self.close)
        return self

    def _run(self, idle: bool = False) -> None:
        yield_cpu(threading.get_native_id(), idle=idle)
        due = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            flush = self._flush.wait(max(0.0, due - time.monotonic()))
            if self._stop.is_set():
                break
            try:
                if flush:  # between samples: write and upload what was noted, keep the sampling interval
                    self._flush.clear()
                    self.write_pending()
                    continue
                self.sample()
            except Exception as exc:  # noqa: BLE001 - metrics never stop training
                self.say(f"[sat metrics] sample failed: {type(exc).__name__}: {exc}")
            due = time.monotonic() + self.interval_s

    def write_pending(self) -> None:
        """Write and upload the records noted since the last sample (no new sample)."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._write(pending)
        if pending:
            self._upload()

    def sample(self, status: str | None = None) -> None:
        """Take one sample of every series this process writes, append them, upload the files.

        ``status`` is the job record's (default: ``self.status``, which the sidecar moves from
        ``Starting`` to ``Running`` at the attempt's first step).
        """
        status = status or self.status
        records = []
        with self._lock:
            if "training" in self.series:
                records += self._training_sample()
            if "checkpoint" in self.series:
                records += self._checkpoint_sample()
            if "job" in self.series:
                records.append(self._job_sample(status))
            if "system" in self.series:
                records += self._system_sample()
            pending, self._pending = self._pending, []
            self._write(pending + records)
        self._upload()

    def _stamp(self, series: str, values: dict[str, Any], device: str = HOST_DEVICE) -> dict[str, Any]:
        return {"time": round(self.clock(), 3), "series": series, **self.identity, "device": device,
                **{k: v for k, v in values.items() if v is not None}}

    def _training_sample(self) -> list[dict[str, Any]]:
        t = self._training
        if t.step is None:
            return []
        now = self.clock()
        values: dict[str, Any] = {"global_step": t.step, "learning_rate": t.learning_rate, "epoch": t.epoch}
        losses, t.losses = t.losses, []
        if losses:
            values["loss"] = sum(losses) / len(losses)
        # Over the interval since the last sample; the first sample of an attempt measures from its
        # first step (with a long interval, e.g. the default 300 s, it may be the only one). A
        # sample that follows another with no step between within part of an interval (the
        # Trainer's end, then exit) says nothing about throughput: no rate rather than a false 0.
        since = t.last if t.last is not None else t.first
        if since is not None and now > since[0]:
            elapsed = now - since[0]
            steps = t.step - since[1]
            if steps > 0 or elapsed >= self.interval_s / 2:
                values["steps_per_second"] = steps / elapsed
                if t.samples_per_step:
                    values["samples_per_second"] = steps * t.samples_per_step / elapsed
                if t.tokens is not None and since[2] is not None:
                    values["tokens_per_second"] = (t.tokens - since[2]) / elapsed
        t.last = (now, t.step, t.tokens)
        return [self._stamp("training", values)]

    def _checkpoint_sample(self) -> list[dict[str, Any]]:
        if not self._checkpoint:
            return []
        state = dict(self._checkpoint)
        committed, mirrored = state.get("last_committed_step"), state.get("last_mirrored_step")
        if committed is not None and mirrored is not None:
            state["mirror_lag_steps"] = max(0, committed - mirrored)
        return [self._stamp("checkpoint", {"event": "state", **state})]

    def _job_sample(self, status: str) -> dict[str, Any]:
        now = self.clock()
        first = self._training.first_step_at
        wall = now - self.started_at
        goodput = (now - first) / wall if first is not None and wall > 0 else 0.0
        return self._stamp("job", {"status": status, "running": 1, "attempt": self.identity["attempt"],
                                   "failovers_used": self.failovers_used, "goodput": round(goodput, 4)})

    def _system_sample(self) -> list[dict[str, Any]]:
        records = []
        cpu = None
        if self._psutil is None:
            try:
                import psutil

                self._psutil = psutil
                # No earlier reading to compare with: the first one is measured over 0.1 s (the
                # sampler thread or the sidecar waits, never the training thread).
                cpu = psutil.cpu_percent(interval=0.1)
            except ImportError as exc:
                self._psutil = False
                self.say(f"[sat metrics] no CPU and memory series: {exc}")
        if self._psutil:
            memory = self._psutil.virtual_memory()
            records.append(self._stamp("system", {
                "cpu_percent": cpu if cpu is not None else self._psutil.cpu_percent(interval=None),
                "memory_used_bytes": float(memory.total - memory.available),
                "memory_total_bytes": float(memory.total)}))
        if self._gpu is None:
            self._gpu = GpuReader(self.say)
        for device, values in self._gpu.read():
            if values:
                records.append(self._stamp("system", values, device=device))
        return records

    # ---- files ------------------------------------------------------------------------------------
    def _write(self, records: list[dict[str, Any]]) -> None:
        by_file: dict[str, list[str]] = {}
        for record in records:
            name = series_path(self.identity["attempt"], self.identity["node"] or "node", record["series"],
                               self.node_rank)
            by_file.setdefault(name, []).append(json.dumps(record, separators=(",", ":")))
            if self.otlp is not None:
                self.otlp.record(record)
        for name, lines in by_file.items():
            path = self.directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")

    def files(self) -> list[str]:
        """Relative paths of the series files this process writes (those that exist)."""
        names = [series_path(self.identity["attempt"], self.identity["node"] or "node", s, self.node_rank)
                 for s in SERIES]
        return [n for n in names if (self.directory / n).exists()]

    def _upload(self) -> None:
        """Copy this process's files to ``url`` (whole files: they are small), best effort."""
        if not self.url or self._remote_failed:
            return
        try:
            if self._remote is None:
                from ckpt_engine.storage.base import open_storage

                self._remote = open_storage(self.url)
            for name in self.files():
                self._remote.write_atomic(name, (self.directory / name).read_bytes(), durable=False)
        except Exception as exc:  # noqa: BLE001 - Object Storage away for a moment: the next interval retries
            self.say(f"[sat metrics] could not copy the series to {self.url}: {type(exc).__name__}: {exc}")

    def close(self, status: str | None = None) -> None:
        """Stop the sampler, take a last sample (the rest of the interval), upload, end the OTLP export."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._flush.set()  # wakes the sampler
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.writes_any:
            try:
                self.sample(status)
            except Exception as exc:  # noqa: BLE001
                self.say(f"[sat metrics] last sample failed: {type(exc).__name__}: {exc}")
        if self.otlp is not None:
            self.otlp.close()


def yield_cpu(tid: int = 0, *, idle: bool = False) -> str:
    """Lower a thread's CPU priority (``tid`` 0: the calling one); returns what was set.

    ``idle``: ``SCHED_IDLE`` (Linux; runs only on a CPU nothing else wants, and never preempts
    a normal thread on wake-up), else, or where that is refused, nice 19. Lowering is always
    allowed to an unprivileged process; nothing here raises.
    """
    if idle:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            pass
    try:  # Linux: a thread is a task with its own nice value
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        return "nice 19"
    except (AttributeError, OSError):  # pragma: no cover - not allowed
        return "unchanged"
