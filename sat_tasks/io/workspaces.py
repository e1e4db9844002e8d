"""Where workspaces live: their YAML definitions (`[sat] workspaces_dir`) and, on the local backend, the slot board.

`WorkspaceStore` is the one store the `sat workspace` command and the Training Jobs
view's Workspaces page both write: one `<name>.yaml` per workspace, written atomically
(temp file, rename). Edits and deletes take the jobs that use the workspace (`uses`) and
are refused, with their names, when the rules of `sat_tasks.core.workspaces` say so.

`SlotBoard` is the local backend's queue for a workspace's nodes: a JSON file per
workspace under `<work_dir>/workspaces/`, changed under an exclusive `flock`, holding the
queued requests (first in, first out) and what each admitted one holds. A holder whose
process has died (a killed task) is dropped when the board is next read, so its nodes
come back. `acquire` waits in line and calls back whenever the reason it waits changes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from sat_tasks import config
from sat_tasks.core.workspaces import (
    Admission,
    Holding,
    SlotRequest,
    WorkspaceUse,
    admit,
    delete_refusal,
    resize_refusal,
)
from sat_tasks.errors import SatError
from sat_tasks.spec.loading import SpecError, SpecProblem
from sat_tasks.spec.workspace import (
    WORKSPACE_NAME_PATTERN,
    WORKSPACE_NAME_RULE,
    Workspace,
    load_workspace,
    parse_workspace,
)


class WorkspaceNotFound(SatError, LookupError):
    """No workspace of that name in `[sat] workspaces_dir`: create it (`sat workspace create`) or fix the name."""


def checked_name(name: str) -> str:
    """`name` when it is a workspace name; WorkspaceNotFound otherwise, before any file is named after it (issue
    44.7: a 5000-character name was an OSError, a 500, whose 404 text named the server's folder)."""
    if not isinstance(name, str) or len(name) > 63 or not re.fullmatch(WORKSPACE_NAME_PATTERN, name):
        shown = repr(name[:64]) + ("..." if len(name) > 64 else "") if isinstance(name, str) else repr(name)
        raise WorkspaceNotFound(f"no workspace named {shown}: a workspace name {WORKSPACE_NAME_RULE}")
    return name


class WorkspaceRefused(SatError, ValueError):
    """An edit or delete would take nodes from jobs that run or wait there; the message names them."""


class WorkspaceWaitTimeout(SatError, TimeoutError):
    """A job waited for its workspace's nodes longer than its deadline; the message says what it waited for."""


def workspaces_dir() -> Path:
    """The folder of workspace definitions (`[sat] workspaces_dir`, default include/workspaces)."""
    return Path(config.sat_setting("workspaces_dir"))


class WorkspaceStore:
    """The workspace definitions: one `<name>.yaml` each in `directory`.

    Call order: `list()` / `get(name)` to read; `create(data)`, `set_nodes(name, n, uses)`,
    `delete(name, uses)` to change. `uses` are the job runs that hold or wait for the
    workspace's nodes (`SlotBoard.uses()`, plus the Airflow runs the UI sees).
    """

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else workspaces_dir()

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.yaml"

    def list(self) -> list[Workspace]:
        """Every valid workspace, by name (a broken file is left out: `problems()` reports it)."""
        found = []
        for path in sorted(self.directory.glob("*.yaml")):
            with contextlib.suppress(SpecError):
                found.append(load_workspace(path))
        return found

    def problems(self) -> dict[str, str]:
        """Broken definition files: path -> the `<file>: <field>: <rule>` lines."""
        broken = {}
        for path in sorted(self.directory.glob("*.yaml")):
            try:
                workspace = load_workspace(path)
            except SpecError as exc:
                broken[str(path)] = str(exc)
                continue
            if workspace.name != path.stem:
                broken[str(path)] = f"{path}: name: must match the file name ({path.stem!r})"
        return broken

    def get(self, name: str) -> Workspace:
        """The workspace called `name`; WorkspaceNotFound when there is none."""
        path = self.path(checked_name(name))
        if not path.is_file():  # the folder is the server's, not told (issue 44.7)
            known = ", ".join(w.name for w in self.list()) or "none"
            raise WorkspaceNotFound(f"no workspace named {name!r} (workspaces: {known})")
        return load_workspace(path)

    def find(self, name: str) -> Workspace | None:
        with contextlib.suppress(WorkspaceNotFound):
            return self.get(name)
        return None

    def create(self, data: dict[str, Any]) -> Workspace:
        """Validate and write a new workspace; SpecError when a field breaks a rule or the name is taken."""
        workspace = parse_workspace(data, source=str(data.get("name") or "<workspace>"))
        if self.path(workspace.name).exists():
            raise SpecError(workspace.name, [SpecProblem(field="name", rule=(
                f"a workspace named {workspace.name!r} exists already; edit its node count instead"))])
        self._write(workspace)
        return workspace

    def set_nodes(self, name: str, nodes: int, uses: Sequence[WorkspaceUse] = ()) -> Workspace:
        """Change the node count (for the next job that starts); refused below what running jobs use."""
        workspace = self.get(name)
        updated = workspace.with_nodes(nodes)
        refusal = resize_refusal(workspace, nodes, [u for u in uses])
        if refusal:
            raise WorkspaceRefused(refusal)
        self._write(updated)
        return updated

    def delete(self, name: str, uses: Sequence[WorkspaceUse] = ()) -> Workspace:
        """Delete the definition; refused while a job runs or waits in the workspace."""
        workspace = self.get(name)
        refusal = delete_refusal(workspace, list(uses))
        if refusal:
            raise WorkspaceRefused(refusal)
        self.path(name).unlink()
        return workspace

    def _write(self, workspace: Workspace) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(workspace.name)
        temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        temp.write_text(yaml.safe_dump(workspace.to_dict(), sort_keys=False), encoding="utf-8")
        os.replace(temp, target)


# ---- the local slot board ---------------------------------------------------------------------
def _alive(owner: dict[str, Any]) -> bool:
    """Whether the process that queued or holds an entry still runs (entries of another host are kept)."""
    if owner.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(owner.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


class SlotBoard:
    """The local backend's queue for one workspace's nodes (see the module docstring).

    Call order: `enqueue(...)` -> ticket; `poll(workspace, ticket)` until admitted (it then
    holds its nodes); `release(ticket)` when the attempt ends. `acquire` does the first
    two with a deadline; `uses()` says who holds or waits.
    """

    def __init__(self, name: str, root: Path | None = None) -> None:
        self.name = checked_name(name)
        self.root = Path(root) if root is not None else config.work_dir() / "workspaces"
        self.file = self.root / f"{name}.slots.json"
        self._lock_file = self.root / f"{name}.slots.lock"
        self.what = f"the nodes of workspace {name}"  # what a timeout says it waited for

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self._lock_file, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    state = json.loads(self.file.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    state = {}
                state.setdefault("queue", [])
                state.setdefault("holdings", [])
                state["queue"] = [e for e in state["queue"] if _alive(e["owner"])]
                state["holdings"] = [e for e in state["holdings"] if _alive(e["owner"])]
                before = json.dumps(state, sort_keys=True)
                yield state
                if json.dumps(state, sort_keys=True) != before or not self.file.exists():
                    temp = self.file.with_suffix(".tmp")
                    temp.write_text(json.dumps(state, indent=1), encoding="utf-8")
                    os.replace(temp, self.file)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _owner() -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def enqueue(self, *, job: str, run_id: str, attempt: int, slots: int, exclude: Sequence[str] = (),
                failover: bool = False, prefer: Sequence[str] = ()) -> str:
        """Join the end of the queue; returns the ticket."""
        ticket = f"{time.time_ns()}-{secrets.token_hex(3)}"
        request = SlotRequest(ticket=ticket, job=job, run_id=run_id, attempt=attempt, slots=slots,
                              exclude=tuple(exclude), failover=failover, prefer=tuple(prefer))
        with self._locked() as state:
            state["queue"].append({"request": asdict(request), "owner": self._owner(),
                                   "since": dt.datetime.now(dt.UTC).isoformat()})
        return ticket

    def poll(self, workspace: Workspace, ticket: str) -> Admission:
        """Admit `ticket` if it is its turn and its nodes are free (it then holds them), else say why it waits."""
        with self._locked() as state:
            queue = [_request(e["request"]) for e in state["queue"]]
            holdings = [Holding(_request(e["request"]), tuple(e["nodes"])) for e in state["holdings"]]
            answer = self._admit(workspace, ticket, queue, holdings)
            if answer.admitted:
                entry = next(e for e in state["queue"] if e["request"]["ticket"] == ticket)
                state["queue"].remove(entry)
                state["holdings"].append({**entry, "nodes": list(answer.nodes)})
            return answer

    def _admit(self, workspace: Any, ticket: str, queue: list[SlotRequest], holdings: list[Holding]) -> Admission:
        """The rule `poll` applies (the local backend's shared pool has its own: `backends.local.pool`)."""
        return admit(workspace, ticket, queue, holdings)

    def release(self, ticket: str) -> None:
        """Give back the nodes `ticket` holds (or leave the queue); a ticket not there is a no-op."""
        with self._locked() as state:
            state["queue"] = [e for e in state["queue"] if e["request"]["ticket"] != ticket]
            state["holdings"] = [e for e in state["holdings"] if e["request"]["ticket"] != ticket]

    def uses(self) -> list[WorkspaceUse]:
        """Who holds nodes (running) and who waits (queued), in that order."""
        with self._locked() as state:
            running = [WorkspaceUse(e["request"]["job"], e["request"]["run_id"], e["request"]["slots"], "running",
                                    tuple(e["nodes"])) for e in state["holdings"]]
            queued = [WorkspaceUse(e["request"]["job"], e["request"]["run_id"], e["request"]["slots"], "queued")
                      for e in state["queue"]]
        return running + queued

    def acquire(self, load: Callable[[], Workspace], *, job: str, run_id: str, attempt: int, slots: int,
                exclude: Sequence[str] = (), failover: bool = False, prefer: Sequence[str] = (),
                deadline_seconds: float,
                on_wait: Callable[[Admission], None] = lambda _a: None, poll_seconds: float = 1.0
                ) -> tuple[str, tuple[str, ...]]:
        """Queue, wait for the turn and the nodes, return (ticket, nodes); WorkspaceWaitTimeout past the deadline.

        `load` reads the workspace each time (an edit of its node count counts at once);
        `on_wait` is called with the first reason to wait and with every new one.
        """
        ticket = self.enqueue(job=job, run_id=run_id, attempt=attempt, slots=slots, exclude=exclude,
                              failover=failover, prefer=prefer)
        deadline = time.monotonic() + deadline_seconds
        last_reason = None
        try:
            while True:
                answer = self.poll(load(), ticket)
                if answer.admitted:
                    return ticket, answer.nodes
                if answer.reason != last_reason:
                    last_reason = answer.reason
                    on_wait(answer)
                if time.monotonic() >= deadline:
                    raise WorkspaceWaitTimeout(
                        f"waited {deadline_seconds:.0f}s for {self.what} "
                        f"([sat] workspace_wait_seconds): {answer.reason}")
                time.sleep(poll_seconds)
        except BaseException:
            self.release(ticket)
            raise


def _request(data: dict[str, Any]) -> SlotRequest:
    return SlotRequest(**{**data, "exclude": tuple(data.get("exclude") or ()),
                          "prefer": tuple(data.get("prefer") or ())})
