"""Generate one DAG per job spec file, keeping each bad file's problems apart from the good ones.

Every spec is read through `load_spec_cached`: the DAG files parsed in one process (a DagBag
of the folder, the API server) validate each spec once per change. The job DAGs are spread
over the `dags/sat_jobs_NN.py` files by `shards.shard_of` (ADR 0023); each builds its own
share within `parse_budget` and says which specs it skipped when it runs out. In the DAG
processor each file is parsed in a process of its own: the job DAG files leave their specs'
verdicts for `sat_job_spec_errors.py`, which validates only the specs changed since.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.airflow.parse_budget import (
    ParseBudget,
    SkipReport,
    read_reports,
    read_verdicts,
    record_pass,
    record_verdicts,
)
from sat_tasks.airflow.shards import (
    JOB_DAG_FILES,
    WATCH_DAG_FILE,
    job_dag_files,
    name_hint,
    shard_of,
    spec_paths,
)
from sat_tasks.spec import SpecError, SpecFileErrors, TrainingJob, dag_id_for
from sat_tasks.spec.loading import load_spec_cached, spec_dag_id, spec_verdicts


@dataclass
class JobDagSet:
    """What a jobs directory yields: DAGs by id, and problems by spec file."""

    dags: dict = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    jobs: dict = field(default_factory=dict)  # dag_id -> the validated TrainingJob
    paths: dict[str, Path] = field(default_factory=dict)  # dag_id -> its spec file
    skipped: list[str] = field(default_factory=list)  # spec files left unbuilt: the parse budget ran out


# Lines of bad specs' problems the import error shows (the rest counted): like the skipped files a
# report names (`parse_budget.NAMED_SKIPPED`), a message of every problem of thousands of bad specs
# would keep the errors file past the DAG processor's timeout on its way to the manager.
PROBLEM_LINES = 50


class JobDagFileErrors(SpecFileErrors):
    """Bad spec files, and SAT DAG files whose last pass ran out of time: the lines say which specs have no DAG.

    Raised by `sat_job_spec_errors.py` on every parse while a kept skip report (`parse_budget.read_reports`:
    the metadata DB in the DAG processor) says a file's last pass left specs out; the file's next pass
    that builds everything removes its report, and with it these lines.

    The message stays small whatever the numbers (`PROBLEM_LINES`, `NAMED_SKIPPED`): `errors`
    keeps every problem, each report counts every spec its pass left out, and `sat validate` lists every
    problem of the spec files.
    """

    def __init__(self, errors: dict[str, str], reports: list[SkipReport]):
        lines = str(SpecFileErrors(errors)).splitlines() if errors else []
        if len(lines) > PROBLEM_LINES + 1:
            more = f"... and {len(lines) - PROBLEM_LINES - 1} more line(s) (`sat validate` on the spec files lists them)"
            lines = [*lines[:PROBLEM_LINES + 1], more]
        if reports:
            lines.append(f"{sum(report.left_out for report in reports)} spec file(s) have no DAG from the last pass "
                         f"of {len(reports)} SAT DAG file(s) that ran out of their parse budget:")
        lines += [line for report in reports for line in report.lines()]
        ImportError.__init__(self, "\n".join(lines))
        self.errors = errors
        self.reports = reports


def _dag_kwargs(job, path: Path, fileloc: str | None) -> dict:
    return {"dag_id": dag_id_for(job), "spec_path": str(path), "fileloc": fileloc,
            "doc_md": f"Training Job **{job.name}** from `{path.name}`.\n\n```yaml\n{path.read_text()}\n```"}


def load_job_dags(jobs_dir: str | Path, fileloc: str | None = None, *, build: bool = True,
                  budget: ParseBudget | None = None, only: Callable[[str], bool] | None = None) -> JobDagSet:
    """Build a DAG for every `*.yaml`/`*.yml` spec in `jobs_dir`; a bad spec never breaks the others.

    With `build=False` the specs are only validated (no DAG objects): used to report errors.
    Files left when `budget` is spent are listed in `skipped`; `only(text)` False skips a file
    without validating it (a filter on its text).
    """
    result = JobDagSet()
    for _place, path, job, dag_id in _valid_specs(enumerate(spec_paths(jobs_dir)), result, budget, only):
        if dag_id in result.paths:
            result.errors[str(path)] = (f"{path}: name: job name {job.name!r} is already used by "
                                        f"{result.paths[dag_id]}")
            continue
        _keep(result, dag_id, job, path, build=build, fileloc=fileloc)
    return result


def _valid_specs(candidates: Iterable[tuple[int, Path]], result: JobDagSet, budget: ParseBudget | None,
                 only: Callable[[str], bool] | None = None) -> Iterator[tuple[int, Path, TrainingJob, str]]:
    """`(place, path, job, dag_id)` of each valid spec of `candidates` (place, path), in their order.

    The steps every loop over spec files shares: a file left when `budget` is spent goes to
    `result.skipped`, one whose text `only` refuses is passed over unread, a bad spec's
    problems go to `result.errors`.
    """
    for place, path in candidates:
        if budget is not None and budget.exhausted():
            result.skipped.append(str(path))
            continue
        if only is not None and not _text_passes(path, only):
            continue
        try:
            job = load_spec_cached(path)
        except SpecError as exc:
            result.errors[str(path)] = str(exc)
            continue
        yield place, path, job, dag_id_for(job)


def _keep(result: JobDagSet, dag_id: str, job: TrainingJob, path: Path, *, build: bool, fileloc: str | None) -> None:
    """Record a valid spec with a name of its own, and build its DAG (`build`)."""
    result.jobs[dag_id] = job
    result.paths[dag_id] = path
    if build:
        from sat_tasks.airflow.dag_factory import build_job_dag

        result.dags[dag_id] = build_job_dag(job, **_dag_kwargs(job, path, fileloc))


def _text_passes(path: Path, only: Callable[[str], bool]) -> bool:
    try:
        return only(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return True  # let validation report it


def _names_by_hint(paths: list[tuple[int, Path]]) -> dict[str | None, list[tuple[int, Path]]]:
    """Spec files (with their place in spec-file order) by the name their text shows (`name_hint`; None: unclear)."""
    found: dict[str | None, list[tuple[int, Path]]] = {}
    for place, path in paths:
        try:
            hint = name_hint(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # unreadable: not a valid spec
        found.setdefault(hint, []).append((place, path))
    return found


def _is_taken(name: str, before: int, by_hint: dict[str | None, list[tuple[int, Path]]]) -> bool:
    """Whether a valid spec file placed before `before` (in another shard) is named `name`: read only the candidates."""
    for place, path in sorted(by_hint.get(name, []) + by_hint.get(None, [])):
        if place >= before:
            break
        try:
            if dag_id_for(load_spec_cached(path)) == name:
                return True
        except SpecError:
            continue
    return False


def load_shard_dags(jobs_dir: str | Path, shard: int, *, shards: int = JOB_DAG_FILES, fileloc: str | None = None,
                    budget: ParseBudget | None = None) -> JobDagSet:
    """The DAGs of the specs in `shard`, built in spec-file order until `budget` is spent.

    A bad spec, or one whose name an earlier spec file (in any shard) already has, yields no
    DAG here (`sat_job_spec_errors.py` reports it). Specs left when the budget runs out are
    listed in `skipped`, logged, and kept in a report for `sat_job_spec_errors.py`.
    """
    result = JobDagSet()
    paths = spec_paths(jobs_dir)
    mine = {place for place, path in enumerate(paths) if shard_of(path.name, shards) == shard}
    by_hint = _names_by_hint([(place, path) for place, path in enumerate(paths) if place not in mine]) if mine else {}
    for place, path, job, dag_id in _valid_specs(((place, paths[place]) for place in sorted(mine)), result, budget):
        if dag_id in result.jobs or _is_taken(dag_id, place, by_hint):
            result.errors[str(path)] = f"{path}: name: job name {job.name!r} is already used by an earlier spec file"
            continue
        _keep(result, dag_id, job, path, build=True, fileloc=fileloc)
    if fileloc is not None and budget is not None:
        record_pass(jobs_dir, SkipReport(Path(fileloc).name, tuple(result.skipped), len(result.dags),
                                         round(budget.spent(), 1), round(budget.seconds, 1)))
        record_verdicts(jobs_dir, fileloc, spec_verdicts(paths))
    return result


def may_be_asset_scheduled(text: str) -> bool:
    """Whether a spec's text may schedule it on an Asset (`asset:`, or an escape that could spell it)."""
    return "asset:" in text or "\\" in text


def spec_problems(jobs_dir: str | Path, budget: ParseBudget | None = None,
                  fileloc: str = "sat_job_spec_errors.py") -> JobDagFileErrors | None:
    """What `sat_job_spec_errors.py` raises: every bad spec file, and the specs a SAT DAG file skipped; None: all is well.

    The specs this file had no time to check within `budget` are named too (under `fileloc`).
    The same rules as `load_job_dags(build=False)`, but a spec file that a job DAG file's pass
    found at its present version is not validated again (`parse_budget.read_verdicts`).
    """
    known = read_verdicts(jobs_dir)
    errors: dict[str, str] = {}
    owners: dict[str, Path] = {}
    skipped: list[str] = []
    for path in spec_paths(jobs_dir):
        if budget is not None and budget.exhausted():
            skipped.append(str(path))
            continue
        try:
            dag_id = spec_dag_id(path, known)
        except SpecError as exc:
            errors[str(path)] = str(exc)
            continue
        if dag_id in owners:
            errors[str(path)] = f"{path}: name: job name {dag_id!r} is already used by {owners[dag_id]}"
            continue
        owners[dag_id] = path
    reports = read_reports(jobs_dir, job_dag_files() | {WATCH_DAG_FILE})
    if skipped and budget is not None:
        reports.append(SkipReport(Path(fileloc).name, tuple(skipped), len(owners) + len(errors),
                                  round(budget.spent(), 1), round(budget.seconds, 1)))
    return JobDagFileErrors(errors, reports) if errors or reports else None


def asset_scheduled_jobs(jobs_dir: str | Path, fileloc: str, budget: ParseBudget) -> list:
    """The valid specs `sat_data_changes.py` watches for: only files whose text may say `asset:` are validated.

    Files left when the budget is spent are logged and reported (`sat_job_spec_errors.py` shows them).
    """
    found = load_job_dags(jobs_dir, build=False, budget=budget, only=may_be_asset_scheduled)
    record_pass(jobs_dir, SkipReport(Path(fileloc).name, tuple(found.skipped), len(found.jobs),
                                     round(budget.spent(), 1), round(budget.seconds, 1)))
    return list(found.jobs.values())
