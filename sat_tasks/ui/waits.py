"""Why a run that has not ended waits, in one line (issue 45.5): the list row's and the job page's "why pending".

SageMaker's secondary status and `kubectl describe`'s events are the bar: a run that waits says
for what, from the state that holds it back, never from a guess:

- its DAG run is `queued`: Airflow starts at most `max_active_runs` runs of a DAG at once, in
  order (`run_after`); the line counts the runs of its DAG queued ahead of it, and says whether
  the limit holds it or the DAG is paused;
- its launch holds a place in line on the local pool's board, or on its workspace's
  (`backends.local.pool.board_waits`): waiting for a node slot, or for the workspace's nodes,
  with the board's own reason (who holds the slots, how many are ahead);
- its `wait_for_capacity` sensor waits for Spot capacity (`up_for_reschedule`): how many checks
  since when, and the next (Airflow's task reschedules);
- a task of it is `scheduled` or `queued` while none of it runs: it waits for an Airflow worker
  slot (`[core] parallelism`, the slots the running and queued tasks hold), or for a slot of its
  Airflow pool (a Kubernetes workspace's pool, ADR 0015);
- a task waits for its retry, or is deferred to the triggerer.

Anything else (a task of it runs, it ended, its job ended while the DAG run wraps up) is no wait: the
status history speaks. Call order:
`waiting_lines(session, keys)` for the rows of a list page or for one job page, the same function
for both, so the row and the page say the same. `why_waiting(facts)` is the rule, on `RunFacts`
a test can build.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sat_tasks.core.status import TERMINAL
from sat_tasks.core.workspaces import Admission

log = logging.getLogger(__name__)

ACTIVE = ("queued", "running")
TERMINAL_WORDS = frozenset(status.value for status in TERMINAL)
UNFINISHED = ("scheduled", "queued", "running", "up_for_retry", "up_for_reschedule", "deferred", "restarting",
              "awaiting_input")
WORKING = ("running", "restarting")  # a task of the run works: the run does not wait
LAUNCH_TASK = "launch"  # an attempt's launch task id within its group; deferred, it watches a running training
SPOT_TASK = "wait_for_capacity"  # the Spot sensor's task id within an attempt's group (`airflow.dag_factory`)
DEFAULT_POOL = "default_pool"


@dataclass(frozen=True)
class RunKey:
    """A run the view shows: its DAG run, and the job and workspace its boards know it by (None: any)."""

    dag_id: str
    run_id: str
    job: str | None = None
    workspace: str | None = None


@dataclass(frozen=True)
class TaskFacts:
    """A task instance of the run that has not finished."""

    task_id: str
    state: str
    pool: str = DEFAULT_POOL
    pool_slots: int = 1
    since: datetime | None = None  # when it was queued, else scheduled


@dataclass(frozen=True)
class SpotFacts:
    """The Spot sensor's reschedules: how many checks found no capacity, since when, and when the next one is."""

    checks: int = 0
    since: datetime | None = None
    next_check: datetime | None = None


@dataclass
class RunFacts:
    """What holds a run back, as the metadata DB and the boards have it (the input of `why_waiting`)."""

    dag_id: str
    state: str
    paused: bool = False
    ahead: int = 0  # runs of its DAG queued before it
    running_runs: int = 0  # runs of its DAG running
    max_active_runs: int | None = None
    tasks: tuple[TaskFacts, ...] = ()
    node_wait: Admission | None = None  # its request in line on the local pool's board
    workspace: str | None = None
    workspace_wait: Admission | None = None  # its request in line on its workspace's board
    spot: SpotFacts | None = None
    workers_busy: int = 0  # task instances running or queued, every DAG's: the worker slots they hold
    parallelism: int = 0
    pools: dict[str, tuple[int, int]] = field(default_factory=dict)  # pool -> (slots in use, slots)


def _clock(value: datetime | None) -> str:
    if value is None:
        return "?"
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%H:%M:%S UTC")


def _runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def why_waiting(facts: RunFacts) -> str | None:
    """The line saying what `facts`' run waits for; None when it does not wait (a task of it works, it ended)."""
    if facts.state == "queued":
        return _queued(facts)
    if facts.state != "running":
        return None
    if facts.node_wait is not None:
        return "Waiting for a node slot: " + facts.node_wait.reason
    if facts.workspace_wait is not None:
        return f"Waiting for workspace {facts.workspace}: {facts.workspace_wait.reason}"
    spot = next((t for t in facts.tasks if t.task_id.rsplit(".", 1)[-1] == SPOT_TASK
                 and t.state in ("up_for_reschedule", "running")), None)
    if spot is not None:
        seen = facts.spot or SpotFacts()
        return (f"Waiting for Spot capacity: {seen.checks} check(s) found none"
                + (f" since {_clock(seen.since)}" if seen.since else "")
                + (f"; next check at {_clock(seen.next_check)}" if seen.next_check else "")
                + f" ({spot.task_id})")
    if any(t.state in WORKING or (t.state == "deferred" and t.task_id.rsplit(".", 1)[-1] == LAUNCH_TASK)
           for t in facts.tasks):  # a deferred launch: its attempt's own process runs the training (ADR 0044)
        return None
    waiting = sorted((t for t in facts.tasks if t.state in ("scheduled", "queued")),
                     key=lambda t: (t.since or datetime.max.replace(tzinfo=UTC), t.task_id))
    if waiting:
        return _worker_wait(facts, waiting[0])
    later = next((t for t in facts.tasks if t.state == "up_for_retry"), None)
    if later is not None:
        return f"Waiting to retry task {later.task_id} (its last try failed; Airflow retries it after its delay)"
    deferred = next((t for t in facts.tasks if t.state == "deferred"), None)
    if deferred is not None:
        return f"Waiting on Airflow's triggerer: task {deferred.task_id} is deferred"
    return None


def _queued(facts: RunFacts) -> str:
    if facts.paused:
        return f"Queued: the DAG {facts.dag_id} is paused; Airflow starts none of its runs until it is unpaused"
    limit = facts.max_active_runs
    if limit is not None and facts.running_runs >= limit:
        return ((f"Queued behind {_runs(facts.ahead)}" if facts.ahead else "Queued, next in line")
                + f": Airflow runs at most {_runs(limit)} of {facts.dag_id} at once (max_active_runs) and "
                f"{facts.running_runs} are running")
    if facts.ahead:
        return f"Queued behind {_runs(facts.ahead)}: the scheduler starts the runs of {facts.dag_id} in turn"
    return "Queued: next to start; the scheduler has not started it yet"


def _worker_wait(facts: RunFacts, task: TaskFacts) -> str:
    used, slots = facts.pools.get(task.pool, (0, 0))
    if task.pool != DEFAULT_POOL and slots and used + task.pool_slots > slots:
        what = f"workspace {task.pool}" if task.pool == facts.workspace else f"Airflow pool {task.pool}"
        return (f"Waiting for {what}: task {task.task_id} needs {task.pool_slots} of its {slots} slot(s), "
                f"{used} in use")
    if task.pool == DEFAULT_POOL and slots and used + task.pool_slots > slots:
        return (f"Waiting for a slot of Airflow's {DEFAULT_POOL}: task {task.task_id} needs {task.pool_slots}, "
                f"{used} of {slots} in use")
    how = "queued for a worker" if task.state == "queued" else "scheduled"
    return (f"Waiting for an Airflow worker slot: task {task.task_id} is {how}"
            + (f" since {_clock(task.since)}" if task.since else "")
            + f"; {facts.workers_busy} of {facts.parallelism} worker slots ([core] parallelism) in use")


# ---- the boards ---------------------------------------------------------------------------------------
class Boards:
    """The local backend's boards, each read at most once per request: the shared pool's and each workspace's."""

    def __init__(self, pool: Callable[[], dict[tuple[str, str], Admission]] | None = None,
                 workspace: Callable[[str], dict[tuple[str, str], Admission]] | None = None) -> None:
        # The deployment's backend's boards (none where it keeps none: Kubernetes queues in Kueue and pools).
        self._pool = pool or (lambda: self._backend_board(None))
        self._workspace = workspace or self._backend_board
        self._read: dict[str | None, dict[tuple[str, str], Admission]] = {}
        self._backend: Any = None

    def _backend_board(self, workspace: str | None) -> dict[tuple[str, str], Admission]:
        """The backend's board of `workspace` (None: the shared pool); the backend is looked up once per request."""
        from sat_tasks.backends import get_backend
        from sat_tasks.backends.base import slot_waits_of
        from sat_tasks.config import sat_setting

        if self._backend is None:
            self._backend = get_backend(sat_setting("backend"))
        return slot_waits_of(self._backend, workspace)

    def waits(self, workspace: str | None) -> dict[tuple[str, str], Admission]:
        if workspace not in self._read:
            try:
                self._read[workspace] = self._pool() if workspace is None else self._workspace(workspace)
            except Exception as exc:  # noqa: BLE001 - a board that cannot be read says nothing; the list answers
                log.warning("the %s board could not be read: %s: %s", workspace or "local pool",
                            type(exc).__name__, exc)
                self._read[workspace] = {}
        return self._read[workspace]

    def find(self, key: RunKey) -> Admission | None:
        found = self.waits(key.workspace)
        if key.job is not None:
            return found.get((key.job, key.run_id))
        return next((answer for (_, run_id), answer in found.items() if run_id == key.run_id), None)


# ---- from the metadata DB ------------------------------------------------------------------------------
def waiting_lines(session: Any, keys: Sequence[RunKey], *, boards: Boards | None = None,
                  parallelism: int | None = None) -> dict[tuple[str, str], str]:
    """(dag id, run id) -> why it waits, for the runs of `keys` that wait (a few queries, whatever their number)."""
    facts = run_facts(session, keys, boards=boards, parallelism=parallelism)
    lines = {key: why_waiting(fact) for key, fact in facts.items()}
    return {key: line for key, line in lines.items() if line}


def run_facts(session: Any, keys: Sequence[RunKey], *, boards: Boards | None = None,
              parallelism: int | None = None) -> dict[tuple[str, str], RunFacts]:
    """The `RunFacts` of the runs of `keys` that have not ended, from the metadata DB and the boards."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from sqlalchemy import func, select

    wanted = {(k.dag_id, k.run_id): k for k in keys}
    if not wanted:
        return {}
    dag_ids = sorted({dag_id for dag_id, _ in wanted})
    rows = session.execute(select(DagRun.id, DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.run_after)
                           .where(DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(sorted({r for _, r in wanted})),
                                  DagRun.state.in_(ACTIVE))).all()
    active = {(row.dag_id, row.run_id): row for row in rows if (row.dag_id, row.run_id) in wanted}
    if not active:
        return {}
    facts = {key: RunFacts(dag_id=key[0], state=_word(row.state), workspace=wanted[key].workspace)
             for key, row in active.items()}

    queued = [key for key, fact in facts.items() if fact.state == "queued"]
    if queued:
        dags = sorted({dag_id for dag_id, _ in queued})
        models = {dag_id: (paused, limit) for dag_id, paused, limit in session.execute(
            select(DagModel.dag_id, DagModel.is_paused, DagModel.max_active_runs).where(DagModel.dag_id.in_(dags)))}
        running = dict(session.execute(select(DagRun.dag_id, func.count()).where(
            DagRun.dag_id.in_(dags), DagRun.state == "running").group_by(DagRun.dag_id)).all())
        line: dict[str, list[tuple[Any, int]]] = {}
        for dag_id, run_id, run_after, number in session.execute(select(
                DagRun.dag_id, DagRun.run_id, DagRun.run_after, DagRun.id).where(
                DagRun.dag_id.in_(dags), DagRun.state == "queued")):
            line.setdefault(dag_id, []).append((_order(run_after), number))
        for key in queued:
            fact, row = facts[key], active[key]
            paused, limit = models.get(fact.dag_id, (False, None))
            mine = (_order(row.run_after), row.id)
            fact.paused, fact.max_active_runs = bool(paused), limit
            fact.running_runs = int(running.get(fact.dag_id, 0))
            fact.ahead = sum(1 for other in line.get(fact.dag_id, []) if other < mine)

    started = [key for key, fact in facts.items() if fact.state == "running"]
    if started:
        _task_facts(session, facts, started, active, boards or Boards(), wanted, parallelism)
    return facts


def _task_facts(session: Any, facts: dict[tuple[str, str], RunFacts], started: list[tuple[str, str]],
                active: dict[tuple[str, str], Any], boards: Boards, wanted: dict[tuple[str, str], RunKey],
                parallelism: int | None) -> None:
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.taskreschedule import TaskReschedule
    from sqlalchemy import func, select

    tasks: dict[tuple[str, str], list[tuple[Any, TaskFacts]]] = {}
    for ti in session.execute(select(TI.id, TI.dag_id, TI.run_id, TI.task_id, TI.state, TI.pool, TI.pool_slots,
                                     TI.queued_dttm, TI.scheduled_dttm)
                              .where(TI.dag_id.in_(sorted({d for d, _ in started})),
                                     TI.run_id.in_(sorted({r for _, r in started})), TI.state.in_(UNFINISHED))):
        if (ti.dag_id, ti.run_id) in facts:
            tasks.setdefault((ti.dag_id, ti.run_id), []).append((ti.id, TaskFacts(
                ti.task_id, _word(ti.state), ti.pool or DEFAULT_POOL, ti.pool_slots or 1,
                _aware(ti.queued_dttm if _word(ti.state) == "queued" else ti.scheduled_dttm))))
    spot_ids = {}
    waits_for_worker = False
    for key in started:
        fact = facts[key]
        fact.tasks = tuple(t for _, t in tasks.get(key, []))
        if any(t.task_id.endswith(".launch") or t.task_id == "launch" for t in fact.tasks if t.state in WORKING):
            answer = boards.find(wanted[key])
            if fact.workspace is None:
                fact.node_wait = answer
            else:
                fact.workspace_wait = answer
        for number, task in tasks.get(key, []):
            if task.task_id.rsplit(".", 1)[-1] == SPOT_TASK and task.state in ("up_for_reschedule", "running"):
                spot_ids[number] = key
        waits_for_worker |= any(t.state in ("scheduled", "queued") for t in fact.tasks)
    if spot_ids:
        for ti_id, checks, since, next_check in session.execute(
                select(TaskReschedule.ti_id, func.count(), func.min(TaskReschedule.start_date),
                       func.max(TaskReschedule.reschedule_date))
                .where(TaskReschedule.ti_id.in_(list(spot_ids))).group_by(TaskReschedule.ti_id)):
            facts[spot_ids[ti_id]].spot = SpotFacts(int(checks), _aware(since), _aware(next_check))
    if not waits_for_worker:
        return
    busy = session.execute(select(func.count()).select_from(TI).where(TI.state.in_(("running", "queued")))).scalar()
    pools = {name: [0, slots] for name, slots in session.execute(select(Pool.pool, Pool.slots))}
    for name, used in session.execute(select(TI.pool, func.sum(TI.pool_slots)).where(
            TI.state.in_(("running", "queued"))).group_by(TI.pool)):
        if name in pools:
            pools[name][0] = int(used or 0)
    if parallelism is None:
        from airflow.configuration import conf

        parallelism = conf.getint("core", "parallelism")
    for key in started:
        facts[key].workers_busy, facts[key].parallelism = int(busy or 0), parallelism
        facts[key].pools = {name: (used, slots) for name, (used, slots) in pools.items()}


def keys_of(rows: Iterable[dict[str, Any]]) -> list[RunKey]:
    """The `RunKey`s of list rows that may wait: those whose run has not ended, nor their job (a Completed job's
    DAG run still wraps up: its cleanup waiting for a worker is no wait of the job's)."""
    return [RunKey(row["dag_id"], row["run_id"], row.get("job") or None, row.get("workspace")) for row in rows
            if row.get("run_state") in ACTIVE and row.get("status") not in TERMINAL_WORDS]


def _word(state: Any) -> str:
    return str(getattr(state, "value", state))


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _order(value: datetime | None) -> datetime:
    return _aware(value) or datetime.min.replace(tzinfo=UTC)
