"""Per-job metrics of a training process: JSON lines per series, mirrored to Object Storage, optional OTLP export.

Four series (``training``, ``checkpoint``, ``system``, ``job``), each a file of JSON lines
(one record per sample) under ``SAT_METRICS_DIR`` (``attempt-<k>/<node>/<series>.jsonl``),
copied every interval to ``SAT_METRICS_URL`` (SAT sets it to
``<results>/<job>/<run_id>/metrics/``) so they survive a failover. Every record carries
``time`` (Unix seconds), ``series``, ``job``, ``run``, ``attempt``, ``node`` and ``device``.
The names, paths and variables are ``ckpt_engine.contract``'s.

Call order: ``recorder()`` (one per process, from the environment; None when
``SAT_METRICS_DIR`` is unset) -> ``note_*`` from the training thread (an append to a list,
nothing else) -> the sampler thread samples, writes and uploads every
``SAT_METRICS_INTERVAL_SECONDS`` -> ``close()`` (also at exit) flushes the rest. With
``SAT_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` the same values go out as OTLP/HTTP
gauges (``sat.<series>.<field>``, units in ``otlp.OTLP_FIELDS``), resource attributes
``job``, ``run``, ``attempt``, ``node``, data point attribute ``device``.

Modules: ``recorder`` (the series one process writes), ``gpu`` (NVML), ``otlp`` (the
export), ``sidecar`` (the node's sampler, ``python -m ckpt_engine.metrics``).
"""

from __future__ import annotations

import os
import threading

from ckpt_engine.contract import METRICS_DIR_ENV, METRICS_SIDECAR_ENV, env_int
from ckpt_engine.metrics.gpu import GpuReader
from ckpt_engine.metrics.recorder import MetricsRecorder
from ckpt_engine.metrics.sidecar import run_sidecar

__all__ = ["GpuReader", "MetricsRecorder", "recorder", "run_sidecar"]

_recorder: MetricsRecorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> MetricsRecorder | None:
    """This process's recorder from the environment SAT sets (started), or None without ``SAT_METRICS_DIR``.

    Beside a sidecar (``SAT_METRICS_SIDECAR=1``) it writes only the training and checkpoint series.
    """
    global _recorder
    directory = os.environ.get(METRICS_DIR_ENV, "").strip()
    if not directory:
        return None
    with _recorder_lock:
        if _recorder is None:
            series = None
            if os.environ.get(METRICS_SIDECAR_ENV) == "1":
                rank0 = (env_int("RANK") or 0) == 0
                series = ("training", "checkpoint") if rank0 else ()
            _recorder = MetricsRecorder.from_env(directory, series).start()
        return _recorder
