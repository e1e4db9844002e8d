"""Workspace rules as pure functions: what a job may ask of its workspace, queueing for its nodes, edit/delete refusals.

Nothing here reads or writes: `sat_tasks.io.workspaces` keeps the definitions (YAML) and
the local slot board, and calls these to decide. One slot per node: a 2-node job takes 2.
Jobs queue first in, first out (the head of the queue starts as soon as its nodes are
free, later jobs wait behind it), except a request that cannot fit the workspace's
healthy nodes at all (a failover whose excluded nodes leave too few): it waits aside
without blocking the others, until the workspace grows or its deadline passes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sat_tasks.spec import TrainingJob
from sat_tasks.spec.loading import SpecProblem
from sat_tasks.spec.quantities import parse_quantity
from sat_tasks.spec.workspace import Workspace


def workspace_nodes(workspace: Workspace) -> list[str]:
    """The workspace's nodes on the local backend: `<workspace>-node-<i>`, one per reserved node."""
    return [f"{workspace.name}-node-{i}" for i in range(workspace.nodes)]


def job_problems(job: TrainingJob, workspace: Workspace | None, today: dt.date,
                 known: Iterable[str] = ()) -> list[SpecProblem]:
    """Why `job` cannot run in its workspace (empty: it can), as `<field>: <rule>` problems with the numbers.

    `workspace` is the one the job names (None: no such workspace; `known` lists those
    there are). Checked when the job is validated (`sat validate`, `validate_spec`).
    """
    if job.workspace is None:
        return []
    if workspace is None:
        names = ", ".join(sorted(known)) or "none"
        return [SpecProblem(field="workspace", rule=f"no workspace named {job.workspace!r} (workspaces: {names})")]
    problems = []
    name, have = workspace.name, workspace.resources
    if job.nodes > workspace.nodes:
        problems.append(SpecProblem(field="nodes", rule=(
            f"the job asks for {job.nodes} nodes; workspace {name} has {workspace.nodes}")))
    if job.resources.server_type != have.server_type:
        problems.append(SpecProblem(field="resources.server_type", rule=(
            f"the job asks for {job.resources.server_type}; workspace {name} has {have.server_type} nodes")))
    if job.resources.gpus_per_node > have.gpus_per_node:
        problems.append(SpecProblem(field="resources.gpus_per_node", rule=(
            f"the job asks for {job.resources.gpus_per_node} GPUs per node; "
            f"workspace {name} has {have.gpus_per_node}")))
    # A pod's memory is the spec's memory plus /dev/shm (Kubernetes charges the emptyDir to it).
    if parse_quantity(job.resources.memory) + parse_quantity(job.resources.shared_memory) > parse_quantity(have.memory):
        problems.append(SpecProblem(field="resources.memory", rule=(
            f"the job asks for {job.resources.memory} + {job.resources.shared_memory} shared memory per node; "
            f"workspace {name} has {have.memory}")))
    if not workspace.contract.covers(today):
        problems.append(SpecProblem(field="workspace", rule=(
            f"workspace {name}'s contract runs {workspace.contract.describe()}; "
            f"the job starts {today.isoformat()}, outside it")))
    return problems


# ---- who uses a workspace ---------------------------------------------------------------------
@dataclass(frozen=True)
class WorkspaceUse:
    """A job run that holds (running) or waits for (queued) slots of a workspace."""

    job: str
    run_id: str
    slots: int
    state: str  # "running" or "queued"
    nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        where = f" on {', '.join(self.nodes)}" if self.nodes else ""
        return f"{self.job} ({self.run_id}, {self.state}, {self.slots} node(s){where})"


def merge_uses(*sources: Iterable[WorkspaceUse]) -> list[WorkspaceUse]:
    """One use per job run (the first source that knows it wins: put the slot board first)."""
    seen: dict[tuple[str, str], WorkspaceUse] = {}
    for source in sources:
        for use in source:
            seen.setdefault((use.job, use.run_id), use)
    return list(seen.values())


def resize_refusal(workspace: Workspace, nodes: int, uses: Sequence[WorkspaceUse]) -> str | None:
    """Why the node count cannot become `nodes` now (None: it can): running jobs use more than that."""
    running = [u for u in uses if u.state == "running"]
    used = sum(u.slots for u in running)
    if nodes < used:
        return (f"workspace {workspace.name}: cannot shrink to {nodes} node(s): running jobs use {used}: "
                + "; ".join(u.describe() for u in running))
    return None


def delete_refusal(workspace: Workspace, uses: Sequence[WorkspaceUse]) -> str | None:
    """Why the workspace cannot be deleted now (None: it can): jobs run or wait in it."""
    if uses:
        return (f"workspace {workspace.name}: cannot delete it while jobs run or wait in it: "
                + "; ".join(u.describe() for u in uses))
    return None


# ---- queueing for slots -----------------------------------------------------------------------
@dataclass(frozen=True)
class SlotRequest:
    """One attempt's request for `slots` nodes of a workspace; `exclude` are nodes of its failed attempts.

    `prefer` lists nodes to take first when they are free (the node a warm run kept).
    """

    ticket: str
    job: str
    run_id: str
    attempt: int
    slots: int
    exclude: tuple[str, ...] = ()
    failover: bool = False
    prefer: tuple[str, ...] = ()


@dataclass(frozen=True)
class Holding:
    """Nodes a request was given; it keeps them until it releases them."""

    request: SlotRequest
    nodes: tuple[str, ...]


@dataclass
class Admission:
    """The answer to one request now: `nodes` when it may start, else why it waits."""

    nodes: tuple[str, ...] | None
    reason: str
    position: int = 0  # 1-based place among the requests that can fit (0: admitted or waiting aside)
    lacks_healthy_nodes: bool = False  # its excluded nodes leave the workspace too few to fit it at all
    waiting_for: list[str] = field(default_factory=list)  # the jobs holding or ahead of it

    @property
    def admitted(self) -> bool:
        return self.nodes is not None


def admit(workspace: Workspace, ticket: str, queue: Sequence[SlotRequest], holdings: Sequence[Holding]) -> Admission:
    """Whether the queued request `ticket` may start now, on which nodes, and if not, why.

    Capacity is the workspace's node count as it is now (an edit counts for the next job to
    start); every held node counts against it, and so do a request's excluded nodes.
    """
    nodes = workspace_nodes(workspace)
    held = {n for h in holdings for n in h.nodes}
    used = sum(len(h.nodes) for h in holdings)
    request = next((r for r in queue if r.ticket == ticket), None)
    if request is None:
        raise KeyError(f"ticket {ticket} is not queued")
    holders = sorted({h.request.job for h in holdings})

    def healthy(r: SlotRequest) -> list[str]:
        return [n for n in nodes if n not in r.exclude]

    if len(healthy(request)) < request.slots:
        excluded = [n for n in nodes if n in request.exclude]
        return Admission(None, (
            f"workspace {workspace.name} has {workspace.nodes} node(s), {len(excluded)} of them excluded after "
            f"failed attempts ({', '.join(excluded) or 'none'}): too few healthy nodes for {request.slots}; "
            "waiting for the workspace to grow"), lacks_healthy_nodes=True)
    fitting = [r for r in queue if len(healthy(r)) >= r.slots]
    position = fitting.index(request) + 1
    if position > 1:
        ahead = [r.job for r in fitting[:position - 1]]
        return Admission(None, (
            f"queued in workspace {workspace.name}: position {position}, behind {', '.join(ahead)}"),
            position=position, waiting_for=ahead)
    free = [n for n in healthy(request) if n not in held]
    if len(free) < request.slots or used + request.slots > workspace.nodes:
        available = max(0, min(len(free), workspace.nodes - used))
        return Admission(None, (
            f"workspace {workspace.name}: {request.slots} node(s) needed, {available} free of {workspace.nodes} "
            f"({used} used by {', '.join(holders) or 'none'}"
            + (f", {len(request.exclude)} excluded" if request.exclude else "") + ")"),
            position=1, lacks_healthy_nodes=request.failover, waiting_for=holders)
    free.sort(key=lambda n: request.prefer.index(n) if n in request.prefer else len(request.prefer))
    return Admission(tuple(free[:request.slots]), f"admitted to workspace {workspace.name}")
