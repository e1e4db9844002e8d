"""One test session's private world: an Airflow home with its metadata DB, a work dir, an embedded Object Storage.

Every session (a pytest process, or each pytest-xdist worker) gets a fresh temporary
directory and a moto S3 server on a free loopback port, so two sessions on one machine
never share a port, a file or a database. The runs of one session share them: the
metadata DB is made once (a copy of a cached freshly migrated one, see `db_template`), the
server started once, and each run writes under its own run id. `close()` stops the server
and removes the directory.

Call order: `HarnessSession()` -> `activate()` (environment only; before Airflow is
imported) -> `run(...)` any number of times (starts the server and migrates the DB on
first use) -> `close()`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sat_tasks.config import PROJECT_ROOT

if TYPE_CHECKING:
    from sat_tasks.spec import TrainingJob

# What a run's `start` returns (`testing.runs.FinishedRun`): the session keeps it without knowing its type.
Run = TypeVar("Run")

SAMPLE_PREFIX = "sat-test-samples"  # where a data sample is copied, in the data's own bucket


def db_template() -> Path | None:
    """Where the freshly migrated SQLite DB of this Airflow version is cached (None: not SQLite, no cache).

    `SAT_TEST_CACHE_DIR`, else `$XDG_CACHE_HOME/sat` or `~/.cache/sat`.
    """
    from importlib.metadata import version

    if os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").split(":", 1)[0] != "sqlite":
        return None
    base = os.environ.get("SAT_TEST_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "sat")
    return Path(base) / f"airflow-{version('apache-airflow')}-fresh.db"


class HarnessSession:
    """The shared state of the runs of one test session."""

    def __init__(self, base_dir: str | Path | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sat-test-", dir=base_dir))
        self._previous_env: dict[str, str | None] = {}
        self._server = None
        self._db_ready = False
        self._seeded: set[str] = set()
        self.runs: dict[tuple[str, str], Any] = {}  # a run's result, or the error it raised

    @property
    def logs_dir(self) -> Path:
        """Where the runs' Airflow logs go: `$SAT_TEST_LOG_DIR`, else `sat-logs/` beside the session's directory.

        Not inside it: `close()` removes that, and a failed test's message names the log of its run.
        """
        return Path(os.environ.get("SAT_TEST_LOG_DIR") or self.dir.parent / "sat-logs")

    def log_path(self, job_name: str, label: str) -> Path:
        """The file for the Airflow logs of one run (`<job>-<label>-<UTC time>-<pid>.log`)."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        return self.logs_dir / f"{job_name}-{re.sub(r'[^A-Za-z0-9_.@-]+', '_', label)}-{stamp}-{os.getpid()}.log"

    @property
    def jobs_dir(self) -> Path:
        """The session's jobs dir: a run's shortened spec is put here so that it runs through its own DAG."""
        return self.dir / "jobs"

    # ---- environment -----------------------------------------------------------------------
    def environment(self) -> dict[str, str]:
        """The variables that point Airflow and SAT at this session's directory (and nowhere shared)."""
        home = self.dir / "airflow"
        return {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW_CONFIG": str(PROJECT_ROOT / "airflow.cfg"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Only the spec of the run in progress (SAT's own demo specs are not loaded).
            "AIRFLOW__SAT__JOBS_DIR": str(self.jobs_dir),
            "AIRFLOW__SAT__WORK_DIR": str(self.dir / "work"),
            "AIRFLOW__SAT__BACKEND": "local",
            "GX_ANALYTICS_ENABLED": "false",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
        }

    def activate(self) -> None:
        """Export this session's environment (remembering what it replaces; `close()` puts it back)."""
        env = self.environment()
        for key in ("AIRFLOW_HOME", "AIRFLOW__SAT__JOBS_DIR", "AIRFLOW__SAT__WORK_DIR"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        for key, value in env.items():
            self._previous_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        # An Object Storage connection inherited from the caller would put test runs somewhere shared.
        self._previous_env.setdefault("AIRFLOW_CONN_SAT_OBJECT_STORAGE", os.environ.pop(
            "AIRFLOW_CONN_SAT_OBJECT_STORAGE", None))

    # ---- shared services, started on first use ---------------------------------------------------
    def hook(self) -> Any:
        """An S3Hook on this session's Object Storage (the server starts on the first call)."""
        if self._server is None:
            from sat_tasks.io.local_s3 import LocalS3Server

            self._server = LocalS3Server().start()
            for key in self._server.connection_env():
                self._previous_env.setdefault(key, os.environ.get(key))
            os.environ.update(self._server.connection_env())
        from sat_tasks.io.object_storage import object_storage_hook

        return object_storage_hook()

    def ensure_db(self) -> None:
        """Give this session a migrated metadata DB: a copy of the cached fresh one, else migrate (and cache it).

        `airflow db migrate` takes 10-20 s; a freshly migrated SQLite DB depends only on the
        Airflow version, so it is kept once per version in the cache dir (`db_template`) and
        copied into each session's own home. The template is written under a temporary name
        and renamed, so two sessions never read a half-written one.
        """
        if self._db_ready:
            return
        from sat_tasks.cli.common import ensure_metadata_db

        home = Path(os.environ["AIRFLOW_HOME"])
        template = db_template()
        if template is not None and template.is_file():
            shutil.copyfile(template, home / "airflow.db")
            (home / ".migrated").touch()  # what ensure_metadata_db looks for
        ensure_metadata_db()  # quick when the copy is there
        if template is not None and not template.is_file():
            template.parent.mkdir(parents=True, exist_ok=True)
            partial = template.with_name(f"{template.name}.{os.getpid()}.tmp")
            shutil.copyfile(home / "airflow.db", partial)
            os.replace(partial, template)
        self._db_ready = True

    def seed(self, spec_path: Path, job: TrainingJob) -> None:
        """Put the spec's `test.seed` files into Object Storage (once per spec and session)."""
        key = str(spec_path.resolve())
        if key in self._seeded or job.test is None:
            return
        from sat_tasks.spec import split_s3_uri

        hook = self.hook()
        for item in job.test.seed:
            local = (spec_path.parent / item.source).resolve()
            if not local.exists():
                raise FileNotFoundError(f"{spec_path}: test.seed: {item.source} does not exist ({local})")
            bucket, prefix = split_s3_uri(item.to)
            if not hook.check_for_bucket(bucket):
                hook.create_bucket(bucket_name=bucket)
            if local.is_dir():
                prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
                files = [(p, prefix + p.relative_to(local).as_posix()) for p in sorted(local.rglob("*"))
                         if p.is_file() and "__pycache__" not in p.parts]
            else:
                files = [(local, prefix + local.name if prefix.endswith("/") or not prefix else prefix)]
            for path, object_key in files:
                hook.load_file(filename=path, key=object_key, bucket_name=bucket, replace=True)
        self._seeded.add(key)

    def sample_data(self, job: TrainingJob, count: int) -> str:
        """Copy the first `count` objects of `job.data.source` to a sample prefix; return its URI."""
        from sat_tasks.spec import split_s3_uri

        hook = self.hook()
        bucket, prefix = split_s3_uri(job.data.source)
        keys = sorted(k for k in (hook.list_keys(bucket_name=bucket, prefix=prefix) or []) if not k.endswith("/"))
        if not keys:
            raise FileNotFoundError(f"no objects under {job.data.source} in the test Object Storage: "
                                    "seed them with the spec's test.seed")
        target = f"{SAMPLE_PREFIX}/{job.name}/{count}/"
        for key in keys[:count]:
            hook.copy_object(source_bucket_key=key, dest_bucket_key=target + key[len(prefix):],
                             source_bucket_name=bucket, dest_bucket_name=bucket)
        return f"s3://{bucket}/{target}"

    # ---- runs ---------------------------------------------------------------------------------
    def run(self, spec_path: Path, label: str, start: Callable[[], Run]) -> Run:
        """The run `label` of a spec: `start()` runs it the first time; later calls get the same run.

        A run that raised raises the same error again for every test that asks for it.
        """
        key = (str(spec_path.resolve()), label)
        if key not in self.runs:
            try:
                self.runs[key] = start()
            except Exception as exc:  # noqa: BLE001 - kept and re-raised for each test of this run
                self.runs[key] = exc
        result = self.runs[key]
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        """Stop the server, restore the environment, remove the session's directory."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        for key, value in self._previous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._previous_env.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
