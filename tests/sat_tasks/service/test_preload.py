"""The scheduler and the DAG processor start with SAT's task modules imported, so what they fork inherits them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sat_tasks.config import PROJECT_ROOT
from sat_tasks.service import preload
from sat_tasks.service.stack import COMPONENTS, component_command


def test_the_components_that_fork_their_work_start_through_the_preload():
    commands = {component: component_command(component, ["--port", "1"]) for component in COMPONENTS}
    assert commands["scheduler"] == [sys.executable, "-m", "sat_tasks.service.preload", "scheduler", "--port", "1"]
    assert commands["dag-processor"][:4] == [sys.executable, "-m", "sat_tasks.service.preload", "dag-processor"]
    assert commands["api-server"] == [sys.executable, "-m", "airflow", "api-server", "--port", "1"]
    assert commands["triggerer"] == [sys.executable, "-m", "airflow", "triggerer", "--port", "1"]


def test_another_component_is_refused_with_the_usage():
    with pytest.raises(SystemExit, match=r"usage: python -m sat_tasks.service.preload \{scheduler\|dag-processor\}"):
        preload.main(["api-server"])
    with pytest.raises(SystemExit, match="usage"):
        preload.main([])


# In a fresh interpreter: what a forked task process or DAG file parse still imports after the preload.
_PROBE = """
import json, runpy, sys
from sat_tasks.service import preload
assert preload.preload()[1] == []
before = set(sys.modules)
for path in sys.argv[1:]:
    runpy.run_path(path)
import sat_tasks.pipeline.steps
from sat_tasks.io.object_storage import object_storage_hook
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("sat_tasks", "boto3", "botocore", "pydantic",
                                                                         "yaml", "s3transfer", "urllib3"))
print(json.dumps(new))
"""


def test_what_a_task_or_a_parse_imports_is_already_imported(tmp_path, monkeypatch):
    """The generic DAG's file and a job shard file parse, and the task module loads, importing none of SAT's
    modules nor boto3/botocore/pydantic anew: a task process forked from the preloaded scheduler starts with all
    of them (a module a DAG file or a task imports that the preload misses shows up here by name)."""
    dags = PROJECT_ROOT / "dags"
    done = subprocess.run([sys.executable, "-c", _PROBE, str(dags / "sat_training_job.py"), str(dags / "sat_jobs_00.py")],
                          capture_output=True, text=True, timeout=300, cwd=str(PROJECT_ROOT), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


@pytest.mark.parametrize("kind", ["local", "kubernetes"])
def test_each_backends_task_modules_import(kind):
    """What a backend names for the preload exists (the Kubernetes backend's operator brings the provider's KPO)."""
    import importlib

    from sat_tasks.backends import get_backend

    modules = get_backend(kind).task_modules
    assert modules and all(name.startswith(f"sat_tasks.backends.{kind}.") for name in modules)
    for name in modules:
        importlib.import_module(name)


def test_what_cannot_be_imported_is_named_and_airflow_still_runs(monkeypatch, capsys):
    """A module that fails to import (or a configured backend that is not installed) is named on the
    component's log; the component starts all the same (its tasks meet the error in their own logs)."""
    import sat_tasks.backends

    def no_backend(job):
        raise ValueError("'nomad' is not a valid BackendKind")

    monkeypatch.setattr(sat_tasks.backends, "backend_for", no_backend)
    seconds, failed = preload.preload(("json", "sat_tasks.no_such_module"))
    assert seconds >= 0 and len(failed) == 2
    assert failed[0].startswith("sat_tasks.no_such_module: ModuleNotFoundError")
    assert failed[1] == "the configured backend: ValueError: 'nomad' is not a valid BackendKind"
    ran = []
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main sets Airflow's argv: restored after the test
    monkeypatch.setattr(preload, "preload", lambda: (0.5, ["x: ImportError: broken"]))
    monkeypatch.setattr("airflow.__main__.main", lambda: ran.append(list(sys.argv)))
    preload.main(["scheduler", "--num-runs", "1"])
    assert ran == [["airflow", "scheduler", "--num-runs", "1"]]
    err = capsys.readouterr().err
    assert "SAT's task modules imported in 0.50s" in err
    assert "[sat] scheduler: not preloaded (its tasks import it themselves): x: ImportError: broken" in err
