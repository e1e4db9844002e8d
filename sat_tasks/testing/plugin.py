"""SAT's pytest plugin: tests generated from Training Job specs, and fixtures for a user's own tests of a run.

Installed with SAT (entry point `pytest11`), so pytest loads it everywhere, but it does
nothing until a repository names its spec folders, with one line of pytest configuration:

    [pytest]
    sat_specs = jobs

(or `--sat-specs jobs` on the command line; `sat test` passes that). Then, for every
`*.yaml`/`*.yml` spec under those folders it generates

- `<spec>::dag_integrity`   the spec validates, SAT's DAG files import, the DAG has the
                            tasks and attempt groups its learning type and failover imply;
- `<spec>::smoke`           an end-to-end run on the local backend, made short by the spec's
                            `test:` section (or `--sat-max-steps`, `--sat-save-steps`,
                            `--sat-data-sample`);
- `<spec>::rehearse[<scenario>@<step>]` one run per `test.rehearse` entry, checked against
                            the verdict, decision, resume step and final status SAT must reach.

Markers `sat_integrity`, `sat_smoke`, `sat_rehearsal` select them (`-m "not sat_rehearsal"`).
Fixtures: `sat_job_run(spec, rehearse=None)` returns the (shared, once per session) finished
run of a spec as a `FinishedRun`; `sat_session` is the session's private Airflow home and
Object Storage. Importing this module imports neither Airflow nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckpt_engine.contract import MAX_STEPS_ENV, SAVE_STEPS_ENV

INI = "sat_specs"
MARKERS = {
    "sat_integrity": "SAT: a spec's DAG integrity test (no run)",
    "sat_smoke": "SAT: a spec's short end-to-end run on the local backend",
    "sat_rehearsal": "SAT: a spec's failure rehearsal (a run with an injected failure)",
}
SPEC_SUFFIXES = (".yaml", ".yml")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, type="args", default=[],
                  help="SAT: folders (or files) of Training Job specs to test, relative to this file")
    group = parser.getgroup("sat", "SAT Training Job tests")
    group.addoption("--sat-specs", action="append", default=[], metavar="PATH",
                    help="folder or file of Training Job specs to test (adds to the ini's sat_specs)")
    group.addoption("--sat-max-steps", type=int, default=None, metavar="N",
                    help=f"{MAX_STEPS_ENV} for every test run (wins over the spec's test.max_steps)")
    group.addoption("--sat-save-steps", type=int, default=None, metavar="K",
                    help=f"{SAVE_STEPS_ENV}: a checkpoint every K steps (wins over test.save_steps)")
    group.addoption("--sat-data-sample", type=int, default=None, metavar="N",
                    help="test runs read only the first N data objects (wins over test.data_sample)")


def spec_locations(config: pytest.Config) -> list[Path]:
    """The configured spec folders and files, resolved (ini entries relative to the ini file)."""
    base = config.inipath.parent if config.inipath else config.rootpath
    found = [(base / entry).resolve() for entry in config.getini(INI)]
    found += [(Path(config.invocation_params.dir) / entry).resolve() for entry in config.getoption("sat_specs")]
    return list(dict.fromkeys(found))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    locations = spec_locations(config)
    if not locations:
        return  # not opted in: this plugin does nothing in this repository
    config.pluginmanager.register(SatHarness(config, locations), "sat-harness")


class SatHarness:
    """The plugin once a repository opted in: collects spec files, owns the session's runs, serves fixtures."""

    def __init__(self, config: pytest.Config, locations: list[Path]) -> None:
        from sat_tasks.testing.runs import Overrides
        from sat_tasks.testing.session import HarnessSession

        self.config = config
        self.locations = locations
        self.overrides = Overrides(max_steps=config.getoption("sat_max_steps"),
                                   save_steps=config.getoption("sat_save_steps"),
                                   data_sample=config.getoption("sat_data_sample"))
        missing = [str(p) for p in locations if not p.exists()]
        if missing:
            raise pytest.UsageError(f"sat_specs: no such folder or file: {', '.join(missing)}")
        self.session = HarnessSession()
        self.session.activate()  # before anything imports Airflow
        self._add_spec_locations_to_args(config)

    def _add_spec_locations_to_args(self, config: pytest.Config) -> None:
        """Collect the spec folders even when `testpaths` (or the directory pytest runs from) leaves them out."""
        if config.args_source is pytest.Config.ArgsSource.ARGS:
            return  # the user named what to run
        covered = [Path(arg.split("::")[0]).resolve() for arg in config.args]
        for location in self.locations:
            if not any(location == c or c in location.parents for c in covered):
                config.args.append(str(location))

    def is_spec(self, path: Path) -> bool:
        path = path.resolve()
        return path.suffix in SPEC_SUFFIXES and any(path == loc or loc in path.parents for loc in self.locations)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        if self.is_spec(file_path):
            return SpecFile.from_parent(parent, path=file_path, harness=self)
        return None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.session.close()

    def job_run(self, spec: str | Path, rehearse: str | None = None) -> Any:
        from sat_tasks.spec import load_spec
        from sat_tasks.spec.testing import Rehearsal
        from sat_tasks.testing.runs import run_spec

        path = Path(spec)
        path = path if path.is_absolute() else (self.config.rootpath / path)
        job = load_spec(path)
        rehearsal = None
        if rehearse is not None:
            listed = {r.label: r for r in (job.test.rehearse if job.test else [])}
            if rehearse in listed:
                rehearsal = listed[rehearse]
            else:
                scenario, _, step = rehearse.partition("@")
                rehearsal = Rehearsal(scenario=scenario, at_step=int(step or 0))
        return run_spec(self.session, path, job, self.overrides, rehearsal)


def _harness(request: pytest.FixtureRequest) -> SatHarness:
    harness = request.config.pluginmanager.get_plugin("sat-harness")
    if harness is None:
        pytest.fail("SAT's fixtures need spec folders: set `sat_specs = <folder>` in the pytest "
                    "configuration or pass --sat-specs", pytrace=False)
    return harness


@pytest.fixture(scope="session")
def sat_session(request: pytest.FixtureRequest) -> Any:
    """This test session's private Airflow home, metadata DB and embedded Object Storage (`HarnessSession`)."""
    return _harness(request).session


@pytest.fixture(scope="session")
def sat_job_run(request: pytest.FixtureRequest) -> Any:
    """`sat_job_run(spec, rehearse=None)`: the finished run of a spec (a `FinishedRun`), run once per session.

    `spec` is a path (relative to the rootdir, or absolute); `rehearse` a scenario label as in
    the generated test ids (`"hardware_fault@15"`), or None for the smoke run. The generated
    tests and your own share the same runs.
    """
    return _harness(request).job_run


class SpecFile(pytest.File):
    """A Training Job spec: its integrity test, its smoke test, one test per rehearsal."""

    def __init__(self, *, harness: SatHarness, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.harness = harness

    def collect(self):
        from sat_tasks.spec import SpecError, load_spec

        yield SpecItem.from_parent(self, name="dag_integrity", kind="integrity")
        try:
            job = load_spec(self.path)
        except SpecError:
            return  # the integrity test reports every problem; nothing can run
        section = job.test
        if section is None or section.smoke:
            yield SpecItem.from_parent(self, name="smoke", kind="smoke")
        for rehearsal in (section.rehearse if section else []):
            yield SpecItem.from_parent(self, name=f"rehearse[{rehearsal.label}]", kind="rehearsal",
                                       rehearsal=rehearsal)


class SpecItem(pytest.Item):
    """One generated test of a spec: `kind` is integrity, smoke or rehearsal."""

    def __init__(self, *, kind: str, rehearsal: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.rehearsal = rehearsal
        self.add_marker(f"sat_{kind}")

    def runtest(self) -> None:
        from sat_tasks.testing import checks
        from sat_tasks.testing.runs import run_spec

        harness: SatHarness = self.parent.harness
        job = checks.check_integrity(self.path)  # every kind: a run of an invalid spec would say less
        if self.kind == "smoke":
            checks.check_smoke(run_spec(harness.session, self.path, job, harness.overrides))
        elif self.kind == "rehearsal":
            run = run_spec(harness.session, self.path, job, harness.overrides, self.rehearsal)
            checks.check_rehearsal(run, self.rehearsal)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> Any:
        from sat_tasks.testing.checks import JobCheckFailed

        if isinstance(excinfo.value, JobCheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.name}"
