"""The lines a person follows while a job runs: steps, status changes and training, read from the run's records."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from sat_tasks.cli.console import Console
from sat_tasks.cli.progress import (
    RunWatcher,
    TaskListener,
    TrainingProgress,
    decision_outcome,
    elapsed,
    read_training,
    task_line,
    training_line,
    verdict_outcome,
)
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

RUN_ID = "manual__2026-12-02T04:06:56.363336+00:00"
# What the demo's first attempt left, as recorded (training.jsonl lines, progress.json).
TRAINING = [
    {"series": "training", "attempt": 1, "node": "local-node-0", "global_step": 1},
    {"series": "training", "attempt": 1, "node": "local-node-0", "global_step": 14, "loss": 5.769340133666992,
     "steps_per_second": 2.6173457623631866},
    {"series": "training", "attempt": 1, "node": "local-node-0", "global_step": 19, "steps_per_second": 2.3227},
]
PROGRESS = {"step": 22, "last_committed_step": 20, "committed_steps": [20], "attempt": 1, "resumed_from_step": None}
VERDICT = {"kind": "HARDWARE", "reason": "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus", "attempt": 1,
           "node": "local-node-0", "last_committed_step": 60, "evidence": ["NVRM: Xid 79"]}
ATTEMPT_END = {"event": "attempt_end", "attempt": 1, "node": "local-node-0", "verdict": "HARDWARE",
               "action": "failover", "last_committed_step": 60}


@pytest.mark.parametrize("seconds, expected", [
    pytest.param(0, "[0:00]", id="start"), pytest.param(65.9, "[1:05]", id="minutes"),
    pytest.param(-1, "[0:00]", id="never-negative"),
])
def test_elapsed(seconds, expected):
    assert elapsed(seconds) == expected


@pytest.mark.parametrize("args, expected", [
    pytest.param(("validate_spec", "done", 8.12), "validate_spec        done (8.1s)", id="done"),
    pytest.param(("attempt_1.launch", "failed", 40.3, "attempt 1 on local-node-0 ended with exit status 137"),
                 "attempt_1.launch     failed (40.3s): attempt 1 on local-node-0 ended with exit status 137",
                 id="failed-with-why"),
    pytest.param(("cleanup_run", "done", 0.01), "cleanup_run          done", id="instant"),
    pytest.param(("finalize", "done", None), "finalize             done", id="no-start-seen"),
])
def test_task_line(args, expected):
    assert task_line(*args) == expected


def test_a_verdict_names_the_attempts_node_and_checkpoint_and_a_decision_where_it_resumes():
    assert verdict_outcome(VERDICT) == ("HARDWARE on local-node-0, last checkpoint 60",
                                        "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus")
    assert verdict_outcome({**VERDICT, "last_committed_step": None})[0].endswith("last checkpoint none")
    assert decision_outcome(ATTEMPT_END) == ("HARDWARE -> failover from checkpoint 60", "")
    assert decision_outcome({**ATTEMPT_END, "verdict": "SUCCEEDED", "action": "upload"}) == (
        "SUCCEEDED -> upload", "")


@pytest.mark.parametrize("progress, expected", [
    pytest.param(TrainingProgress(attempt=1, node="local-node-0", step=14, loss=5.76934, steps_per_second=2.617),
                 "training: attempt 1 on local-node-0, step 14, loss 5.7693, 2.6 steps/s, checkpoint none yet",
                 id="before-the-first-checkpoint"),
    pytest.param(TrainingProgress(attempt=2, step=61, last_committed_step=60),
                 "training: attempt 2, step 61, checkpoint 60", id="resumed-no-metrics-yet"),
    pytest.param(TrainingProgress(attempt=1), "training: attempt 1, starting", id="starting"),
])
def test_training_line(progress, expected):
    assert training_line(progress) == expected


def _write_run_files(tmp_path, attempt: int = 1, progress: dict | None = PROGRESS) -> tuple:
    output, metrics = tmp_path / "output", tmp_path / "metrics"
    (output / "concurrent_checkpoint").mkdir(parents=True)
    if progress is not None:
        (output / "concurrent_checkpoint" / "progress.json").write_text(json.dumps(progress))
    node = metrics / f"attempt-{attempt}" / "local-node-0"
    node.mkdir(parents=True)
    (node / "training.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAINING) + '{"torn')
    return output, metrics


def test_training_progress_comes_from_progress_json_and_the_newest_metrics(tmp_path):
    output, metrics = _write_run_files(tmp_path)
    assert read_training(output, metrics, 1) == TrainingProgress(
        attempt=1, node="local-node-0", step=22, loss=5.769340133666992, steps_per_second=2.3227,
        last_committed_step=20)


def test_an_earlier_attempts_progress_is_not_this_attempts(tmp_path):
    output, metrics = _write_run_files(tmp_path)
    assert read_training(output, metrics, 2) is None  # progress.json is attempt 1's, no metrics of attempt 2 yet
    assert read_training(output, metrics, 1).step == 22


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeHook:
    """The S3Hook calls the watcher makes, over a dict of keys."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], str] = {}

    def put(self, uri: str, value) -> None:
        bucket, _, key = uri[len("s3://"):].partition("/")
        self.objects[(bucket, key)] = value if isinstance(value, str) else json.dumps(value)

    def check_for_key(self, key, bucket_name):
        return (bucket_name, key) in self.objects

    def read_key(self, key, bucket_name):
        return self.objects[(bucket_name, key)]

    def get_conn(self):  # `object_storage.read_json`'s one GET
        hook = self

        class NoSuchKey(Exception):
            pass

        class Client:
            exceptions = SimpleNamespace(NoSuchKey=NoSuchKey)

            def get_object(self, Bucket, Key):
                if (Bucket, Key) not in hook.objects:
                    raise NoSuchKey(Key)
                data = hook.objects[(Bucket, Key)].encode()
                return {"ContentLength": len(data), "Body": io.BytesIO(data)}

        return Client()


def test_each_step_ends_after_the_status_it_recorded_and_attempt_steps_say_what_they_found():
    from sat_tasks.io.metrics import ORCHESTRATOR_SERIES

    job = parse_spec({"name": "tiny-llama-demo", "image": {"url": "registry.sat.local/sat/training:0.1.0"},
                      "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
                      "storage": {"script_url": "s3://sat-demo/scripts/train.py"},
                      "results": {"destination": "s3://sat-demo/results/"}, "command": "python train.py"})
    run, hook, stream, clock = JobRun(job, RUN_ID), FakeHook(), io.StringIO(), FakeClock()
    watcher = RunWatcher(job, hook, Console(stream, live=False), clock=clock)
    listener = TaskListener(watcher)
    history = []

    def task(task_id: str, *, state: str = "success", wrote=(), error=None) -> None:
        """One task as the task runner reports it: started, writes its records, ends a second later."""
        instance = SimpleNamespace(task_id=task_id, run_id=RUN_ID, state=state)
        listener.on_task_instance_running(previous_state=None, task_instance=instance)
        for uri, value in wrote:
            hook.put(uri, value)
        clock.now += 1
        if state == "success":
            listener.on_task_instance_success(previous_state=None, task_instance=instance)
        elif state == "skipped":
            listener.on_task_instance_skipped(previous_state=None, task_instance=instance)
        else:
            listener.on_task_instance_failed(previous_state=None, task_instance=instance, error=error)

    with watcher.watching():
        task("validate_spec", wrote=[(run.status_uri, history + [{"status": "Pending", "reason": "spec validated"}])])
        task("attempt_1.launch", state="failed",
             error=RuntimeError("attempt 1 on local-node-0 ended with exit status 137\nmore"))
        task("attempt_1.classify", wrote=[(run.verdict_uri(1), VERDICT)])
        task("attempt_1.decide", wrote=[
            (run.status_uri, [{"status": "Pending", "reason": "spec validated"},
                              {"status": "Pending - failoverinprogress", "reason": "hardware fault on local-node-0"}]),
            (run.results_uri + ORCHESTRATOR_SERIES, json.dumps(ATTEMPT_END) + "\n")])
        task("attempt_3.launch", state="skipped")
        task("upload_results", state="up_for_retry", error="Object Storage did not answer")
    lines = [line.split("] ", 1)[1] for line in stream.getvalue().splitlines()]
    assert lines == [
        "status Pending: spec validated",
        "validate_spec        done (1.0s)",
        "attempt_1.launch     failed (1.0s): attempt 1 on local-node-0 ended with exit status 137",
        "attempt_1.classify   HARDWARE on local-node-0, last checkpoint 60 (1.0s): "
        "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus",
        "status Pending - failoverinprogress: hardware fault on local-node-0",
        "attempt_1.decide     HARDWARE -> failover from checkpoint 60 (1.0s)",
        "upload_results       failed, to be retried (1.0s): Object Storage did not answer",
    ]


def test_progress_json_over_the_bound_is_not_read_and_the_metrics_still_say_where_training_is(tmp_path,
                                                                                              monkeypatch):
    from sat_tasks.core import bounded

    output, metrics = _write_run_files(tmp_path, progress={**PROGRESS, "padding": "p" * 5000})
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 4096)
    progress = read_training(output, metrics, 1)
    assert progress.step == max(r["global_step"] for r in TRAINING) < PROGRESS["step"]  # from training.jsonl only
    assert progress.last_committed_step is None


def test_the_job_series_is_read_within_the_bound_and_its_torn_lines_left_out(monkeypatch):
    from sat_tasks.core import bounded
    from sat_tasks.io.metrics import ORCHESTRATOR_SERIES, read_job_records

    hook, results = FakeHook(), "s3://sat-demo/results/job/run/"
    assert read_job_records(hook, results) == []
    hook.put(results + ORCHESTRATOR_SERIES, json.dumps(ATTEMPT_END) + "\n[1]\n{\"torn")
    assert read_job_records(hook, results) == [ATTEMPT_END]
    monkeypatch.setattr(bounded, "MAX_JSON_BYTES", 16)
    with pytest.raises(bounded.ObjectTooLargeError, match=r"metrics/sat/job\.jsonl holds"):
        read_job_records(hook, results)
