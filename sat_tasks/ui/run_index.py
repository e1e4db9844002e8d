"""The Training Jobs list's query layer: an index table of SAT's own in the metadata DB, kept in step, and queried.

ADR 0022 (and 0033: GPU-hours, columns added in place). Call order, per list request (`sat_tasks.ui.routers.jobs`):

1. `ensure_table(session)`: `sat_job_index` exists (created once per process, if missing);
2. `sync(session, jobs, ...)`: the index follows Airflow and the pipeline: new `sat_summary`
   XComs (per run: a run whose summaries are newer or more than the row merged has them all merged
   again, in time order, whatever order they were committed in), changed DAG-run columns, runs not
   indexed yet, runs whose validate_spec recorded their job since (`spec_at`: the row's job and
   `listed` are taken from that record), deleted runs. Only a run that ended (seen ending, or
   first seen already ended), or that predates the index, is read from Object Storage (once):
   its last checkpoint, and its status when the pipeline did not say it;
3. `list_runs(session, query, dag_ids, ...)`: one count and one page query over every run,
   filtered and sorted in SQL, and GPU- and node-hours per workspace in one `GROUP BY`
   (`usage_by_workspace`, which the Workspaces page asks over every run too).

The job page asks `run_facts(session, run)`: who created the run, its queue time and the goodput
`finalize` published (the metadata DB only).

`SpecCache` parses each spec file once per change (path, mtime, size); the list's (`SPECS`) stats the
jobs directory alone between rechecks (issue 48.5: a request's cost does not grow with the number of
specs). `parse_query` turns a request's query string into a `ListQuery`, or a `ListQueryError`
naming the field and rule.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from time import monotonic, time_ns
from typing import Any

from airflow.models.dag import DagModel, DagTag
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XCOM_RETURN_KEY, XComModel
from airflow.utils.sqlalchemy import UtcDateTime
from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    case,
    delete,
    exists,
    false,
    func,
    insert,
    inspect,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError

from sat_tasks.backends.launch import SPEC_TASK_ID
from sat_tasks.core.run_summary import (
    SUMMARY_KEY,
    RunSummary,
    running_seconds,
    short_node_seconds,
    summarize_history,
    usage,
)
from sat_tasks.core.status import TERMINAL, JobStatus
from sat_tasks.errors import SatError
from sat_tasks.io.run_layout import RunLayout
from sat_tasks.spec import SpecError, TrainingJob, dag_id_for, load_spec
from sat_tasks.ui import dag_runs, waits
from sat_tasks.ui.jobs import ReadJson, job_of, read_history, read_progress

log = logging.getLogger(__name__)

TABLE_NAME = "sat_job_index"
# The tag every SAT DAG has (`airflow.dag_factory.build_dag`): the index's sync finds their runs by it.
JOB_DAG_TAG = "training-job"
TERMINAL_WORDS = frozenset(status.value for status in TERMINAL)
TERMINAL_STATES = ("success", "failed")
PER_PAGE = 50
MAX_PER_PAGE = 200
# What the status is while the pipeline has said nothing (or could not), by DAG-run state.
STATUS_BEFORE_HISTORY = {"queued": JobStatus.PENDING.value, "running": JobStatus.PENDING.value,
                         "failed": JobStatus.FAILED.value, "success": JobStatus.COMPLETED.value}

metadata = MetaData()
INDEX = Table(
    TABLE_NAME, metadata,
    Column("dag_id", String(250), primary_key=True),
    Column("run_id", String(250), primary_key=True),
    Column("listed", Boolean, nullable=False, default=True),  # False: not a Training Job's run (no valid spec)
    Column("job", String(250), nullable=False, default=""),
    Column("learning_type", String(32)),
    Column("framework", String(32)),
    Column("nodes", Integer, nullable=False, default=0),
    Column("gpus_per_node", Integer, nullable=False, default=0),
    Column("workspace", String(250)),
    Column("creator", String(250)),
    Column("tags", Text, nullable=False, default="{}"),  # JSON object
    Column("tags_text", Text, nullable=False, default="\n"),  # "\nkey=value\n...": what the tag filter matches
    Column("schedule", String(500)),
    Column("results", Text),
    Column("status", String(64), nullable=False, default=JobStatus.PENDING.value),
    Column("status_at", String(64)),
    Column("attempt", Integer),
    Column("last_checkpoint_step", Integer),
    Column("run_state", String(32)),
    Column("submitted_at", UtcDateTime),
    Column("queued_at", UtcDateTime),
    Column("start_date", UtcDateTime),
    Column("end_date", UtcDateTime),
    Column("running_s", Float, nullable=False, default=0.0),
    Column("running_since", UtcDateTime),
    Column("goodput", Float),
    Column("summary_at", UtcDateTime),  # the newest `sat_summary` XCom applied
    # Added after the first release (ADR 0033): nullable, so `ensure_table` can add them to an existing table.
    Column("short_node_s", Float, default=0.0),  # node-seconds elastic attempts ran without (closed intervals)
    Column("running_short_nodes", Integer, default=0),  # nodes the open interval's attempt runs without
    Column("spec_at", UtcDateTime),  # the validate_spec XCom the row's job (and `listed`) was taken from; NULL: none
    Column("summary_n", Integer),  # how many `sat_summary` XComs of the run were merged into the row (issue 45.2)
    Index("idx_sat_job_index_submitted", "submitted_at"),
    Index("idx_sat_job_index_status", "status"),
    Index("idx_sat_job_index_job", "job"),
    Index("idx_sat_job_index_workspace", "workspace"),
)
C = INDEX.c

_created: set[str] = set()
_create_lock = threading.Lock()


def ensure_table(session: Any) -> None:
    """Create `sat_job_index` (and its indexes) when this DB has none, or add the columns an older SAT's table
    lacks (ADR 0033); once per process and DB."""
    bind = session.get_bind()
    key = str(bind.url)
    if key in _created:
        return
    with _create_lock:
        if key not in _created:
            metadata.create_all(bind=bind, checkfirst=True)
            add_missing_columns(bind)
            _created.add(key)


def add_missing_columns(bind: Any) -> list[str]:
    """`ALTER TABLE ... ADD COLUMN` for each column of `INDEX` the table in `bind`'s DB lacks; the names added.

    Idempotent: a column there is left alone, and one another API server added meanwhile (its
    ALTER won the race) counts as there. Only nullable columns are added this way (a table with
    rows cannot take a NOT NULL column without a default on every dialect): new columns are
    nullable and the queries read NULL as their default.
    """
    missing = [column for column in INDEX.c if column.name not in _columns(bind)]
    added = []
    for column in missing:
        if not column.nullable:
            raise RuntimeError(f"{TABLE_NAME}.{column.name}: a column added after the first release must be nullable")
        preparer = bind.dialect.identifier_preparer
        statement = (f"ALTER TABLE {preparer.quote(TABLE_NAME)} ADD COLUMN {preparer.quote(column.name)} "
                     f"{column.type.compile(dialect=bind.dialect)}")
        try:
            with bind.begin() as connection:
                connection.exec_driver_sql(statement)
            added.append(column.name)
        except DBAPIError:
            if column.name not in _columns(bind):  # not a lost race: a real failure
                raise
    return added


def _columns(bind: Any) -> set[str]:
    return {column["name"] for column in inspect(bind).get_columns(TABLE_NAME)}


# ---- specs, parsed once per file change ------------------------------------------------------------
# How long the spec cache answers from the jobs directory's own mtime before it looks at each file again (issue
# 48.5): a file added, removed or renamed (an editor's save, `git pull`) changes the directory and counts at once;
# a file rewritten in place changes only itself and counts within this many seconds.
SPEC_RECHECK_S = 5.0
# A directory whose mtime is this close to the last look may change again within the same mtime tick unseen
# (git's "racy" index entries): the cache looks at each file until it is older than that.
RACY_NS = 2_000_000_000


class SpecCache:
    """The job DAGs' specs by DAG id from a jobs directory; a file is parsed again only when its mtime or size changes.

    As `load_job_dags(build=False)`: files in name order, a bad file left out, a second
    file with a name already used left out.

    `recheck_s` > 0 (the list's `SPECS`, issue 48.5): a call costs one `stat` of the directory, not one per
    file, while the directory's mtime is the one of the last full look, that look is less than `recheck_s` old,
    and the directory had not changed just before it; otherwise each file is looked at (and parsed when changed).
    0: each call looks at each file.
    """

    def __init__(self, load: Callable[[Path], TrainingJob] = load_spec, *, recheck_s: float = 0.0,
                 clock: Callable[[], float] = monotonic, wall_ns: Callable[[], int] = time_ns) -> None:
        self._load = load
        self._recheck_s = recheck_s
        self._clock, self._wall_ns = clock, wall_ns
        self._files: dict[str, tuple[tuple[int, int], TrainingJob | None]] = {}
        self._lock = threading.Lock()
        # the last full look: (directory, its mtime then, when, whether racy) and its answer
        self._looked: tuple[str, int, float, bool] | None = None
        self._found: dict[str, TrainingJob] = {}
        self.full_looks = 0  # how many calls looked at each file (the tests count them)

    def jobs(self, jobs_dir: str | Path) -> dict[str, TrainingJob]:
        directory = os.fspath(jobs_dir)
        try:
            dir_mtime = os.stat(directory).st_mtime_ns
        except OSError:
            dir_mtime = -1
        with self._lock:
            looked, found = self._looked, self._found
        if (looked is not None and self._recheck_s > 0 and looked[0] == directory and looked[1] == dir_mtime
                and not looked[3] and self._clock() - looked[2] < self._recheck_s):
            return dict(found)
        return self._look(directory, dir_mtime)

    def _look(self, directory: str, dir_mtime: int) -> dict[str, TrainingJob]:
        """Look at each spec file of `directory` (parse the new and changed ones); keep the answer."""
        started, wall = self._clock(), self._wall_ns()
        keys: dict[str, tuple[int, int]] = {}
        try:
            entries = list(os.scandir(directory))
        except OSError:
            entries = []
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, "*.y*ml"):
                continue
            try:
                stat = entry.stat()  # follows a link, as Path.stat
            except OSError:
                continue
            keys[entry.path] = (stat.st_mtime_ns, stat.st_size)
        paths = sorted(keys)  # one directory: the path order is the name order (`spec_paths`)
        with self._lock:
            files = dict(self._files)
        # Parsed outside the lock (issue 44.6): one slow file holds up no other request.
        for path in paths:
            cached = files.get(path)
            if cached is None or cached[0] != keys[path]:
                try:
                    files[path] = (keys[path], self._load(Path(path)))
                except (SpecError, OSError):
                    files[path] = (keys[path], None)
        found: dict[str, TrainingJob] = {}
        for path in paths:
            job = files[path][1]
            if job is not None and dag_id_for(job) not in found:
                found[dag_id_for(job)] = job
        with self._lock:
            self._files.update({path: files[path] for path in paths})
            for gone in set(self._files) - set(keys):
                del self._files[gone]
            self._looked = (directory, dir_mtime, started, dir_mtime < 0 or wall - dir_mtime < RACY_NS)
            self._found = found
            self.full_looks += 1
        return dict(found)


SPECS = SpecCache(recheck_s=SPEC_RECHECK_S)


# ---- the list's query --------------------------------------------------------------------------------
class ListQueryError(SatError, ValueError):
    """A query parameter breaks its rule (`field`, `rule`)."""

    def __init__(self, name: str, rule: str) -> None:
        super().__init__(f"{name}: {rule}")
        self.field = name
        self.rule = rule


SORTS = ("started", "submitted", "job", "status", "ended", "queue", "gpu_hours", "creator", "workspace",
         "framework", "learning_type", "attempt")
FILTERS = ("status", "q", "tag", "framework", "learning_type", "workspace", "creator")


@dataclass(frozen=True)
class ListQuery:
    """What a person asked of the list: filters (None: any), the sort column and order, the page."""

    status: str | None = None
    q: str | None = None  # a part of the job's name or run id
    tag: str | None = None  # `key` or `key=value`
    framework: str | None = None
    learning_type: str | None = None
    workspace: str | None = None
    creator: str | None = None
    since: datetime | None = None  # submitted at or after
    until: datetime | None = None  # submitted before
    sort: str = "started"  # newest first: runs not started yet on top, then the latest start
    order: str = "desc"
    page: int = 1
    per_page: int = PER_PAGE

    def params(self, **changes: Any) -> dict[str, str]:
        """The query string's parameters for this query with `changes` (links: other page, other sort)."""
        query = replace(self, **changes)
        out = {name: getattr(query, name) for name in FILTERS if getattr(query, name)}
        for name in ("since", "until"):
            if getattr(query, name) is not None:
                out[name] = getattr(query, name).isoformat()
        if query.sort != "started" or query.order != "desc":
            out.update(sort=query.sort, order=query.order)
        if query.page != 1:
            out["page"] = query.page
        if query.per_page != PER_PAGE:
            out["per_page"] = query.per_page
        return {key: str(value) for key, value in out.items()}


def _time_param(name: str, value: str, *, end_of_day: bool) -> datetime:
    try:
        if len(value) == 10:
            day = date.fromisoformat(value)
            return datetime.combine(day + timedelta(days=1) if end_of_day else day, time(), tzinfo=UTC)
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ListQueryError(name, "must be a date (YYYY-MM-DD) or an ISO 8601 time") from None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _int_param(name: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ListQueryError(name, f"must be a whole number between {low} and {high}") from None
    if not low <= number <= high:
        raise ListQueryError(name, f"must be a whole number between {low} and {high}")
    return number


def parse_query(params: Mapping[str, str]) -> ListQuery:
    """The list query in a request's parameters (empty ones mean "any"); a bad one raises `ListQueryError`."""
    values = {name: value.strip() for name, value in params.items() if isinstance(value, str) and value.strip()}
    found: dict[str, Any] = {name: values[name][:250] for name in FILTERS if name in values}
    if "status" in found and found["status"] not in {s.value for s in JobStatus}:
        raise ListQueryError("status", "must be one of " + ", ".join(s.value for s in JobStatus))
    if "since" in values:
        found["since"] = _time_param("since", values["since"], end_of_day=False)
    if "until" in values:
        found["until"] = _time_param("until", values["until"], end_of_day=True)
    if "since" in found and "until" in found and found["since"] >= found["until"]:  # no run could match (issue 45.6)
        raise ListQueryError("until", f"the start ({values['since']}) is after the end ({values['until']}): "
                                      "no run can match; swap them")
    if "sort" in values:
        if values["sort"] not in SORTS:
            raise ListQueryError("sort", "must be one of " + ", ".join(SORTS))
        found["sort"] = values["sort"]
    if "order" in values:
        if values["order"] not in ("asc", "desc"):
            raise ListQueryError("order", "must be asc or desc")
        found["order"] = values["order"]
    if "page" in values:
        found["page"] = _int_param("page", values["page"], 1, 1_000_000)
    if "per_page" in values:
        found["per_page"] = _int_param("per_page", values["per_page"], 1, MAX_PER_PAGE)
    return ListQuery(**found)


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# (dag_id, creators): of that DAG's runs, only those the creators triggered are shown (the generic DAG's, ADR 0043)
Owners = tuple[str, frozenset[str]]


def _owned(owners: Owners | None) -> list[Any]:
    if owners is None:
        return []
    dag_id, names = owners
    return [or_(C.dag_id != dag_id, C.creator.in_(sorted(names)))]


def creators(session: Any, dag_id: str) -> set[str]:
    """Who triggered the indexed runs of `dag_id` (the owners of the generic DAG's runs, ADR 0043)."""
    return {value for (value,) in session.execute(
        select(C.creator).where(C.dag_id == dag_id, C.creator.is_not(None)).distinct())}


def _scope(session: Any, dag_ids: set[str]) -> list[Any]:
    """The listed rows of `dag_ids`, as clauses whose size does not grow with `dag_ids` (issue 48.5).

    `dag_ids` is every Training Job DAG the person may read, a spec file's worth each (2,000 specs: an `IN` of
    2,000 names in each query, its expansion and binding a third of the request); only the DAGs with indexed
    runs are named: `IN` those of them in `dag_ids`. Never `NOT IN` the others: a row of another DAG indexed
    meanwhile (another server's sync, READ COMMITTED) would then show.
    """
    indexed = set(session.scalars(select(C.dag_id).where(C.listed.is_(True)).distinct()))
    inside = sorted(indexed & dag_ids)
    return [C.listed.is_(True), C.dag_id.in_(inside) if inside else false()]


def _where(query: ListQuery, scope: list[Any], owners: Owners | None = None) -> list[Any]:
    clauses: list[Any] = [*scope, *_owned(owners)]
    for name in ("status", "framework", "learning_type", "workspace", "creator"):
        if getattr(query, name):
            clauses.append(C[name] == getattr(query, name))
    if query.q:
        pattern = f"%{_like(query.q)}%"
        clauses.append(or_(C.job.ilike(pattern, escape="\\"), C.run_id.ilike(pattern, escape="\\")))
    if query.tag:  # `key=value`: that pair; `key`: any value
        pattern = f"%\n{_like(query.tag)}\n%" if "=" in query.tag else f"%\n{_like(query.tag)}=%"
        clauses.append(C.tags_text.like(pattern, escape="\\"))
    if query.since is not None:
        clauses.append(C.submitted_at >= query.since)
    if query.until is not None:
        clauses.append(C.submitted_at < query.until)
    return clauses


# Node-seconds in Running (closed intervals): nodes x time, less what elastic attempts ran without (NULL: none).
_NODE_SECONDS = C.running_s * C.nodes - func.coalesce(C.short_node_s, 0.0)
_GPU_SECONDS = _NODE_SECONDS * C.gpus_per_node
_SORT_COLUMNS = {"submitted": C.submitted_at, "job": C.job, "status": C.status, "started": C.start_date,
                 "ended": C.end_date, "gpu_hours": _GPU_SECONDS, "creator": C.creator, "workspace": C.workspace,
                 "framework": C.framework, "learning_type": C.learning_type, "attempt": C.attempt,
                 "queue": C.queued_at}


@dataclass
class JobsPage:
    """One page of the list: its rows, how many runs match, and GPU-/node-hours per workspace over every match.

    `usage_by_workspace`: workspace ("" for none) -> `gpu_hours`, `node_hours`, `runs`;
    `gpu_hours_by_workspace` is its GPU-hours alone (the API's field since ADR 0022).
    """

    rows: list[dict[str, Any]]
    total: int
    query: ListQuery
    usage_by_workspace: dict[str, dict[str, float]] = field(default_factory=dict)
    readable: set[str] = field(default_factory=set)  # the DAG ids the person may read (the filter menus' scope)
    owners: Owners | None = None  # of the generic DAG, whose runs the person may see (None: everyone's)

    @property
    def gpu_hours_by_workspace(self) -> dict[str, float]:
        return {name: used["gpu_hours"] for name, used in self.usage_by_workspace.items()}

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.per_page))

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": self.rows, "total": self.total, "page": self.query.page, "per_page": self.query.per_page,
                "pages": self.pages, "sort": self.query.sort, "order": self.query.order,
                "gpu_hours_by_workspace": self.gpu_hours_by_workspace, "usage_by_workspace": self.usage_by_workspace}


def list_runs(session: Any, query: ListQuery, dag_ids: set[str], *, now: datetime | None = None,
              next_runs: Mapping[str, datetime | None] | None = None, owners: Owners | None = None) -> JobsPage:
    """The page `query` asks for, over every indexed run of `dag_ids` (the DAGs the person may read; of the
    `owners` DAG, the runs its creators triggered)."""
    now = now or datetime.now(UTC)
    where = _where(query, _scope(session, dag_ids), owners)
    total = session.execute(select(func.count()).select_from(INDEX).where(*where)).scalar_one()
    column = _SORT_COLUMNS[query.sort]
    ordered = column.asc() if query.order == "asc" else column.desc()
    # A time not there yet (not started, not ended) is the newest: first when newest first, else last; any
    # other missing value last either way. Then newest submitted first, then a stable tie-break.
    missing = case((column.is_(None), 1), else_=0)
    missing = missing.desc() if query.sort in ("started", "ended") and query.order == "desc" else missing.asc()
    statement = (select(INDEX).where(*where)
                 .order_by(missing, ordered, C.submitted_at.desc(), C.run_id.desc())
                 .limit(query.per_page).offset((query.page - 1) * query.per_page))
    rows = [row_of(record._mapping, now=now, next_run=(next_runs or {}).get(record.dag_id))
            for record in session.execute(statement)]
    note_waits(session, rows)
    return JobsPage(rows, total, query, _usage(session, where, now))


def note_waits(session: Any, rows: list[dict[str, Any]]) -> None:
    """Each row's `waiting`: why its run waits, at every stage (`ui.waits`, issue 45.5); None when it does not."""
    lines = _waiting_lines(session, waits.keys_of(rows))
    for row in rows:
        row["waiting"] = lines.get((row["dag_id"], row["run_id"]))


def _waiting_lines(session: Any, keys: list[waits.RunKey]) -> dict[tuple[str, str], str]:
    """`waits.waiting_lines`, in a savepoint: a query that fails leaves the list (and its transaction) answering."""
    if not keys:
        return {}
    try:
        with session.begin_nested():
            return waits.waiting_lines(session, keys)
    except DBAPIError as exc:
        log.warning("why the runs wait could not be read: %s: %s", type(exc).__name__, exc)
        return {}


def usage_by_workspace(session: Any, dag_ids: set[str], *, now: datetime | None = None) -> dict[str, dict[str, float]]:
    """GPU-hours, node-hours and the number of runs per workspace ("" for none) over every indexed run of `dag_ids`.

    Every attempt's time in `Running` counts (failovers included); a run that runs now adds
    its open interval up to `now`. The Workspaces page's totals (the list's are over its filter).
    """
    return _usage(session, _scope(session, dag_ids), now or datetime.now(UTC))


def _usage(session: Any, where: list[Any], now: datetime) -> dict[str, dict[str, float]]:
    """The closed running time summed in one `GROUP BY`, then the open intervals of the running rows."""
    totals: dict[str, dict[str, float]] = {}
    grouped = (select(C.workspace, func.sum(_GPU_SECONDS), func.sum(_NODE_SECONDS), func.count())
               .where(*where).group_by(C.workspace))
    for workspace, gpu_seconds, node_seconds, runs in session.execute(grouped):
        totals[workspace or ""] = {"gpu_hours": (gpu_seconds or 0.0) / 3600.0,
                                   "node_hours": (node_seconds or 0.0) / 3600.0, "runs": runs}
    live = (select(C.workspace, C.nodes, C.gpus_per_node, C.running_since, C.running_short_nodes)
            .where(*where, C.running_since.is_not(None)))
    for workspace, nodes, gpus, since, short in session.execute(live):
        node_s = max(0, (nodes or 0) - (short or 0)) * running_seconds(0.0, _aware(since), now)
        used = totals.setdefault(workspace or "", {"gpu_hours": 0.0, "node_hours": 0.0, "runs": 0})
        used["gpu_hours"] += node_s * (gpus or 0) / 3600.0
        used["node_hours"] += node_s / 3600.0
    return {name: {"gpu_hours": round(used["gpu_hours"], 3), "node_hours": round(used["node_hours"], 3),
                   "runs": int(used["runs"])} for name, used in sorted(totals.items())}


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _stamp(value: Any) -> datetime | None:
    """An ISO time as a summary carries it (naive: UTC); None when it is not one."""
    try:
        return _aware(datetime.fromisoformat(value))
    except (TypeError, ValueError):
        return None


def _iso(value: datetime | None) -> str | None:
    return _aware(value).isoformat() if value is not None else None


def _queue_seconds(queued: datetime | None, start: datetime | None) -> float | None:
    """How long a run waited between queued and started (None until it started)."""
    return round((start - queued).total_seconds(), 1) if start and queued and start >= queued else None


def row_of(record: Mapping[str, Any], *, now: datetime, next_run: datetime | None = None) -> dict[str, Any]:
    """A list row (the API's item, the page's row) from an index record; durations up to `now` while it runs."""
    start, end, queued = _aware(record["start_date"]), _aware(record["end_date"]), _aware(record["queued_at"])
    since = _aware(record["running_since"])
    # A job whose status ended (Stopped, Completed) while its DAG run still wraps up ran until that status.
    finished = _stamp(record["status_at"]) if end is None and record["status"] in TERMINAL_WORDS else None
    seconds = running_seconds(record["running_s"] or 0.0, since, now)
    tags = json.loads(record["tags"] or "{}")
    return {
        "job": record["job"], "dag_id": record["dag_id"], "run_id": record["run_id"], "run_state": record["run_state"],
        "learning_type": record["learning_type"], "framework": record["framework"], "nodes": record["nodes"],
        "gpus_per_node": record["gpus_per_node"], "status": record["status"], "status_at": record["status_at"],
        "attempt": record["attempt"], "last_checkpoint_step": record["last_checkpoint_step"],
        "creator": record["creator"], "workspace": record["workspace"],
        "submitted": _iso(record["submitted_at"]), "queued": _iso(queued), "started": _iso(start), "ended": _iso(end),
        "queue_s": _queue_seconds(queued, start),
        "duration_s": round(((end or finished or now) - start).total_seconds(), 1) if start else None,
        "running": end is None and finished is None and record["run_state"] in ("queued", "running"),
        "running_s": round(seconds, 1), "running_since": _iso(since),
        **usage(record["nodes"], record["gpus_per_node"], seconds, short_node_seconds(
            record["short_node_s"] or 0.0, record["running_short_nodes"] or 0, since, now)),
        "goodput": record["goodput"], "tags": tags if isinstance(tags, dict) else {},
        "schedule": record["schedule"], "next_run": _iso(next_run), "results": record["results"],
        "grid": f"/dags/{record['dag_id']}/runs/{record['run_id']}",
    }


# ---- keeping the index in step -------------------------------------------------------------------
@dataclass
class SyncCounts:
    """What one `sync` did (the benchmark and the tests read it)."""

    added: int = 0
    summaries: int = 0
    changed: int = 0
    read_from_storage: int = 0
    removed: int = 0
    validated: int = 0  # rows whose job was taken again from the spec their run validated since


def _tags_fields(tags: Mapping[str, Any]) -> dict[str, str]:
    clean = {str(k): str(v) for k, v in tags.items()}
    return {"tags": json.dumps(clean, sort_keys=True),
            "tags_text": "\n" + "".join(f"{k}={v}\n" for k, v in sorted(clean.items()))}


def _summary_fields(summary: RunSummary) -> dict[str, Any]:
    fields: dict[str, Any] = {"running_s": summary.running_s,
                              "running_since": datetime.fromisoformat(summary.running_since)
                              if summary.running_since else None,
                              "short_node_s": summary.short_node_s, "running_short_nodes": summary.running_short_nodes}
    if summary.status is not None:
        fields.update(status=summary.status, status_at=summary.status_at)
    if summary.attempt is not None:
        fields["attempt"] = summary.attempt
    return fields


def closed_at_end(running_s: float | None, running_since: datetime | str | None, short_node_s: float | None,
                  running_short_nodes: int | None, end: datetime | None) -> dict[str, Any]:
    """The running-time fields of a run that ended while its history still said `Running` (a DAG run a person
    marked failed, a task that could not write the end): the open interval counts up to the run's end."""
    since = _aware(datetime.fromisoformat(running_since) if isinstance(running_since, str) else running_since)
    closed, short = running_s or 0.0, short_node_s or 0.0
    if since is not None and end is not None:
        closed = running_seconds(closed, since, _aware(end))
        short = short_node_seconds(short, running_short_nodes or 0, since, _aware(end))
    return {"running_s": round(closed, 3), "running_since": None, "short_node_s": round(short, 3),
            "running_short_nodes": 0}


def _from_published(value: Any) -> dict[str, Any]:
    """The index fields in a `sat_summary` XCom (a whole summary, or finalize's `{"goodput": x}`)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    fields: dict[str, Any] = {}
    if "status" in value:
        fields.update(_summary_fields(RunSummary.from_dict(value)))
    goodput = value.get("goodput")
    if isinstance(goodput, (int, float)) and not isinstance(goodput, bool):
        fields["goodput"] = float(goodput)
    return fields


def _from_storage(job: TrainingJob, run_id: str, read_json: ReadJson, *, history: bool = True) -> dict[str, Any]:
    """What Object Storage says of a run (its status history unless not asked, progress, edited tags): 2-3 reads."""
    layout = RunLayout(job, run_id)
    fields: dict[str, Any] = {}
    entries = read_history(read_json, layout.status_uri) if history else []
    if entries:
        fields.update(_summary_fields(summarize_history(entries)))
    fields["last_checkpoint_step"] = read_progress(read_json, layout.progress_uri).last_committed_step
    edited = read_json(layout.tags_uri)
    if isinstance(edited, dict):
        fields.update(_tags_fields(edited))
    return fields


def creator_of(run: Any) -> str | None:
    """Who created a DAG run: the person who triggered it, else `schedule` or `asset`."""
    if run.triggering_user_name:
        return run.triggering_user_name
    kind = str(getattr(run.run_type, "value", run.run_type))
    return {"scheduled": "schedule", "asset_triggered": "asset"}.get(kind)


def _new_record(run: Any, jobs: Mapping[str, TrainingJob], generic_dag_id: str,
                validated: dict[str, Any] | None) -> tuple[dict[str, Any], TrainingJob | None]:
    state = dag_runs.run_state(run)
    job = job_of(dag_runs.run_ref(run, validated=validated), dict(jobs), generic_dag_id)
    record: dict[str, Any] = {
        "dag_id": run.dag_id, "run_id": run.run_id, "listed": job is not None, "run_state": state,
        "creator": creator_of(run), "queued_at": run.queued_at, "start_date": run.start_date, "end_date": run.end_date,
        "submitted_at": run.queued_at or run.run_after or run.start_date,
        "status": STATUS_BEFORE_HISTORY.get(state, JobStatus.PENDING.value), "running_s": 0.0,
        **_tags_fields(job.tags if job else {}),
    }
    if job is not None:
        record.update(_job_fields(job, run.run_id))
    return record, job


def _job_fields(job: TrainingJob, run_id: str) -> dict[str, Any]:
    """The index columns that come from the run's job."""
    return {"job": job.name, "learning_type": job.learning_type.value, "framework": job.framework.value,
            "nodes": job.nodes, "gpus_per_node": job.resources.gpus_per_node, "workspace": job.workspace,
            "schedule": job.schedule, "results": RunLayout(job, run_id).results_uri}


_SPEC_XCOM = and_(XComModel.task_id == SPEC_TASK_ID, XComModel.key == XCOM_RETURN_KEY, XComModel.map_index == -1)


def _spec_stamps(session: Any, runs: list[Any]) -> dict[int, datetime]:
    """When validate_spec recorded each of `runs`' job (its XCom's time), by DagRun.id; runs not validated: absent."""
    if not runs:
        return {}
    return dict(session.execute(select(XComModel.dag_run_id, XComModel.timestamp).where(
        _SPEC_XCOM, XComModel.dag_run_id.in_([run.id for run in runs]))).all())


def _revalidated(session: Any, jobs: Mapping[str, TrainingJob], generic_dag_id: str, joined: Any,
                 read: ReadJson, counts: SyncCounts) -> None:
    """Rows whose run validated its spec after they were indexed take their job, and whether they are listed, from
    that record (ADR 0024): a run the index first saw without it (its short conf did not parse, its spec file
    changed) shows what ran. A row that becomes listed after its run ended reads its records once."""
    stale = session.execute(
        select(C.listed, C.status, DagRun, XComModel.timestamp).join(DagRun, joined)
        .join(XComModel, XComModel.dag_run_id == DagRun.id)
        .where(_SPEC_XCOM, or_(C.spec_at.is_(None), C.spec_at < XComModel.timestamp))).all()
    if not stale:
        return
    validated = dag_runs.validated_specs(session, [run for _, _, run, _ in stale])
    for listed, status, run, stamp in stale:
        job = job_of(dag_runs.run_ref(run, validated=validated.get(run.id)), dict(jobs), generic_dag_id)
        fields: dict[str, Any] = {"spec_at": stamp, "listed": job is not None}
        if job is not None:
            fields.update(_job_fields(job, run.run_id))
            if not listed:  # its tags were the empty ones of a row without a job (none could edit them)
                fields.update(_tags_fields(job.tags))
                if dag_runs.run_state(run) in TERMINAL_STATES:  # ended unlisted: nothing read its records
                    fields.update(_from_storage(job, run.run_id, read, history=status not in TERMINAL_WORDS))
                    counts.read_from_storage += 1
        session.execute(update(INDEX).where(C.dag_id == run.dag_id, C.run_id == run.run_id).values(**fields))
        counts.validated += 1


@dataclass(frozen=True)
class Published:
    """A run's `sat_summary` XComs merged in time order: the newest one's time, how many, the index fields."""

    newest: datetime
    count: int
    fields: dict[str, Any]


def _latest_summaries(session: Any, where: Any) -> dict[tuple[str, str], Published]:
    """The `sat_summary` XComs matching `where`, merged per run in time order."""
    merged: dict[tuple[str, str], Published] = {}
    statement = (select(XComModel.dag_id, XComModel.run_id, XComModel.value, XComModel.timestamp)
                 .where(XComModel.key == SUMMARY_KEY, where).order_by(XComModel.timestamp))
    for dag_id, run_id, value, stamp in session.execute(statement):
        before = merged.get((dag_id, run_id))
        merged[(dag_id, run_id)] = Published(stamp, (before.count if before else 0) + 1,
                                             {**(before.fields if before else {}), **_from_published(value)})
    return merged


_RUNNING_FIELDS = ("running_s", "running_since", "short_node_s", "running_short_nodes")


def _ended_fields(job: TrainingJob | None, run: Any, read: ReadJson, status: str | None,
                  current: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a run that ended: its last checkpoint (and, unless `status` is already an end, its status) from
    Object Storage, and an interval still open in `current` closed at the run's end (it trains no more)."""
    fields = _from_storage(job, run.run_id, read, history=status not in TERMINAL_WORDS) if job is not None else {}
    if "status" not in fields and status not in TERMINAL_WORDS:
        fields["status"] = STATUS_BEFORE_HISTORY[dag_runs.run_state(run)]
    fields.update(closed_at_end(**{name: fields.get(name, current.get(name)) for name in _RUNNING_FIELDS},
                                end=run.end_date))
    return fields


def _apply_summaries(session: Any, joined: Any, counts: SyncCounts) -> None:
    """Merge every summary of each run whose `sat_summary` XComs are newer than, or not as many as, its row merged
    (a per-run marker: an XCom committed late, with an older time than others already applied, still counts)."""
    mine = (select(XComModel.dag_id, XComModel.run_id, func.max(XComModel.timestamp).label("newest"),
                   func.count().label("n"))
            .where(XComModel.key == SUMMARY_KEY).group_by(XComModel.dag_id, XComModel.run_id).subquery())
    stale = session.execute(
        select(DagRun).join(INDEX, joined)
        .join(mine, and_(mine.c.dag_id == C.dag_id, mine.c.run_id == C.run_id))
        .where(or_(C.summary_at.is_(None), mine.c.newest > C.summary_at,
                   C.summary_n.is_(None), C.summary_n != mine.c.n))).scalars().all()
    if not stale:
        return
    merged = _latest_summaries(session, XComModel.dag_run_id.in_([run.id for run in stale]))
    for run in stale:
        published = merged.get((run.dag_id, run.run_id))
        if published is None:  # deleted meanwhile
            continue
        fields = dict(published.fields)
        if dag_runs.run_state(run) in TERMINAL_STATES and "running_s" in fields:  # it ended: no interval stays open
            fields.update(closed_at_end(**{name: fields.get(name) for name in _RUNNING_FIELDS}, end=run.end_date))
        session.execute(update(INDEX).where(C.dag_id == run.dag_id, C.run_id == run.run_id)
                        .values(**fields, summary_at=published.newest, summary_n=published.count))
        counts.summaries += 1


def sync(session: Any, jobs: Mapping[str, TrainingJob], generic_dag_id: str, *,
         read_json: Callable[[], ReadJson]) -> SyncCounts:
    """Bring the index in step with Airflow's runs of the SAT DAGs and the pipeline's summaries; commit if it wrote.

    `read_json()` makes the Object Storage reader; it is called only when a run must be read
    (a run that predates the index, or that ended without telling): the steady path reads
    the metadata DB only.
    """
    counts = SyncCounts()
    reader: list[ReadJson] = []

    def read(uri: str) -> Any:
        if not reader:
            reader.append(read_json())
        return reader[0](uri)

    joined = and_(C.dag_id == DagRun.dag_id, C.run_id == DagRun.run_id)

    # 1. runs not indexed yet
    new_runs = _new_runs(session, jobs, generic_dag_id, joined)
    if new_runs:
        summaries = _latest_summaries(session, XComModel.dag_run_id.in_([run.id for run in new_runs]))
        validated = dag_runs.validated_specs(session, list(new_runs))
        spec_stamps = _spec_stamps(session, list(new_runs))
        records = []
        for run in new_runs:
            record, job = _new_record(run, jobs, generic_dag_id, validated.get(run.id))
            record["spec_at"] = spec_stamps.get(run.id) if run.id in validated else None
            published = summaries.get((run.dag_id, run.run_id))
            if published is not None:
                record.update(published.fields, summary_at=published.newest, summary_n=published.count)
            if record["run_state"] in TERMINAL_STATES:  # first seen ended: read once, as a run seen ending is
                told = published.fields.get("status") if published is not None else None
                record.update(_ended_fields(job, run, read, told, record))
                counts.read_from_storage += job is not None
            elif published is None and job is not None and run.start_date is not None:  # predates the index
                record.update(_from_storage(job, run.run_id, read))
                counts.read_from_storage += 1
            records.append(record)
        counts.added = _insert_new(session, records)

    # 1b. runs that validated their spec since they were indexed: their job is the one they recorded
    _revalidated(session, jobs, generic_dag_id, joined, read, counts)

    # 2. summaries from the pipeline that a run's row has not merged yet
    _apply_summaries(session, joined, counts)

    # 3. DAG-run columns that changed; a run that ended is read once when the pipeline did not say why
    changed = session.execute(
        select(C.status, C.listed, C.running_s, C.running_since, C.short_node_s, C.running_short_nodes, DagRun)
        .join(DagRun, joined).where(or_(
            C.run_state.is_distinct_from(DagRun.state), C.start_date.is_distinct_from(DagRun.start_date),
            C.end_date.is_distinct_from(DagRun.end_date), C.queued_at.is_distinct_from(DagRun.queued_at)))).all()
    for status, listed, running_s, running_since, short_node_s, running_short_nodes, run in changed:
        state = dag_runs.run_state(run)
        fields: dict[str, Any] = {"run_state": state, "queued_at": run.queued_at, "start_date": run.start_date,
                                  "end_date": run.end_date}
        if state in TERMINAL_STATES:  # it ended: its last checkpoint (and, unless told, its status); no open interval
            job = job_of(dag_runs.recorded_run_ref(session, run), dict(jobs), generic_dag_id) if listed else None
            kept = {"running_s": running_s, "running_since": running_since, "short_node_s": short_node_s,
                    "running_short_nodes": running_short_nodes}
            fields.update(_ended_fields(job, run, read, status, kept))
            counts.read_from_storage += job is not None
        session.execute(update(INDEX).where(C.dag_id == run.dag_id, C.run_id == run.run_id).values(**fields))
        counts.changed += 1

    # 4. runs deleted from Airflow's history
    gone = session.execute(select(C.dag_id, C.run_id).where(~exists().where(joined))).all()
    for dag_id, run_id in gone:
        session.execute(delete(INDEX).where(C.dag_id == dag_id, C.run_id == run_id))
    counts.removed = len(gone)

    if counts.added or counts.summaries or counts.changed or counts.removed or counts.validated:
        session.commit()
    return counts


def _new_runs(session: Any, jobs: Mapping[str, TrainingJob], generic_dag_id: str, joined: Any) -> list[Any]:
    """The runs of the generic DAG and of the job DAGs in `jobs` that the index has not yet.

    Asked of the SAT DAGs by their tag (and the generic DAG by its id), not by an `IN` of every spec's DAG id
    (issue 48.5); a run of a DAG whose spec is gone (its tag stays) is left out here, as before: its DAG id is
    read, not its row. The runs are then read by the DAGs that have new ones (as many names as those DAGs).
    """
    sat_dags = or_(DagRun.dag_id == generic_dag_id,
                   DagRun.dag_id.in_(select(DagTag.dag_id).where(DagTag.name == JOB_DAG_TAG)))
    waiting = {dag_id for (dag_id,) in session.execute(
        select(DagRun.dag_id).where(sat_dags, ~exists().where(joined)).distinct())}
    dag_ids = sorted(dag_id for dag_id in waiting if dag_id == generic_dag_id or dag_id in jobs)
    if not dag_ids:
        return []
    return list(session.scalars(select(DagRun).where(DagRun.dag_id.in_(dag_ids), ~exists().where(joined))
                                .order_by(DagRun.id)))


def _insert_new(session: Any, records: list[dict[str, Any]]) -> int:
    """Insert the new rows; one another request inserted meanwhile is left as it is."""
    defaults = {column.name: column.default.arg if column.default is not None else None for column in INDEX.c}
    rows = [{name: record.get(name, default) for name, default in defaults.items()} for record in records]
    try:
        with session.begin_nested():
            session.execute(insert(INDEX), rows)
        return len(rows)
    except IntegrityError:
        added = 0
        for row in rows:
            try:
                with session.begin_nested():
                    session.execute(insert(INDEX).values(**row))
                added += 1
            except IntegrityError:
                continue
        return added


def run_facts(session: Any, run: Any) -> dict[str, Any]:
    """What the job page shows of a DAG run from the metadata DB alone: who created it, when it was queued,
    how long it waited, and the goodput `finalize` published (its `sat_summary` XCom, else the index row's;
    None until the run has ended)."""
    queued, start = _aware(run.queued_at), _aware(run.start_date)
    published = _latest_summaries(session, XComModel.dag_run_id == run.id).get((run.dag_id, run.run_id))
    goodput = (published.fields if published else {}).get("goodput")
    if goodput is None:
        ensure_table(session)
        goodput = session.execute(select(C.goodput).where(C.dag_id == run.dag_id, C.run_id == run.run_id)).scalar()
    return {"creator": creator_of(run), "queued": _iso(queued), "queue_s": _queue_seconds(queued, start),
            "goodput": goodput, "waiting": waiting_line(session, run)}


def waiting_line(session: Any, run: Any) -> str | None:
    """Why the run waits (`ui.waits`, the line its list row shows too); None when it does not, or its job ended."""
    if dag_runs.run_state(run) not in waits.ACTIVE:
        return None
    ensure_table(session)
    known = session.execute(select(C.job, C.workspace, C.status)
                            .where(C.dag_id == run.dag_id, C.run_id == run.run_id)).first()
    if known is not None and known.status in TERMINAL_WORDS:  # the job ended; its DAG run only wraps up
        return None
    key = waits.RunKey(run.dag_id, run.run_id, (known.job or None) if known else None,
                        known.workspace if known else None)
    return _waiting_lines(session, [key]).get((run.dag_id, run.run_id))


def note_tags(session: Any, dag_id: str, run_id: str, tags: Mapping[str, Any]) -> None:
    """The view saved a run's tags: the index shows them at once (the caller commits)."""
    ensure_table(session)
    session.execute(update(INDEX).where(C.dag_id == dag_id, C.run_id == run_id).values(**_tags_fields(tags)))


def next_runs(session: Any, dag_ids: set[str]) -> dict[str, datetime | None]:
    """The next scheduled run of each of `dag_ids` (the scheduled job DAGs)."""
    if not dag_ids:
        return {}
    return dict(session.execute(select(DagModel.dag_id, DagModel.next_dagrun_create_after)
                                .where(DagModel.dag_id.in_(sorted(dag_ids)))).all())


def note_next_runs(session: Any, rows: list[dict[str, Any]], jobs: Mapping[str, TrainingJob]) -> None:
    """Each row of a scheduled job's DAG gets its next run (`next_runs` of the page's DAGs alone, not of every
    scheduled spec: issue 48.5)."""
    scheduled = {row["dag_id"] for row in rows if (job := jobs.get(row["dag_id"])) is not None and job.schedule}
    found = next_runs(session, scheduled)
    for row in rows:
        if row["dag_id"] in found:
            row["next_run"] = _iso(found[row["dag_id"]])


def choices(session: Any, dag_ids: set[str], owners: Owners | None = None) -> dict[str, list[str]]:
    """The values the filter menus offer (those in the index of the runs listed: workspaces, creators)."""
    out = {}
    scope = _scope(session, dag_ids)
    for name in ("workspace", "creator"):
        out[name] = [value for (value,) in session.execute(
            select(C[name]).where(*scope, *_owned(owners), C[name].is_not(None))
            .distinct().order_by(C[name]))]
    return out
