"""ckpt_engine.metrics: the series as JSON lines, a GPU reader that cannot read NVML, OTLP/HTTP to a real receiver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from ckpt_engine.metrics import GpuReader, MetricsRecorder


class BrokenNvml:
    """NVML as a machine without the driver answers it."""

    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError("NVML Shared Library Not Found")


class OneGpuWithoutEcc:
    """One device whose ECC counters are not supported (as on many consumer boards)."""

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle-{index}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return type("U", (), {"gpu": 87})()

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("M", (), {"used": 3 * 2**30, "total": 80 * 2**30})()

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_500  # milliwatts

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        raise RuntimeError("Not Supported")


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sampler_without_nvml_says_why_once_and_goes_on(tmp_path):
    said = []
    recorder = MetricsRecorder(tmp_path, interval_s=0.05, job="j", run="r", attempt=2, node="n0",
                               gpu_reader=GpuReader(said.append, nvml=BrokenNvml()), say=said.append).start()
    recorder.note_log({"loss": 2.0, "learning_rate": 1e-4, "epoch": 0.5}, step=10, samples_per_step=8)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(lines(tmp_path / "attempt-2/n0/system.jsonl")
                                               if (tmp_path / "attempt-2/n0/system.jsonl").exists() else []) < 3:
        time.sleep(0.05)
    recorder.note_step(20)
    recorder.close()
    nvml_lines = [m for m in said if "NVML" in m]
    assert len(nvml_lines) == 1 and "NVML Shared Library Not Found" in nvml_lines[0]
    system = lines(tmp_path / "attempt-2/n0/system.jsonl")
    assert len(system) >= 3 and {r["device"] for r in system} == {"host"}  # absent, not zeros
    assert all(0 <= r["cpu_percent"] <= 100 and r["memory_used_bytes"] > 0 for r in system)
    training = lines(tmp_path / "attempt-2/n0/training.jsonl")
    assert training[0]["loss"] == 2.0 and training[0]["global_step"] == 10
    assert training[-1]["global_step"] == 20 and training[-1]["attempt"] == 2 and training[-1]["node"] == "n0"
    assert {r["job"] for r in training} == {"j"} and {r["run"] for r in training} == {"r"}


def test_gpu_fields_nvml_cannot_read_are_left_out_and_said_once(tmp_path):
    said = []
    reader = GpuReader(said.append, nvml=OneGpuWithoutEcc())
    first, second = reader.read(), reader.read()
    device, values = first[0]
    assert device == "gpu0" and second == first
    assert values == {"gpu_utilization_percent": 87.0, "memory_used_bytes": 3.0 * 2**30,
                      "memory_total_bytes": 80.0 * 2**30, "temperature_c": 61.0, "power_w": 312.5}
    assert len(said) == 1 and "gpu0: ecc not readable" in said[0]


@pytest.fixture
def otlp_receiver():
    """A real OTLP/HTTP receiver on loopback: keeps each decoded ExportMetricsServiceRequest."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    )

    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
            received.append((self.path, self.headers["Content-Type"], request))
            payload = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()


def test_series_are_exported_as_otlp_with_names_units_and_attributes(tmp_path, otlp_receiver):
    endpoint, received = otlp_receiver
    recorder = MetricsRecorder(tmp_path, interval_s=60, job="tiny", run="manual__1", attempt=3, node="node-7",
                               otlp_endpoint=endpoint, gpu_reader=GpuReader(lambda m: None, nvml=OneGpuWithoutEcc()),
                               failovers_used=1, say=lambda m: None)
    recorder.note_log({"loss": 1.25, "learning_rate": 0.0005, "epoch": 1.0}, step=42, samples_per_step=16)
    recorder.note_save(40, {"blocking_s": 0.004, "persist_s": 0.75, "bytes": 1234.0})
    recorder.close()  # the last sample, then the SDK's final export
    assert received, "nothing reached the receiver"
    path, content_type, _ = received[-1]
    assert path == "/v1/metrics" and content_type == "application/x-protobuf"
    points = {}
    for _, _, request in received:
        for resource_metrics in request.resource_metrics:
            resource = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
            assert {k: resource[k] for k in ("job", "run", "attempt", "node")} == {
                "job": "tiny", "run": "manual__1", "attempt": "3", "node": "node-7"}
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.gauge.data_points:
                        attributes = {a.key: a.value.string_value for a in point.attributes}
                        value = point.as_double if point.HasField("as_double") else point.as_int
                        points[(metric.name, attributes["device"])] = (metric.unit, value)
    assert points[("sat.training.loss", "host")] == ("1", 1.25)
    assert points[("sat.training.global_step", "host")] == ("{step}", 42)
    assert points[("sat.training.learning_rate", "host")] == ("1", 0.0005)
    assert points[("sat.checkpoint.persist_s", "host")] == ("s", 0.75)
    assert points[("sat.checkpoint.bytes", "host")] == ("By", 1234.0)
    assert points[("sat.system.gpu_utilization_percent", "gpu0")] == ("%", 87.0)
    assert points[("sat.system.power_w", "gpu0")] == ("W", 312.5)
    assert points[("sat.system.temperature_c", "gpu0")] == ("Cel", 61.0)
    assert points[("sat.job.failovers_used", "host")] == ("{failover}", 1)
    assert ("sat.system.ecc_corrected", "gpu0") not in points  # not readable: not exported as 0


def test_beside_a_sidecar_the_training_process_writes_only_training_and_checkpoint(tmp_path, monkeypatch):
    from ckpt_engine import metrics

    for name, value in {"SAT_METRICS_DIR": str(tmp_path), "SAT_METRICS_INTERVAL_SECONDS": "300", "SAT_ATTEMPT": "2",
                        "SAT_NODE": "n1", "SAT_METRICS_SIDECAR": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(metrics, "_recorder", None)
    rec = metrics.recorder()
    try:
        assert rec.series == ("training", "checkpoint")
        rec.note_step(5)
        rec.note_save(5, {"blocking_s": 0.01})
    finally:
        rec.close()
    written = sorted(p.name for p in (tmp_path / "attempt-2" / "n1").iterdir())
    assert written == ["checkpoint.jsonl", "training.jsonl"]
    monkeypatch.delenv("SAT_METRICS_SIDECAR")
    monkeypatch.setattr(metrics, "_recorder", None)
    assert metrics.recorder().series == ("training", "checkpoint", "job", "system")  # no sidecar: all four
    metrics.recorder().close()
    with pytest.raises(ValueError, match="unknown metrics series"):
        MetricsRecorder(tmp_path, series=("gpu",))


def wait_for(predicate, what, deadline_s=120.0):
    deadline = time.monotonic() + deadline_s
    while not predicate():
        assert time.monotonic() < deadline, f"waited {deadline_s:.0f} s for {what}"
        time.sleep(0.05)


def test_the_sidecars_periodic_samples_run_at_sched_idle_and_its_prompt_ones_at_nice_19(tmp_path, monkeypatch):
    """ADR 0017: the node's sidecar never preempts training for a periodic sample (SCHED_IDLE
    thread); its Starting sample, the first_step record and the last sample come from its
    main thread (nice 19), so they are not left waiting behind a busy CPU."""
    from ckpt_engine.metrics import run_sidecar

    progress = tmp_path / "progress.json"
    monkeypatch.setenv("SAT_PROGRESS_FILE", str(progress))
    rec = MetricsRecorder(tmp_path, interval_s=0.2, attempt=3, node="n0", series=("system", "job"),
                          gpu_reader=GpuReader(lambda m: None, nvml=BrokenNvml()), say=lambda m: None)
    stop = threading.Event()
    main = threading.Thread(target=run_sidecar, args=(stop,), kwargs={"poll_s": 0.05, "rec": rec}, daemon=True)
    main.start()
    job = tmp_path / "attempt-3" / "n0" / "job.jsonl"
    try:
        wait_for(lambda: rec._thread is not None and job.exists() and len(lines(job)) >= 2,
                 "the Starting sample and a periodic one")
        assert os.sched_getscheduler(rec._thread.native_id) == os.SCHED_IDLE
        assert os.sched_getscheduler(main.native_id) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, main.native_id) == 19
        assert {r.get("status") for r in lines(job)} == {"Starting"}  # no step yet
        progress.write_text(json.dumps({"step": 7, "attempt": 3}))
        wait_for(lambda: any(r.get("event") == "first_step" for r in lines(job)), "the first_step record")
    finally:
        stop.set()
        main.join(timeout=60)
    assert not main.is_alive() and not rec._thread.is_alive()
    records = lines(job)
    first = next(i for i, r in enumerate(records) if r.get("event") == "first_step")
    assert records[first]["step"] == 7
    assert records[first + 1]["status"] == "Running"  # the status moves with the record, no sample between
    assert records[-1]["status"] == "Ended"
    assert all(r["status"] == "Starting" for r in records[:first])
    system = lines(tmp_path / "attempt-3" / "n0" / "system.jsonl")
    assert len(system) >= 3 and all("cpu_percent" in r for r in system)


def test_throughput_is_measured_from_the_first_step_and_a_sliver_after_a_sample_gives_no_false_zero(tmp_path):
    now = [1000.0]
    rec = MetricsRecorder(tmp_path, interval_s=300, attempt=1, node="n0", series=("training",), clock=lambda: now[0],
                          say=lambda m: None)
    rec.note_step(1, samples_per_step=8)
    now[0] += 100
    rec.note_step(51, samples_per_step=8)
    rec.sample()  # the attempt's only interval sample with a 300 s interval: rates since its first step
    now[0] += 1
    rec.sample()  # the Trainer's end, then the exit: nothing happened in between
    now[0] += 200
    rec.sample()  # a whole stalled stretch: 0 steps/s is the truth, and it is said
    first, sliver, stalled = lines(tmp_path / "attempt-1" / "n0" / "training.jsonl")
    assert first["steps_per_second"] == pytest.approx(0.5) and first["samples_per_second"] == pytest.approx(4.0)
    assert "steps_per_second" not in sliver and sliver["global_step"] == 51
    assert stalled["steps_per_second"] == 0.0


def test_the_restore_record_is_written_at_once_not_an_interval_later(tmp_path):
    """The attempt may be killed before its next sample (300 s here): the restore record is written when noted."""
    rec = MetricsRecorder(tmp_path, interval_s=300, attempt=2, node="n1", series=("training", "checkpoint"),
                          say=lambda m: None).start()
    checkpoint = tmp_path / "attempt-2" / "n1" / "checkpoint.jsonl"
    try:
        rec.note_step(61)
        rec.note_restore(step=60, started_at=1000.0, restored_at=1001.25, first_step=61, first_step_at=1001.5)
        wait_for(checkpoint.exists, "the restore record")
        (written,) = lines(checkpoint)
        assert {k: written[k] for k in ("event", "step", "started_at", "restored_at", "first_step", "first_step_at",
                                        "attempt", "node")} == {
            "event": "restore", "step": 60, "started_at": 1000.0, "restored_at": 1001.25, "first_step": 61,
            "first_step_at": 1001.5, "attempt": 2, "node": "n1"}
        assert not (tmp_path / "attempt-2" / "n1" / "training.jsonl").exists()  # no sample was taken early
        assert rec._thread.is_alive()
    finally:
        rec.close()
    assert [r["event"] for r in lines(checkpoint)] == ["restore"]  # close: the last sample (no state to add)
    assert len(lines(tmp_path / "attempt-2" / "n1" / "training.jsonl")) == 1
    fresh = MetricsRecorder(tmp_path / "fresh", attempt=1, node="n0", series=("training",), say=lambda m: None)
    fresh.note_restore(step=None, started_at=1.0, restored_at=None, first_step=1, first_step_at=2.0)
    assert fresh._pending == []  # a process that writes no checkpoint series records none


def test_the_sidecar_process_ends_with_its_last_sample_however_many_sigterms_come(tmp_path):
    """A burst of SIGTERMs (the launcher's stop path may send two, a supervisor more): one last sample, an exit.

    The sidecar used to set a ``threading.Event`` from a Python signal handler: a second SIGTERM
    arriving while the first handler held the event's lock deadlocked the process (seen under
    the suite's load: the attempt's ``Ended`` sample never came and the runner killed it 30 s
    later). Now it takes the signals synchronously (``SignalStop``). Against the old sidecar this
    stream failed 5 runs of 5: killed by a SIGTERM its torn-down handler no longer caught, and in
    2 of them before its last sample (the main thread spent its time in nested handlers).
    """
    env = {**os.environ, "SAT_METRICS_DIR": str(tmp_path), "SAT_ATTEMPT": "2", "SAT_NODE": "n0",
           "SAT_METRICS_INTERVAL_SECONDS": "300"}
    env.pop("SAT_PROGRESS_FILE", None)
    proc = subprocess.Popen([sys.executable, "-m", "ckpt_engine.metrics"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    job = tmp_path / "attempt-2" / "n0" / "job.jsonl"
    try:
        wait_for(lambda: job.exists() and lines(job), "the sidecar's Starting sample")
        wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) >= 2, "the sidecar's sampler thread")
        sent, until = 0, time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < until:  # a stream of them, through its whole stop
            try:
                os.kill(proc.pid, signal.SIGTERM)
                sent += 1
            except ProcessLookupError:
                break
        assert proc.wait(timeout=60) == 0, f"ended by a signal after {sent} SIGTERMs"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [r["status"] for r in lines(job)] == ["Starting", "Ended"]
