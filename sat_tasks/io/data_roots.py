"""Where a job may read its data and script from: the operator's data roots, never SAT's own trees (issue 44.1).

A job's `data.source` and `storage.script_url` become read grants of its training's
credentials (`io.scoped_credentials`), and staging copies them with the service's keys, so
they are authorized before anything reads them (ADR 0039):

- the data roots: `[sat] data_roots` (comma-separated `s3://bucket/prefix/`), or a
  workspace's own `[sat] data_roots_<workspace>` (its name with every character but letters
  and digits as `_`) for a job in that workspace. Set, a source must lie inside one; unset
  (`""`, the default), any prefix outside the fences below is allowed;
- the fences, whatever the roots say: every results tree the deployment knows (the job's own
  `results.destination` and those of the job specs in `[sat] jobs_dir`), except, for a job
  DAG's run, its own DAG's part `<destination>/<dag_id>/`; SAT's own trees (any key segment
  `_node-health`, `_warm-pool` or `_revoked-credentials`, and `[sat] node_ledger_uri` /
  `warm_pool_uri`); Airflow's remote task logs (`[logging] remote_base_log_folder`).

A source reaches its key and the folder of that name (`core.object_policy.grant_of`): it is
refused when that reach and a fence overlap either way (a source above a results tree reads
it too). `source_refusals` answers without reading Object Storage: Create asks whether the
data exists only for sources it allows (no existence oracle), and `validate_spec` asks again
for the person who triggered the run. Each refusal names the field and the rule.
"""

from __future__ import annotations

import configparser
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sat_tasks import config
from sat_tasks.config import sat_setting
from sat_tasks.spec import TrainingJob

DATA_ROOTS = "data_roots"
# SAT's own key segments: the node health ledger, the warm pool, credential revocations
# (io.node_ledger.LEDGER_PREFIX, io.warm_pool.WARM_PREFIX, io.scoped_credentials.REVOKED_PREFIX).
SAT_SEGMENTS = ("_node-health", "_warm-pool", "_revoked-credentials")
SAT_ROOT_SETTINGS = ("node_ledger_uri", "warm_pool_uri")
ADR = "ADR 0039"


@dataclass(frozen=True)
class SourceRefusal:
    """Why one source field may not be read: the spec field and the rule it breaks."""

    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


@dataclass(frozen=True)
class Fence:
    """A prefix no source may reach: `bucket`/`folder` (a folder ends with `/`; "" is the whole bucket)."""

    bucket: str
    folder: str
    what: str
    results: bool = False  # a results destination: a job DAG's run may read its own DAG's part

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.folder}"


def _split(uri: str) -> tuple[str, str] | None:
    if not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[len("s3://"):].partition("/")
    return (bucket, key) if bucket else None


def _as_folder(key: str) -> str:
    return key if not key or key.endswith("/") else key + "/"


def _overlaps(reach: str, folder: str) -> bool:
    return reach.startswith(folder) or folder.startswith(reach)


def data_roots(workspace: str | None = None) -> tuple[str, ...]:
    """The roots a job in `workspace` reads from: the workspace's own when set, else `[sat] data_roots`."""
    raw = ""
    if workspace:
        raw = sat_setting(DATA_ROOTS + "_" + re.sub(r"[^A-Za-z0-9]", "_", workspace), "")
    raw = raw or sat_setting(DATA_ROOTS, "")
    return tuple(root.strip() for root in raw.split(",") if root.strip())


def remote_log_folder() -> str:
    """Airflow's `[logging] remote_base_log_folder` (the environment, else the config file); "" when unset."""
    value = os.environ.get("AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER", "")
    if value:
        return value
    path = config.config_file()
    if path is None or not Path(path).is_file():
        return ""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError):
        return ""
    return os.path.expandvars(parser.get("logging", "remote_base_log_folder", fallback="") or "")


def deployment_jobs() -> dict[str, str]:
    """The job DAGs of `[sat] jobs_dir`: `{dag id (the job's name): results destination}` (a spec that does not load
    is passed over)."""
    from sat_tasks.spec import SpecError, load_spec

    jobs: dict[str, str] = {}
    for path in sorted(Path(sat_setting("jobs_dir")).glob("*.y*ml")):
        try:
            job = load_spec(path)
        except (SpecError, OSError):
            continue
        jobs[job.name] = job.results.destination
    return jobs


def fences(job: TrainingJob, jobs: dict[str, str] | None = None) -> list[Fence]:
    """Every prefix `job` may read nothing of (its DAG's own results part aside): see the module docstring."""
    jobs = deployment_jobs() if jobs is None else jobs
    found: list[Fence] = []
    for destination in sorted({job.results.destination, *jobs.values()}):
        split = _split(destination)
        if split is not None:
            found.append(Fence(split[0], _as_folder(split[1]), "the results tree", results=True))
    for setting in SAT_ROOT_SETTINGS:
        split = _split(sat_setting(setting, ""))
        if split is not None:
            found.append(Fence(split[0], _as_folder(split[1]), f"SAT's own tree ([sat] {setting})"))
    split = _split(remote_log_folder())
    if split is not None:
        found.append(Fence(split[0], _as_folder(split[1]), "Airflow's remote task logs ([logging] "
                                                           "remote_base_log_folder)"))
    return found


def source_refusals(job: TrainingJob, dag_id: str | None = None,
                    jobs: dict[str, str] | None = None) -> list[SourceRefusal]:
    """Why `job`'s data source or script may not be read by a run of DAG `dag_id` ([] when both may).

    `dag_id` None (Create, before the run exists) or a DAG that is not a job DAG (the generic
    one every creator shares): no results tree is the run's own. `jobs`: `deployment_jobs()`.
    """
    jobs = deployment_jobs() if jobs is None else jobs
    own_dag = dag_id if dag_id is not None and dag_id in jobs else None
    roots = data_roots(job.workspace)
    all_fences = fences(job, jobs)
    sources = [("data.source", job.data.source)]
    if job.storage.script_url:
        sources.append(("storage.script_url", job.storage.script_url))
    refusals = []
    for field, uri in sources:
        rule = _refusal(uri, roots, all_fences, own_dag)
        if rule is not None:
            refusals.append(SourceRefusal(field, rule))
    return refusals


def _refusal(uri: str, roots: tuple[str, ...], all_fences: list[Fence], own_dag: str | None) -> str | None:
    split = _split(uri)
    if split is None or not split[1].strip("/"):
        return f"{uri} must name a key or prefix inside a bucket (rule: a source is an s3://bucket/key URI, {ADR})"
    bucket, key = split
    reach = _as_folder(key)
    segments = set(key.split("/"))
    internal = sorted(segments & set(SAT_SEGMENTS))
    if internal:
        return (f"{uri} lies in SAT's own tree {internal[0]}/ (rule: no source inside SAT's records: the node "
                f"health ledger, the warm pool, credential revocations; {ADR})")
    for fence in all_fences:
        if fence.bucket != bucket or not _overlaps(reach, fence.folder):
            continue
        if fence.results and own_dag is not None and reach.startswith(f"{fence.folder}{own_dag}/"):
            continue  # the run's own DAG's results (a job DAG reading what an earlier run of it wrote)
        where = "lies inside" if reach.startswith(fence.folder) else "contains"
        return (f"{uri} {where} {fence.what} {fence.uri} (rule: no source inside a results tree but the run's own "
                f"DAG's, SAT's own trees or the task logs; {ADR})")
    if roots:
        inside = [root for root in roots if (_split(root) or ("", ""))[0] == bucket
                  and reach.startswith(_as_folder((_split(root) or ("", ""))[1]))]
        if not inside:
            return (f"{uri} is outside the deployment's data roots {', '.join(roots)} (rule: [sat] {DATA_ROOTS}, "
                    f"or the workspace's own; {ADR})")
    return None
