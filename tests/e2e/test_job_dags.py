"""Training Job DAGs end to end with dag.test(): local backend, embedded S3, injected faults.

These runs use a stand-in trainer (tests/e2e/scripts/fake_train.py) that writes
progress.json like the checkpoint engine, so each scenario takes seconds of "training";
the real tiny-Llama job with the engine runs in test_demo_job.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.cli.run import run_job
from sat_tasks.core.run_summary import SUMMARY_KEY
from sat_tasks.io.object_storage import read_json
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import parse_spec

SCRIPTS = Path(__file__).parent / "scripts"
FAKE = "python fake_train.py"


@pytest.fixture(scope="module")
def scripts_in_bucket(s3_hook, demo_bucket, airflow_db):
    for path in SCRIPTS.glob("*.py"):
        s3_hook.load_file(filename=path, key=f"test-scripts/{path.name}", bucket_name=demo_bucket, replace=True)
    return f"s3://{demo_bucket}/test-scripts/"


def make_job(name: str, script: str = "fake_train.py", **fields):
    spec = {
        "name": name,
        "learning_type": "on-demand",
        "framework": "pytorch",
        "job_failover": True,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
        "storage": {"script_url": f"s3://sat-demo/test-scripts/{script}"},
        "results": {"destination": "s3://sat-demo/results/"},
        "command": f"python {script}",
        "env": {"FAKE_STEPS": "40", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05"},
        "heartbeat_timeout_seconds": 20,
    }
    spec.update(fields)
    return parse_spec(spec)


def run(job) -> tuple[dict, list[dict]]:
    """Run the job through the generic DAG; return the job report and the attempts' verdicts."""
    report = run_job(job, None, quiet=True)
    assert report is not None, "no job report written"
    return report, report["attempts"]


def job_log(s3_hook, job, report) -> str:
    bucket, _, key = (report["results"] + "job.log")[len("s3://"):].partition("/")
    return s3_hook.read_key(key, bucket_name=bucket)


def statuses(report) -> list[str]:
    return [entry["status"] for entry in report["history"]]


def task_runs(report) -> dict[str, tuple[str, int]]:
    """Each task of the report's DAG run: its state and how often it was started (try_number 0: never)."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter(TaskInstance.dag_id == GENERIC_DAG_ID,
                                                 TaskInstance.run_id == report["run_id"]).all()
        return {ti.task_id: (str(getattr(ti.state, "value", ti.state)), ti.try_number) for ti in tis}


def xcom_keys(report) -> set[str]:
    """The keys of every XCom the report's DAG run pushed."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel.key).filter(XComModel.dag_id == GENERIC_DAG_ID,
                                                   XComModel.run_id == report["run_id"]).distinct()
        return {key for (key,) in rows}


def assert_later_attempts_never_started(report, last: int) -> None:
    """Attempt `last` decided that no attempt follows: every task of the later groups was skipped at once by its
    `decide`, none started (not a task process per group that skips itself), and the run went on to its upload."""
    runs = task_runs(report)
    later = {task: state for task, state in runs.items()
             if task.startswith("attempt_") and int(task.split(".")[0].split("_")[1]) > last}
    assert later and all(state == ("skipped", 0) for state in later.values()), later
    assert runs[f"attempt_{last}.decide"][0] == "success" and runs["upload_results"][1] == 1, runs


def test_hardware_fault_fails_over_and_resumes_from_last_commit(scripts_in_bucket, s3_hook):
    job = make_job("e2e-failover", faults=[{"kind": "hardware", "attempt": 1, "at_step": 17, "xid": 79}])
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert statuses(report) == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    assert [a["verdict"] for a in attempts] == ["HARDWARE", "SUCCEEDED"]
    assert attempts[0]["node"] != attempts[1]["node"]
    assert any("Xid" in line and "79" in line for line in attempts[0]["evidence"])
    log = job_log(s3_hook, job, report)
    assert log.count("Starting dataset initialization") == 2
    committed_at_fault = attempts[0]["last_committed_step"]
    # The fault strikes when the launcher's poll sees step >= 17; on a loaded machine that poll can come a
    # few steps late, so the last commit is 15 or a later multiple of 5, never an earlier one.
    assert committed_at_fault >= 15 and committed_at_fault % 5 == 0
    assert f"Resuming from checkpoint-{committed_at_fault} (CKPT_LAST_STEP={committed_at_fault})" in log
    assert attempts[1]["resumed_from"] == committed_at_fault
    assert attempts[0]["step_at_end"] - committed_at_fault < 5  # lost work at most one checkpoint interval
    # Results and history are in the bucket under <results>/<job>/<run_id>/.
    assert read_json(s3_hook, report["results"] + "status.json")[-1]["status"] == "Completed"
    assert s3_hook.check_for_key(report["results"][len("s3://sat-demo/"):] + "output/trainer_state.json",
                                 bucket_name="sat-demo")
    assert_later_attempts_never_started(report, 2)
    # each task's value is one XCom (what every reader takes), not also one per key of a returned dict
    assert xcom_keys(report) == {"return_value", SUMMARY_KEY}


def test_four_hardware_faults_end_in_max_retries(scripts_in_bucket):
    # A different Xid each time: one signature on three nodes would be the job's own fault (INTERNAL, ADR 0004).
    faults = [{"kind": "hardware", "attempt": n, "at_step": 3, "xid": xid} for n, xid in enumerate((48, 79, 74, 95), 1)]
    # 400 steps: on a loaded machine the launcher's poll may come late; the fault must still find training running.
    report, attempts = run(make_job("e2e-maxretries", faults=faults,
                                    env={"FAKE_STEPS": "400", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05"}))
    assert report["status"] == "Pending - maxretriesexceeded"
    assert len(attempts) == 4  # the first attempt and three failovers, no fourth failover
    assert statuses(report).count("Pending - failoverinprogress") == 3
    assert len({a["node"] for a in attempts}) == 4  # never back on a node that failed


def test_broken_script_is_internal_after_one_attempt(scripts_in_bucket, s3_hook, s3_server):
    job = make_job("e2e-broken", script="broken_train.py")
    report, attempts = run(job)
    assert report["status"] == "Pending - internalerror"
    assert len(attempts) == 1 and attempts[0]["verdict"] == "INTERNAL"
    assert any("KeyError" in line for line in attempts[0]["evidence"])
    assert_later_attempts_never_started(report, 1)
    # The report and the status history are JSON and hold no secret, on this error path too.
    assert s3_server.secret_key not in json.dumps(report)
    status = read_json(s3_hook, JobRun.of(job, GENERIC_DAG_ID, report["run_id"]).status_uri)
    assert status and s3_server.secret_key not in json.dumps(status)


def test_spot_preempted_twice_resumes_each_time(scripts_in_bucket, s3_hook):
    faults = [
        {"kind": "preemption", "attempt": 1, "at_step": 12, "capacity_delay_seconds": 3},
        {"kind": "preemption", "attempt": 2, "at_step": 26},
    ]
    job = make_job("e2e-spot", learning_type="spot", job_failover=False, faults=faults,
                   spot={"max_resumes": 3, "max_wait_seconds": 120, "poll_seconds": 1},
                   env={"FAKE_STEPS": "40", "FAKE_SAVE_EVERY": "5", "FAKE_STEP_SECONDS": "0.05",
                        "SAT_METRICS_INTERVAL_SECONDS": "0.3"})
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["PREEMPTED", "PREEMPTED", "SUCCEEDED"]
    assert statuses(report).count("Pending - preempted") == 2
    # The first wait lasted until capacity came back (a reschedule-mode sensor, polled every second):
    # capacity returns 3 s after `decide` saw the pre-emption, which is after attempt 1 ended. (Not
    # from the "Pending - preempted" entry: on a busy machine that is written a second or more later.)
    from datetime import datetime

    history = report["history"]
    i = statuses(report).index("Pending - preempted")
    assert history[i + 1]["status"] == "Running"
    gap = datetime.fromisoformat(history[i + 1]["at"]) - datetime.fromisoformat(attempts[0]["finished_at"])
    assert gap.total_seconds() >= 3
    log = job_log(s3_hook, job, report)
    # SIGTERM makes the trainer commit a final checkpoint; each resume starts from it.
    for attempt in attempts[:2]:
        step = attempt["last_committed_step"]
        assert f"SIGTERM: final checkpoint at step {step}" in log
        assert f"Resuming from checkpoint-{step}" in log
    # The metrics in Object Storage show the pause: each attempt's training series ends at the
    # pre-emption, the next starts after the wait for capacity (>= 3 s for the first) at the resumed step.
    from sat_tasks.io.metrics import job_summary, read_object_storage

    metrics = read_object_storage(report["results"], s3_hook)
    assert not metrics.problems, metrics.problems
    assert sorted({r["attempt"] for r in metrics.records["training"]}) == [1, 2, 3]
    faults = job_summary(metrics)["faults"]
    assert [f["status"] for f in faults] == ["Pending - preempted", "Pending - preempted"]
    assert faults[0]["recovery_s"] >= 3, faults
    for fault, attempt in zip(faults, attempts[:2]):
        assert fault["resumed_at_step"] > attempt["last_committed_step"] - 1
        assert fault["last_step"] <= attempt["step_at_end"]
    job_series = metrics.records["job"]
    assert {r["attempt"] for r in job_series} == {1, 2, 3}
    sidecar = [r for r in job_series if r["node"] != "sat" and "event" not in r]  # each node's sidecar
    assert {r.get("status") for r in sidecar} == {"Starting", "Running", "Ended"}
    ends = [r for r in job_series if r.get("event") == "attempt_end"]  # SAT's own record of each attempt
    assert [(r["attempt"], r["verdict"], r["action"]) for r in ends] == [
        (1, "PREEMPTED", "resume"), (2, "PREEMPTED", "resume"), (3, "SUCCEEDED", "upload")]
    assert [r["status"] for r in job_series if r.get("event") == "final"] == ["Completed"]


def test_spot_max_wait_ends_the_job(scripts_in_bucket):
    faults = [{"kind": "preemption", "attempt": 1, "at_step": 5, "capacity_delay_seconds": 600}]
    job = make_job("e2e-spot-wait", learning_type="spot", job_failover=False, faults=faults,
                   spot={"max_resumes": 2, "max_wait_seconds": 8, "poll_seconds": 1})
    report, attempts = run(job)
    assert report["status"] == "Failed"
    assert "max_wait_seconds" in report["history"][-1]["reason"]
    assert [a["verdict"] for a in attempts] == ["PREEMPTED"]


def test_bad_image_reference_stops_before_training(scripts_in_bucket):
    job = make_job("e2e-bad-image", image={"url": "registry.sat.local/Team/UPPER:tag"})
    report, attempts = run(job)
    assert report["status"] == "Pending - imagepullbackoff"
    assert attempts == []


def test_hardware_fault_without_failover_fails(scripts_in_bucket):
    job = make_job("e2e-no-failover", job_failover=False,
                   faults=[{"kind": "hardware", "attempt": 1, "at_step": 5}])
    report, attempts = run(job)
    assert report["status"] == "Failed"
    assert len(attempts) == 1 and attempts[0]["verdict"] == "HARDWARE"


def test_hang_is_detected_by_heartbeat_and_failed_over(scripts_in_bucket):
    job = make_job("e2e-hang", heartbeat_timeout_seconds=4,
                   faults=[{"kind": "hang", "attempt": 1, "at_step": 8}])
    report, attempts = run(job)
    assert report["status"] == "Completed"
    assert [a["verdict"] for a in attempts] == ["HARDWARE", "SUCCEEDED"]


def test_invalid_data_stops_before_training(scripts_in_bucket, s3_hook, demo_bucket):
    s3_hook.load_bytes(b"\xff\xfe\x00 not utf-8", key="datasets/broken/part-0.txt", bucket_name=demo_bucket,
                       replace=True)
    job = make_job("e2e-bad-data", data={"source": f"s3://{demo_bucket}/datasets/broken/"})
    report, attempts = run(job)
    assert report["status"] == "Pending - internalerror"
    assert "utf8_ok" in report["history"][-1]["reason"]
    assert attempts == []


