"""The shared local pool's capacity: each node of `[sat] local_nodes` runs up to `[sat] local_node_slots` attempts at once.

A job without a workspace takes one slot (the local backend runs every rank on one host), an
elastic job one slot on each of `nodes` distinct nodes (it runs a rank per node it holds, ADR 0029).
`place` is the rule, a pure function: requests are served in the order they queued; each
takes the least-loaded healthy node with a free slot (the node its warm run kept first,
then the pool's order), and a request none of whose healthy nodes has a free slot waits
without holding up those behind it that fit elsewhere, as pods on a cluster do.
`PoolBoard` keeps the queue and the holdings in a file under `<work_dir>/local-pool/`,
changed under a lock (the slot board of `sat_tasks.io.workspaces`, with this rule instead
of a workspace's); a holder whose task process died is dropped, so its slot comes back.

`board_waits` reads a board as it is (no lock, nothing written) and says, for each request in
line, why it waits: the Training Jobs view's "waiting for a node slot" (issue 45.5).
`airflow_concurrency` sizes Airflow's own limits from the pool, so that every slot can be held
and the attempts queued behind them still get a worker to wait in line on (`sat up` sets them).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sat_tasks import config
from sat_tasks.core.airflow_limits import AirflowConcurrency, airflow_limits
from sat_tasks.core.workspaces import Admission, Holding, SlotRequest
from sat_tasks.errors import SatError
from sat_tasks.io.workspaces import SlotBoard, _alive, _request

SLOTS_SETTING = "local_node_slots"
POOL_WAIT = "waiting for a free slot in the local pool: "  # how `place` begins the reason of a request in line


class PoolSettingError(SatError, ValueError):
    """`[sat] local_node_slots` is not a whole number of at least 1."""


@dataclass(frozen=True)
class NodePool:
    """The shared pool as configured now: its nodes, in order, and how many attempts each runs at once."""

    nodes: tuple[str, ...]
    slots: int


def node_pool_now() -> NodePool:
    """`[sat] local_nodes` and `[sat] local_node_slots`, read at each call (an edit counts for the next placement)."""
    raw = config.sat_setting(SLOTS_SETTING)
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise PoolSettingError(f"[sat] {SLOTS_SETTING}: must be a whole number of at least 1, got {raw!r}")
    return NodePool(tuple(config.local_node_pool()), slots)


def place(pool: NodePool, ticket: str, queue: Sequence[SlotRequest], holdings: Sequence[Holding]) -> Admission:
    """Whether the queued request `ticket` may start now, on which nodes (`request.slots` distinct ones), and if not, why."""
    request = next((r for r in queue if r.ticket == ticket), None)
    if request is None:
        raise KeyError(f"ticket {ticket} is not queued")
    healthy = [n for n in pool.nodes if n not in request.exclude]
    if not healthy:
        return Admission(None, f"no healthy node left in the local pool: nodes {list(pool.nodes)}, "
                               f"excluded {list(request.exclude)}", lacks_healthy_nodes=True)
    if len(healthy) < request.slots:
        return Admission(None, f"too few healthy nodes in the local pool: {request.slots} needed, "
                               f"{len(healthy)} healthy of {list(pool.nodes)} (excluded {list(request.exclude)})",
                         lacks_healthy_nodes=True)
    load = {n: 0 for n in pool.nodes}
    for holding in holdings:
        for node in holding.nodes:
            load[node] = load.get(node, 0) + 1
    for queued in queue:  # first come, first served; each one takes a slot (one per node it needs) in the tally
        nodes = _least_loaded(pool, queued, load)
        if queued.ticket == ticket:
            if nodes is not None:
                used = "; ".join(f"{n}: {load[n]} of {pool.slots}" for n in nodes) if len(nodes) > 1 \
                    else f"{load[nodes[0]]} of {pool.slots}"
                return Admission(nodes, f"admitted to {', '.join(nodes)} ({used} slot(s) in use)")
            break
        for node in nodes or ():
            load[node] += 1
    holders = sorted({h.request.job for h in holdings})
    ahead = [r.job for r in queue[:queue.index(request)]]
    return Admission(None, (
        f"{POOL_WAIT}{len(healthy)} healthy node(s) x {pool.slots} slot(s), "
        f"all in use (by {', '.join(holders) or 'none'})"
        + (f", {len(ahead)} job(s) queued ahead" if ahead else "")
        + (f", {len(request.exclude)} node(s) excluded" if request.exclude else "")),
        position=len(ahead) + 1, lacks_healthy_nodes=request.failover, waiting_for=holders + ahead)


def _least_loaded(pool: NodePool, request: SlotRequest, load: dict[str, int]) -> tuple[str, ...] | None:
    """`request.slots` distinct nodes with a free slot, least loaded first (its preferred ones before); None: too few."""
    free = [n for n in pool.nodes if n not in request.exclude and load[n] < pool.slots]
    if len(free) < max(request.slots, 1):
        return None
    order = {n: i for i, n in enumerate(request.prefer)}
    ranked = sorted(free, key=lambda n: (order.get(n, len(order)), load[n], pool.nodes.index(n)))
    return tuple(ranked[:max(request.slots, 1)])


class PoolBoard(SlotBoard):
    """The shared pool's queue: `SlotBoard`'s file, lock and call order, with `place` as its rule.

    `acquire(node_pool_now, job=..., slots=1, ...)` returns (ticket, (node,)); `release(ticket)`
    gives the slot back; `uses()` lists who runs where and who waits.
    """

    def __init__(self, root: Path | None = None) -> None:
        super().__init__("shared", Path(root) if root is not None else config.work_dir() / "local-pool")
        self.what = "a free slot in the local pool"

    def _admit(self, workspace: NodePool, ticket: str, queue: list[SlotRequest], holdings: list[Holding]) -> Admission:
        return place(workspace, ticket, queue, holdings)


# ---- what the boards say, read as they are (the Training Jobs view, issue 45.5) --------------------
#: A board's rule: (ticket, queue, holdings) -> the request's admission now.
Rule = Callable[[str, list[SlotRequest], list[Holding]], Admission]


def board_waits(file: Path, rule: Rule) -> dict[tuple[str, str], Admission]:
    """(job, run id) -> why its request waits, for every request in line on the board in `file` that `rule` does
    not admit now. The file is read without its lock (it is replaced whole, never written in place) and nothing is
    written; entries of task processes that died are left out, as the board itself drops them."""
    try:
        state = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict):
        return {}
    try:
        queue = [_request(e["request"]) for e in state.get("queue") or [] if _alive(e["owner"])]
        holdings = [Holding(_request(e["request"]), tuple(e["nodes"]))
                    for e in state.get("holdings") or [] if _alive(e["owner"])]
    except (KeyError, TypeError, ValueError):
        return {}
    waits = {}
    for request in queue:
        answer = rule(request.ticket, queue, holdings)
        if not answer.admitted:
            waits[(request.job, request.run_id)] = answer
    return waits


def pool_waits(root: Path | None = None) -> dict[tuple[str, str], Admission]:
    """`board_waits` of the shared pool's board (`PoolBoard`), under the pool as configured now."""
    file = (Path(root) if root is not None else config.work_dir() / "local-pool") / "shared.slots.json"
    if not file.is_file():
        return {}
    pool = node_pool_now()
    return board_waits(file, lambda ticket, queue, holdings: place(pool, ticket, queue, holdings))


def workspace_waits(name: str, root: Path | None = None) -> dict[tuple[str, str], Admission]:
    """`board_waits` of workspace `name`'s board (`SlotBoard`), under its definition as it is now (none: nothing)."""
    from sat_tasks.core.workspaces import admit
    from sat_tasks.io.workspaces import WorkspaceStore

    file = (Path(root) if root is not None else config.work_dir() / "workspaces") / f"{name}.slots.json"
    workspace = WorkspaceStore().find(name) if file.is_file() else None
    if workspace is None:
        return {}
    return board_waits(file, lambda ticket, queue, holdings: admit(workspace, ticket, queue, holdings))


# ---- Airflow's concurrency, sized from the pool (issue 45.5; the limits: `core.airflow_limits`) ---------
def concurrent_attempts(setting: Callable[[str], str]) -> int:
    """Attempts at once under the `[sat]` settings `setting` reads: every node of `local_nodes` x
    `local_node_slots`, plus the nodes of the local workspaces (`workspaces_dir`)."""
    from sat_tasks.io.workspaces import WorkspaceStore

    nodes = tuple(n.strip() for n in setting("local_nodes").split(",") if n.strip())
    try:
        slots = max(1, int(setting("local_node_slots")))
    except ValueError:
        slots = 1  # the launch refuses the setting with its rule (`node_pool_now`); the size stays sane
    workspace_nodes = 0
    with contextlib.suppress(Exception):  # a broken workspaces folder: validate_spec reports it, not the start
        workspace_nodes = sum(w.nodes for w in WorkspaceStore(setting("workspaces_dir")).list())
    return airflow_concurrency(NodePool(nodes, slots), workspace_nodes).attempts


def airflow_concurrency(pool: NodePool, workspace_nodes: int = 0) -> AirflowConcurrency:
    """The limits for `pool` (every node x its slots) and `workspace_nodes` more nodes of local workspaces."""
    attempts = max(1, len(pool.nodes) * pool.slots + max(0, workspace_nodes))
    return airflow_limits(attempts)
