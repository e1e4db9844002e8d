"""A job DAG file's parse budget, and the skip reports that `sat_job_spec_errors.py` turns into an import error.

The reports live where every DAG processor reads them: the metadata DB (Airflow Variables through
the processor's manager). `tests.support.dag_processor_comms` stands in for the manager, over the
session's real metadata DB; the budget is spent by construction (`ParseBudget(0.0)`, a budget that
counts specs, or `build_seconds` 0 in a child process), never by a clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sat_tasks.airflow import parse_budget as budget_module
from sat_tasks.airflow.job_dags import load_shard_dags, spec_problems
from sat_tasks.airflow.parse_budget import (
    IN_PROCESS,
    NAMED_SKIPPED,
    VARIABLE_PREFIX,
    AirflowVariables,
    InProcess,
    ParseBudget,
    SkipReport,
    build_seconds,
    in_dag_processor,
    parse_budget,
    read_reports,
    record_pass,
    report_store,
    variable_key,
)
from sat_tasks.airflow.shards import shard_of
from tests.support.dag_processor_comms import install

ROOT = Path(__file__).resolve().parents[3]
DEMO = yaml.safe_load((ROOT / "include" / "jobs" / "tiny-llama-demo.yaml").read_text())


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(IN_PROCESS, "values", {})
    return tmp_path


@pytest.fixture
def metadata_db(airflow_db):
    """The session's metadata DB with no skip report in it; the rows under `VARIABLE_PREFIX` after the test."""
    _clear_reports()
    yield airflow_db
    _clear_reports()


def _clear_reports() -> None:
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(Variable).where(Variable.key.startswith(VARIABLE_PREFIX)))


def _kept() -> dict[str, str]:
    """The skip reports in the metadata DB's `variable` table, by key."""
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return {row.key: row.val for row in session.scalars(
            select(Variable).where(Variable.key.startswith(VARIABLE_PREFIX)))}


@pytest.mark.parametrize(("import_timeout", "processor_timeout", "seconds"), [
    pytest.param(30.0, 50.0, 15.0, id="airflow-defaults"),
    pytest.param(60.0, 50.0, 15.0, id="import-longer-than-processor"),
    pytest.param(10.0, 50.0, 8.0, id="short-import"),
    pytest.param(30.0, 0.0, 24.0, id="no-processor-limit"),
    pytest.param(0.0, 0.0, float("inf"), id="no-limit"),
])
def test_build_seconds_leave_room_to_serialize(import_timeout, processor_timeout, seconds):
    assert build_seconds(import_timeout, processor_timeout) == pytest.approx(seconds)


def test_the_budget_comes_from_airflows_timeouts(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "12")
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT", "100")
    budget = parse_budget("/dags/sat_jobs_00.py", started=time.monotonic() - 20)
    assert budget.seconds == pytest.approx(9.6)
    assert budget.exhausted() and not ParseBudget(9.6).exhausted()


def _report(file="sat_jobs_03.py", skipped=("/jobs/a.yaml", "/jobs/b.yaml")):
    return SkipReport(file, tuple(skipped), built=40, spent_seconds=20.1, budget_seconds=20.0)


def test_a_pass_that_skipped_is_logged_and_kept_until_a_pass_finishes(caplog):
    store = InProcess()
    record_pass("/jobs", _report(), store)
    assert "sat_jobs_03.py: stopped after 20.1s of its 20.0s parse budget (40 done, in its pass at " in caplog.text
    assert "/jobs/b.yaml" in caplog.text
    [kept] = read_reports("/jobs", store=store)
    assert (kept.dag_file, kept.skipped, kept.left_out, kept.built) == ("sat_jobs_03.py", _report().skipped, 2, 40)
    assert kept.host and kept.at > 0
    assert read_reports("/other-jobs", store=store) == []
    record_pass("/jobs", _report(skipped=()), store)
    assert read_reports("/jobs", store=store) == [] and store.values == {}


def test_reports_of_other_files_and_old_reports_are_ignored():
    store = InProcess()
    record_pass("/jobs", _report("sat_jobs_03.py"), store)
    record_pass("/jobs", _report("sat_jobs_99.py"), store)
    assert [r.dag_file for r in read_reports("/jobs", {"sat_jobs_03.py"}, store)] == ["sat_jobs_03.py"]
    record_pass("/jobs", replace(_report("sat_jobs_03.py"), at=time.time() - 7200), store)  # two hours ago
    assert [r.dag_file for r in read_reports("/jobs", store=store)] == ["sat_jobs_99.py"]


def test_a_damaged_report_is_skipped():
    store = InProcess()
    record_pass("/jobs", _report(), store)
    store.put(variable_key("sat_jobs_04.py"), json.dumps({"dag_file": "sat_jobs_04.py"}))
    store.put(variable_key("sat_jobs_05.py"), "not json")
    assert [r.dag_file for r in read_reports("/jobs", store=store)] == ["sat_jobs_03.py"]


def test_a_report_names_a_few_skipped_files_and_counts_the_rest(caplog):
    many = _report(skipped=[f"/jobs/{'x' * 500}-{i:05d}.yaml" for i in range(5000)])
    lines = many.lines()
    assert lines[1] == f"  /jobs/{'x' * 500}-00000.yaml"
    assert f"  ... and {5000 - NAMED_SKIPPED} more spec file(s)" in lines and len(lines) == NAMED_SKIPPED + 2
    assert "5000 spec file(s) were left out" in lines[0]
    store = InProcess()
    record_pass("/jobs", many, store)
    assert "-04999.yaml" not in caplog.text
    [value] = store.values.values()
    assert len(value) < 4096  # one small write per pass, whatever the numbers
    [kept] = read_reports("/jobs", store=store)
    assert kept.left_out == 5000 and len(kept.skipped) == NAMED_SKIPPED
    assert f"  ... and {5000 - NAMED_SKIPPED} more spec file(s)" in kept.lines()
    assert _report().lines()[1:] == ["  /jobs/a.yaml", "  /jobs/b.yaml"]
    forged = json.loads(value) | {"skipped": ["x" * 100_000] * 1000, "host": "h" * 100_000}
    store.put(variable_key("sat_jobs_03.py"), json.dumps(forged))  # a Variable edited by hand: still small
    assert len("\n".join(read_reports("/jobs", store=store)[0].lines())) < 4096


def test_a_store_that_fails_costs_the_pass_nothing(caplog):
    class Broken(InProcess):
        def put(self, key, value):
            raise OSError("the manager went away")

        def keys(self, prefix):
            raise OSError("the manager went away")

    record_pass("/jobs", _report(), Broken())
    assert "could not keep the skip report of sat_jobs_03.py" in caplog.text
    assert read_reports("/jobs", store=Broken()) == []
    assert "could not read the skip reports" in caplog.text


# ---- which store: the metadata DB in a DAG processor's pass, this process anywhere else --------------------------
def test_only_a_dag_processors_parse_writes_to_the_metadata_db(monkeypatch):
    from airflow.sdk.execution_time import task_runner

    processor = {"__name__": "airflow.dag_processing.processor", "in_dag_processor": in_dag_processor}
    exec("def _parse_file():\n    return in_dag_processor()\n", processor)  # noqa: S102 - a frame as Airflow's
    other = {"__name__": "airflow.sdk.execution_time.task_runner", "in_dag_processor": in_dag_processor}
    exec("def parse():\n    return in_dag_processor()\n", other)  # noqa: S102 - a task runner's parse
    monkeypatch.delattr(task_runner, "SUPERVISOR_COMMS", raising=False)
    assert not processor["_parse_file"]() and isinstance(report_store(), InProcess)  # a DagBag: no manager
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    assert processor["_parse_file"]() and not other["parse"]() and not in_dag_processor()
    assert isinstance(report_store(), InProcess)  # a task runner's parse of its DAG's file writes nothing shared


def test_airflow_still_parses_dag_files_where_in_dag_processor_looks():
    """An Airflow upgrade that renames the processor's parse function fails here, not silently in production."""
    from airflow.dag_processing import processor

    module, function = budget_module.PROCESSOR_PARSE
    assert processor.__name__ == module
    assert function in processor._parse_file_entrypoint.__code__.co_names
    assert "BundleDagBag" in getattr(processor, function).__code__.co_names


# ---- the metadata DB: every processor reports every kept skip --------------------------------------------------
class CountedBudget(ParseBudget):
    """A budget that lets `specs` specs through, then is spent: no clock involved."""

    def __init__(self, specs: int):
        super().__init__(60.0, 0.0)
        object.__setattr__(self, "left", [specs])

    def exhausted(self) -> bool:
        self.left[0] -= 1
        return self.left[0] < 0

    def spent(self) -> float:
        return 1.0


def _specs_in_one_shard(jobs: Path, count: int) -> tuple[int, list[Path]]:
    """`count` valid spec files that all fall in one shard: (the shard, their paths in spec-file order)."""
    jobs.mkdir(exist_ok=True)
    names = [f"job-{i:03d}" for i in range(400)]
    shard = shard_of(f"{names[0]}.yaml")
    mine = [name for name in names if shard_of(f"{name}.yaml") == shard][:count]
    for name in mine:
        (jobs / f"{name}.yaml").write_text(yaml.safe_dump({**DEMO, "name": name}))
    return shard, sorted(jobs / f"{name}.yaml" for name in mine)


def test_every_pass_that_left_specs_out_is_an_import_error_until_one_builds_them_all(tmp_path, metadata_db,
                                                                                  monkeypatch):
    """Each errors-file parse after a pass that skipped raises (the count, some names), whatever parsed in between."""
    comms = install(monkeypatch)
    jobs = tmp_path / "jobs"
    shard, paths = _specs_in_one_shard(jobs, 3)
    fileloc = f"/dags/sat_jobs_{shard:02d}.py"
    assert spec_problems(jobs) is None

    load_shard_dags(jobs, shard, fileloc=fileloc, budget=ParseBudget(0.0))  # pass 1: nothing built
    assert list(_kept()) == [variable_key(fileloc)]
    for _errors_file_pass in range(2):  # it stays said on every parse of the errors file, not once
        message = str(spec_problems(jobs))
        assert "3 spec file(s) have no DAG from the last pass of 1 SAT DAG file(s)" in message
        assert f"sat_jobs_{shard:02d}.py: stopped after" in message and f"  {paths[0]}" in message
    load_shard_dags(jobs, (shard + 1) % 16, fileloc=f"/dags/sat_jobs_{(shard + 1) % 16:02d}.py",
                    budget=ParseBudget(60.0))  # another file's clean pass clears only its own report
    assert "3 spec file(s) have no DAG" in str(spec_problems(jobs))

    built = load_shard_dags(jobs, shard, fileloc=fileloc, budget=CountedBudget(2))  # pass 2: one left out
    assert len(built.dags) == 2 and built.skipped == [str(paths[2])]
    message = str(spec_problems(jobs))
    assert "1 spec file(s) have no DAG" in message and f"  {paths[2]}" in message and f"  {paths[0]}" not in message

    load_shard_dags(jobs, shard, fileloc=fileloc, budget=ParseBudget(60.0))  # pass 3: everything built
    assert _kept() == {} and spec_problems(jobs) is None
    assert {"PutVariable", "DeleteVariable", "GetVariableKeys", "GetVariable"} <= set(comms.sent)


def _pass_in_a_process(dag_file: str, jobs: Path, tmp: Path, *, no_budget: bool = False) -> dict:
    """One DAG file parsed in a fresh process with its own temp dir, as a DAG processor's child parses it."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "AIRFLOW__SAT__JOBS_DIR": str(jobs),
           "SAT_TEST_NO_BUDGET": "1" if no_budget else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "tests.support.dag_processor_comms", str(ROOT / "dags" / dag_file)],
                          env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_skip_one_processor_kept_is_reported_by_a_replica_and_after_a_restart(tmp_path, metadata_db, monkeypatch):
    """Processors share nothing but the metadata DB: another temp dir, or a restarted one with a wiped temp dir."""
    jobs = tmp_path / "jobs"
    shard, paths = _specs_in_one_shard(jobs, 2)
    job_file = f"sat_jobs_{shard:02d}.py"
    first, replica = tmp_path / "tmp-processor-0", tmp_path / "tmp-processor-1"

    skipped = _pass_in_a_process(job_file, jobs, first, no_budget=True)
    assert skipped == {"import_error": None, "dags": 0}
    assert list(_kept()) == [variable_key(job_file)]

    said = _pass_in_a_process("sat_job_spec_errors.py", jobs, replica)["import_error"]
    assert said is not None and f"{job_file}: stopped after" in said
    assert "2 spec file(s) were left out" in said and f"  {paths[0]}" in said

    for child in sorted(first.rglob("*"), reverse=True):  # the processor restarts in a fresh container
        child.rmdir() if child.is_dir() else child.unlink()
    assert _pass_in_a_process("sat_job_spec_errors.py", jobs, first)["import_error"] == said

    assert _pass_in_a_process(job_file, jobs, replica) == {"import_error": None, "dags": 2}  # the replica builds all
    assert _kept() == {}
    install(monkeypatch)
    assert spec_problems(jobs) is None


def test_airflow_variables_store_round_trips_through_the_manager(metadata_db, monkeypatch):
    install(monkeypatch)
    store = AirflowVariables()
    store.put(variable_key("sat_jobs_07.py"), "{}")
    assert store.keys(VARIABLE_PREFIX) == [variable_key("sat_jobs_07.py")]
    assert store.get(variable_key("sat_jobs_07.py")) == "{}" and store.get(variable_key("sat_jobs_08.py")) is None
    store.delete(variable_key("sat_jobs_07.py"))
    store.delete(variable_key("sat_jobs_07.py"))  # a clean pass with nothing kept: no error
    assert store.keys(VARIABLE_PREFIX) == [] and _kept() == {}
