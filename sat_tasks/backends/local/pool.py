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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sat_tasks import config
from sat_tasks.core.workspaces import Admission, Holding, SlotRequest
from sat_tasks.errors import SatError
from sat_tasks.io.workspaces import SlotBoard

SLOTS_SETTING = "local_node_slots"


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
        f"waiting for a free slot in the local pool: {len(healthy)} healthy node(s) x {pool.slots} slot(s), "
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
