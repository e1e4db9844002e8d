"""Fixtures of the warm-pool tests: a job of its own (data under a prefix of its own) on the session's S3 server."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun, RunRecords
from sat_tasks.spec import TrainingJob, parse_spec
from tests.support.paths import REPO

CORPUS = sorted((REPO / "include" / "corpus").glob("*.txt"))


def spec(name: str, source: str, results: str, **overrides) -> dict:
    data = {
        "name": name,
        "image": {"url": "registry.sat.local/sat/training:0.1.0"},
        "data": {"source": source},
        "results": {"destination": results},
        "command": "python train.py",
        "backend": "local",
        "warm_pool": {"keep_alive_seconds": 600},
    }
    data.update(overrides)
    return data


class WarmJob:
    """One job with its own data prefix and results destination; `run()` plays a run's tasks up to the end."""

    def __init__(self, hook, bucket: str):
        self.hook, self.bucket = hook, bucket
        self.name = f"warm-{uuid.uuid4().hex[:8]}"
        self.prefix = f"datasets/{self.name}/"
        self.source = f"s3://{bucket}/{self.prefix}"
        self.results = f"s3://{bucket}/results-{self.name}/"
        for path in CORPUS:
            self.put(path.name, path.read_bytes())
        self.runs = 0

    def put(self, name: str, body: bytes) -> None:
        self.hook.load_bytes(body, key=self.prefix + name, bucket_name=self.bucket, replace=True)

    def job(self, name: str | None = None, **overrides) -> TrainingJob:
        return parse_spec(spec(name or self.name, self.source, self.results, **overrides), source=self.name)

    def run_id(self) -> str:
        self.runs += 1
        return f"manual__2026-12-01T18:00:{self.runs:02d}+00:00"

    @staticmethod
    def complete(job: TrainingJob, run_id: str, *, node: str = "local-node-2",
                 status: JobStatus = JobStatus.COMPLETED) -> JobRun:
        """What the attempts of a run leave for `cleanup_run`: a record on `node` and the final status."""
        run = JobRun(job, run_id)
        run.store_record(AttemptRecord(job=job.name, attempt=1, backend="local", node=node, exit_code=0))
        run.history(lambda _: None).record(status, "test", task="test")
        return run


@pytest.fixture(autouse=True)
def no_warm_interpreter(monkeypatch):
    """No warm interpreter unless a test asks for one (test_warm_interpreter.py preloads `json` only)."""
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_PRELOAD", "none")


@pytest.fixture(autouse=True)
def one_hook(monkeypatch, s3_hook):
    """Every JobRun's records talk through the session's hook (a new S3Hook makes a boto3 client: ~0.5 s each)."""
    monkeypatch.setattr(RunRecords, "hook", lambda self: s3_hook)


@pytest.fixture
def warm_job(s3_hook, demo_bucket) -> WarmJob:
    return WarmJob(s3_hook, demo_bucket)


@pytest.fixture
def lines() -> list[str]:
    return []


def files_under(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
