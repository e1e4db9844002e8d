"""A test session's private world: no shared port, directory or database; seeding and sampling; clean-up."""

from __future__ import annotations

import os

from sat_tasks.spec import load_spec
from sat_tasks.testing.session import HarnessSession, db_template
from tests.support.paths import REPO

SPEC = REPO / "include" / "examples" / "user-repo" / "jobs" / "tiny-lm.yaml"


def test_two_sessions_share_no_port_directory_or_database_and_clean_up(tmp_path):
    before = {k: os.environ.get(k) for k in ("AIRFLOW_HOME", "AIRFLOW__SAT__WORK_DIR", "AIRFLOW_CONN_SAT_OBJECT_STORAGE")}
    first, second = HarnessSession(tmp_path), HarnessSession(tmp_path)
    try:
        first.activate()
        first_home, first_conn = os.environ["AIRFLOW_HOME"], (first.hook(), os.environ["AIRFLOW_CONN_SAT_OBJECT_STORAGE"])[1]
        second.activate()
        second.hook()
        assert first.dir != second.dir and first_home != os.environ["AIRFLOW_HOME"]
        assert first_home.startswith(str(first.dir)) and os.environ["AIRFLOW_HOME"].startswith(str(second.dir))
        assert os.environ["AIRFLOW__SAT__WORK_DIR"].startswith(str(second.dir))
        assert first._server.port != second._server.port and first_conn != os.environ["AIRFLOW_CONN_SAT_OBJECT_STORAGE"]
    finally:
        second.close()
        first.close()
    assert {k: os.environ.get(k) for k in before} == before  # the caller's environment is back
    assert list(tmp_path.iterdir()) == []  # both directories removed


def test_seed_puts_the_repositorys_files_in_object_storage_and_a_sample_takes_the_first_objects(tmp_path):
    job = load_spec(SPEC)
    session = HarnessSession(tmp_path)
    try:
        session.activate()
        session.seed(SPEC, job)
        hook = session.hook()
        assert hook.check_for_key("code/train.py", bucket_name="team-ml")
        assert sorted(hook.list_keys(bucket_name="team-ml", prefix="datasets/tiny/")) == [
            f"datasets/tiny/shard-{i}.txt" for i in range(4)]
        sample = session.sample_data(job, 2)
        assert sample == "s3://team-ml/sat-test-samples/tiny-lm/2/"
        assert sorted(hook.list_keys(bucket_name="team-ml", prefix="sat-test-samples/")) == [
            "sat-test-samples/tiny-lm/2/shard-0.txt", "sat-test-samples/tiny-lm/2/shard-1.txt"]
    finally:
        session.close()


def test_a_session_copies_the_cached_fresh_metadata_db_instead_of_migrating(tmp_path, monkeypatch):
    monkeypatch.setenv("SAT_TEST_CACHE_DIR", str(tmp_path / "cache"))
    template = db_template()
    assert template.parent == tmp_path / "cache" and template.name.startswith("airflow-3.")
    template.parent.mkdir()
    template.write_bytes(b"a freshly migrated db")
    session = HarnessSession(tmp_path)
    try:
        session.activate()
        session.ensure_db()  # no `airflow db migrate`: the session gets the template's bytes
        assert (session.dir / "airflow" / "airflow.db").read_bytes() == b"a freshly migrated db"
    finally:
        session.close()
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://db/airflow")
    assert db_template() is None  # only SQLite is copied


def test_the_runs_airflow_logs_go_beside_the_sessions_directory_so_that_they_outlive_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SAT_TEST_LOG_DIR", raising=False)
    session = HarnessSession(tmp_path)
    path = session.log_path("tiny-lm", "hardware_fault@15")
    assert path.parent == tmp_path / "sat-logs" and not path.parent.exists()  # made by the run that writes it
    assert path.name.startswith("tiny-lm-hardware_fault@15-") and path.suffix == ".log"
    session.close()
    monkeypatch.setenv("SAT_TEST_LOG_DIR", str(tmp_path / "ci-artifacts"))
    other = HarnessSession(tmp_path)
    try:
        assert other.log_path("tiny-lm", "smoke").parent == tmp_path / "ci-artifacts"
    finally:
        other.close()
