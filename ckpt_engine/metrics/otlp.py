"""The series as OTLP/HTTP gauges (``sat.<series>.<field>``), exported by the OpenTelemetry SDK."""

from __future__ import annotations

import logging
from typing import Any

from ckpt_engine.contract import HOST_DEVICE

log = logging.getLogger("ckpt_engine")

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
