"""Per-job metrics of a training process: JSON lines per series, mirrored to Object Storage, optional OTLP export.

Four series, each a file of JSON lines (one record per sample) under ``SAT_METRICS_DIR``
(``attempt-<k>/<node>/<series>.jsonl``), copied every interval to ``SAT_METRICS_URL``
(SAT sets it to ``<results>/<job>/<run_id>/metrics/``) so they survive a failover:

- ``training`` (global rank 0): global step, loss, learning rate, epoch, steps/s,
  samples/s and tokens/s over the interval (tokens only where the Trainer counts them);
- ``checkpoint`` (global rank 0): one ``save`` record per committed checkpoint (blocking,
  stage, persist seconds, bytes) and a ``state`` record per interval (last committed and
  mirrored step, mirror lag);
- ``system`` (local rank 0, one per node): CPU % and memory of the node (device
  ``host``), and per GPU (device ``gpu<i>``) utilization, memory, temperature, power and
  ECC counts through NVML; without NVML or a GPU there are no GPU records at all;
- ``job`` (global rank 0): status, attempt, failovers used, goodput so far.

Every record carries ``time`` (Unix seconds), ``series``, ``job``, ``run``, ``attempt``,
``node`` and ``device``. Call order: ``recorder()`` (one per process, from the
environment; None when ``SAT_METRICS_DIR`` is unset) -> ``note_*`` from the training
thread (an append to a list, nothing else) -> the sampler thread samples, writes and
uploads every ``SAT_METRICS_INTERVAL_SECONDS`` -> ``close()`` (also at exit) flushes the
rest. With ``SAT_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` the same values go
out as OTLP/HTTP gauges (``sat.<series>.<field>``, units in ``OTLP_FIELDS``), resource
attributes ``job``, ``run``, ``attempt``, ``node``, data point attribute ``device``.
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

log = logging.getLogger("ckpt_engine")

DIR_ENV = "SAT_METRICS_DIR"
URL_ENV = "SAT_METRICS_URL"
INTERVAL_ENV = "SAT_METRICS_INTERVAL_SECONDS"
OTLP_ENV = "SAT_OTLP_ENDPOINT"
# Set by the launcher when the node's sidecar sampler (`python -m ckpt_engine.metrics`) runs
# beside the command: the sidecar writes the system and job series, the training process
# only training and checkpoint.
SIDECAR_ENV = "SAT_METRICS_SIDECAR"
# The engine's progress.json, which the sidecar watches for the attempt's first training step.
PROGRESS_ENV = "SAT_PROGRESS_FILE"
DEFAULT_INTERVAL_S = 300.0
SERIES = ("training", "checkpoint", "system", "job")
HOST_DEVICE = "host"

# field -> (OTLP unit, description); the OTLP name is sat.<series>.<field>.
OTLP_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "training": {
        "global_step": ("{step}", "the Trainer's global step"),
        "loss": ("1", "mean training loss logged in the interval"),
        "learning_rate": ("1", "learning rate"),
        "epoch": ("1", "epoch (fractional)"),
        "steps_per_second": ("{step}/s", "optimizer steps per second over the interval"),
        "samples_per_second": ("{sample}/s", "samples per second over the interval"),
        "tokens_per_second": ("{token}/s", "input tokens per second over the interval"),
    },
    "checkpoint": {
        "blocking_s": ("s", "seconds the training loop waited for a save"),
        "stage_s": ("s", "seconds to stage a save into host memory"),
        "persist_s": ("s", "seconds from save to all files written"),
        "bytes": ("By", "bytes of the committed checkpoint"),
        "last_committed_step": ("{step}", "newest committed checkpoint"),
        "last_mirrored_step": ("{step}", "newest checkpoint in Object Storage"),
        "mirror_lag_steps": ("{step}", "steps between the newest committed and the newest mirrored checkpoint"),
    },
    "system": {
        "cpu_percent": ("%", "CPU utilization of the node"),
        "memory_used_bytes": ("By", "memory used on the node or GPU"),
        "memory_total_bytes": ("By", "memory of the node or GPU"),
        "gpu_utilization_percent": ("%", "GPU utilization"),
        "temperature_c": ("Cel", "GPU temperature"),
        "power_w": ("W", "GPU power draw"),
        "ecc_corrected": ("{error}", "corrected ECC errors (volatile)"),
        "ecc_uncorrected": ("{error}", "uncorrected ECC errors (volatile)"),
    },
    "job": {
        "attempt": ("{attempt}", "attempt number"),
        "failovers_used": ("{failover}", "hardware failovers used before this attempt"),
        "goodput": ("1", "training time / wall time of the job so far"),
        "running": ("1", "1 while the job is in the status given by the status attribute"),
    },
}


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.lstrip("-").isdigit() else None


def _env_float(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


def series_path(attempt: int | None, node: str, series: str, node_rank: int | None = None) -> str:
    """Relative path of one series file: ``attempt-<k>/<node>[-r<node rank>]/<series>.jsonl``."""
    where = node + (f"-r{node_rank}" if node_rank else "")
    return f"attempt-{attempt if attempt is not None else 0}/{where}/{series}.jsonl"


# ---- the GPU reader (NVML) -----------------------------------------------------------------------
class GpuReader:
    """Per-device readings through NVML (``nvidia-ml-py``); ``devices() == 0`` without a GPU or NVML.

    Anything NVML cannot read is said once in the log (``say``) and left out; a field that
    fails on one device does not stop the others.
    """

    def __init__(self, say: Callable[[str], None], nvml: Any = None) -> None:
        self.say = say
        self._said: set[str] = set()
        self._nvml = nvml
        self._handles: list[Any] = []
        try:
            if self._nvml is None:
                import pynvml as nvml_module

                self._nvml = nvml_module
            self._nvml.nvmlInit()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no device: no GPU series
            self._handles = []
            self._once("init", f"[sat metrics] no GPU series: NVML cannot be read ({type(exc).__name__}: {exc})")

    def _once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(message)

    def devices(self) -> int:
        return len(self._handles)

    @staticmethod
    def _reads(nvml: Any, handle: Any) -> list[tuple[str, Callable[[], dict[str, float]]]]:
        def memory() -> dict[str, float]:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return {"memory_used_bytes": float(info.used), "memory_total_bytes": float(info.total)}

        return [
            ("utilization", lambda: {"gpu_utilization_percent": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)}),
            ("memory", memory),
            ("temperature", lambda: {"temperature_c": float(nvml.nvmlDeviceGetTemperature(handle, 0))}),
            ("power", lambda: {"power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}),
            ("ecc", lambda: {"ecc_corrected": float(nvml.nvmlDeviceGetTotalEccErrors(handle, 0, 1)),
                             "ecc_uncorrected": float(nvml.nvmlDeviceGetTotalEccErrors(handle, 1, 1))}),
        ]

    def read(self) -> list[tuple[str, dict[str, float]]]:
        """``[(device, values)]`` for every GPU; values NVML could not read are absent."""
        out = []
        nvml = self._nvml
        for index, handle in enumerate(self._handles):
            values: dict[str, float] = {}
            for name, read in self._reads(nvml, handle):
                try:
                    values.update(read())
                except Exception as exc:  # noqa: BLE001 - e.g. ECC or power not supported on this board
                    self._once(f"{index}:{name}", f"[sat metrics] gpu{index}: {name} not readable through NVML "
                                                  f"({type(exc).__name__}: {exc}); left out")
            out.append((f"gpu{index}", values))
        return out


# ---- OTLP ----------------------------------------------------------------------------------------
class OtlpExport:
    """The series as OTLP/HTTP gauges, exported by the OpenTelemetry SDK every interval."""

    def __init__(self, endpoint: str, interval_s: float, resource: dict[str, str]) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        url = endpoint.rstrip("/")
        if not url.endswith("/v1/metrics"):
            url += "/v1/metrics"
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=url),
                                               export_interval_millis=max(interval_s, 0.1) * 1000)
        self.provider = MeterProvider(resource=Resource.create({"service.name": "sat-training", **resource}),
                                      metric_readers=[reader])
        meter = self.provider.get_meter("sat")
        self.gauges = {
            (series, name): meter.create_gauge(f"sat.{series}.{name}", unit=unit, description=text)
            for series, fields in OTLP_FIELDS.items() for name, (unit, text) in fields.items()
        }

    def record(self, record: dict[str, Any]) -> None:
        series = record["series"]
        attributes = {"device": record.get("device") or HOST_DEVICE}
        if series == "job" and record.get("status"):
            attributes["status"] = str(record["status"])
        for name, value in record.items():
            gauge = self.gauges.get((series, name))
            if gauge is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                gauge.set(value, attributes)

    def close(self) -> None:
        try:
            self.provider.shutdown()  # a last export of what was set
        except Exception as exc:  # noqa: BLE001 - the collector is gone: the JSON lines still have it
            log.warning("[sat metrics] OTLP shutdown failed: %r", exc)


# ---- the recorder --------------------------------------------------------------------------------
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
    """Writes this process's series; see the module docstring for the call order.

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
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - metrics never stop training
                self.say(f"[sat metrics] sample failed: {type(exc).__name__}: {exc}")

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
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self.writes_any:
            try:
                self.sample(status)
            except Exception as exc:  # noqa: BLE001
                self.say(f"[sat metrics] last sample failed: {type(exc).__name__}: {exc}")
        if self.otlp is not None:
            self.otlp.close()


_recorder: MetricsRecorder | None = None
_recorder_lock = threading.Lock()


def _from_env(directory: str, series: tuple[str, ...] | None) -> MetricsRecorder:
    return MetricsRecorder(
        directory,
        interval_s=_env_float(INTERVAL_ENV) or DEFAULT_INTERVAL_S,
        url=os.environ.get(URL_ENV) or None,
        job=os.environ.get("SAT_JOB_NAME", ""),
        run=os.environ.get("SAT_RUN_ID", ""),
        attempt=_env_int("SAT_ATTEMPT"),
        node=os.environ.get("SAT_NODE", "") or os.environ.get("HOSTNAME", ""),
        node_rank=_env_int("NODE_RANK") or _env_int("GROUP_RANK"),
        global_rank=_env_int("RANK") or 0,
        local_rank=_env_int("LOCAL_RANK") or 0,
        failovers_used=_env_int("SAT_FAILOVERS_USED"),
        otlp_endpoint=os.environ.get(OTLP_ENV) or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        series=series,
    )


def recorder() -> MetricsRecorder | None:
    """This process's recorder from the environment SAT sets (started), or None without ``SAT_METRICS_DIR``.

    Beside a sidecar (``SAT_METRICS_SIDECAR=1``) it writes only the training and checkpoint series.
    """
    global _recorder
    directory = os.environ.get(DIR_ENV, "").strip()
    if not directory:
        return None
    with _recorder_lock:
        if _recorder is None:
            series = None
            if os.environ.get(SIDECAR_ENV) == "1":
                rank0 = (_env_int("RANK") or 0) == 0
                series = ("training", "checkpoint") if rank0 else ()
            _recorder = _from_env(directory, series).start()
        return _recorder


# ---- the node's sidecar sampler ---------------------------------------------------------------------
PARENT_CHECK_S = 5.0  # after the first step the sidecar's main thread wakes only to see whether its launcher lives


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


def _first_step(progress_file: str, attempt: int | None) -> int | None:
    """The step in progress.json when the engine stamped it with ``attempt`` (None before the first step)."""
    try:
        with open(progress_file, encoding="utf-8") as handle:
            progress = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(progress, dict) or not isinstance(progress.get("step"), int):
        return None
    if attempt is not None and progress.get("attempt") not in (None, attempt):
        return None
    return progress["step"]


def run_sidecar(stop: threading.Event, *, poll_s: float = 1.0, parent_pid: int | None = None,
                rec: MetricsRecorder | None = None) -> MetricsRecorder:
    """The node's system and job series for one attempt, whatever the command is, until ``stop`` or the parent ends.

    The launcher (the local runner; the pod's PID 1 supervisor) starts it beside the command,
    so every attempt has them, also one whose script does not use SAT's engine and one that
    dies before its first interval: a sample at once (status ``Starting``), a ``first_step``
    job record (uploaded at once) when progress.json shows the attempt's first training step,
    a sample every interval, and a last one (status ``Ended``) when stopped (SIGTERM).
    """
    if rec is None:
        rec = _from_env(os.environ.get(DIR_ENV, "").strip() or ".", ("system", "job"))
    progress_file = os.environ.get(PROGRESS_ENV, "").strip()
    attempt = rec.identity["attempt"]
    yield_cpu()  # the main thread (and the threads it starts) at nice 19: yields the CPU to training
    rec.status = "Starting"
    rec.sample()
    # The periodic samples come from a SCHED_IDLE thread: it never preempts a training thread
    # when it wakes, which nice 19 alone does (ADR 0017: +2-3% step time at a 1 s interval on
    # two busy cores). This thread keeps the prompt ones: the first_step record and the last sample.
    rec.start(idle=True)
    seen_step = not progress_file
    while not stop.wait(min(poll_s, rec.interval_s) if not seen_step else max(poll_s, PARENT_CHECK_S)):
        if parent_pid is not None and os.getppid() != parent_pid:
            break  # the launcher is gone (the pod's supervisor, the local runner): the attempt ended
        if seen_step:
            continue
        try:
            step = _first_step(progress_file, attempt)
            if step is not None:
                seen_step = True
                rec.note_first_step(step)
                rec.sample()
        except Exception as exc:  # noqa: BLE001 - metrics never stop an attempt
            rec.say(f"[sat metrics] sample failed: {type(exc).__name__}: {exc}")
    rec.close("Ended")
    return rec


def main(argv: list[str] | None = None) -> int:
    """``python -m ckpt_engine.metrics``: the sidecar (``--check``: only whether it can run here)."""
    import signal
    import sys

    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        return 0 if os.environ.get(DIR_ENV, "").strip() else 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_sidecar(stop, parent_pid=os.getppid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
