"""The running attempt's part of the job log, read from its rank-0 pod through the Kubernetes API while it runs.

Until classify stores an attempt's section (`records.write_rank_log`: every rank's log between
the `[sat] attempt N` lines), its lines are only in the pods. The job page follows them here
(`KubernetesBackend.live_log`), in bounded reads:

* Rank 0's pod only: one API call per read whatever the number of nodes, and rank 0 is where
  the launcher and the training write their progress. The other ranks' logs join the section
  when classify stores it; the closing line says so.
* The pod log API reads from the end, by lines (`tail_lines`), and gives the first bytes of
  those (`limit_bytes`); it has no byte offsets. So a reader of a live section holds no byte
  offset into it but a `core.live_log.LiveCursor`: the runtime's timestamp of the last line
  it has (`timestamps=true`; the view shows the lines without it, as the stored section
  does) and how many lines with exactly that timestamp it has.
* A first read (no cursor, or one of another pod) is the section's opening line (the stored
  section's, `core.joblog.job_log_header`) and the last `lines` lines, from their first,
  at most `limit` bytes (`more`: the rest follows on the next read). Where earlier lines
  exist (the window of `lines` + 1 lines was full, or bigger than one read) a `[sat]` line
  says they are not shown (the download and the stored section go further back).
* A read after a cursor asks for the lines since the cursor's second, less a margin for the
  clocks of this host and the node (`since_seconds`, `SKEW_S`), at most `FOLLOW_LINES`
  lines and `READ_BYTES` bytes, and keeps those after the cursor. When the cursor's own line
  is not among them, more lines came than `FOLLOW_LINES` since the last read: a `[sat]` line
  says some were left out here. When `READ_BYTES` of lines older than the cursor fill a read
  (more than that written within the margin), a second read starts at the cursor's own
  second (a margin of 1 s: a clock skew beyond it shows as lines left out); when lines of
  that second fill it too, the read starts again from the tail, saying lines were left out.
* Once rank 0's container has ended and its last lines are read, the section's closing line
  (`job_log_footer`) ends the live section; nothing more is read from the pod.

A pod that has not started its container yet, or is gone, gives no line and a note saying so;
an API error too (nothing raises to the page). A response is never read past its bound,
whatever the server does with `limit_bytes`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from typing import Any

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.evidence import as_dict
from sat_tasks.core.attempt import MAIN_CONTAINER_NAME
from sat_tasks.core.clock import now_utc, parse_time
from sat_tasks.core.joblog import job_log_footer, job_log_header
from sat_tasks.core.live_log import LiveCursor, LiveLog, split_stamp
from sat_tasks.io.run_layout import JobRun

TAIL_LINES = 1000  # a first read: the section's last lines
FOLLOW_LINES = 10_000  # a read after a cursor: at most these lines since it
READ_BYTES = 1 << 20  # `limit_bytes` of a read (at least; a larger `limit` raises it)
SKEW_S = 10  # `since_seconds` reaches this much further back than the cursor (clocks of this host and the node)
_CHUNK = 1 << 16


def live_log(client: Any, namespace: str, run: JobRun, *, stored: Collection[int], cursor: LiveCursor | None,
             limit: int, lines: int = TAIL_LINES) -> LiveLog | None:
    """The part of the job log rank 0 of the running attempt wrote after `cursor` (the module's docstring says how).

    `stored`: the attempts whose sections are stored (their pods are not followed). None when
    no rank-0 pod of the run belongs to an attempt without a stored section.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    selector = f"{names.run_label_selector(run.job, run.run_id)},{names.LABEL_NODE_RANK}=0"
    try:
        listed = client.list_namespaced_pod(namespace, label_selector=selector).items
    except (ApiException, HTTPError, OSError) as exc:
        return LiveLog(cursor.attempt if cursor else None, "", None,
                       note=f"the run's pods could not be listed ({_why(exc)})")
    running = sorted((attempt, pod) for pod in map(as_dict, listed)
                     if (attempt := _attempt_of(pod)) is not None and attempt not in stored)
    if not running:
        return None
    attempt, pod = running[-1]
    name = pod["metadata"]["name"]
    if cursor is not None and (cursor.attempt, cursor.source) != (attempt, name):
        cursor = None  # the reader followed another pod: this one's section begins
    where = f"attempt {attempt}'s pod {name} (rank 0) through the Kubernetes API"
    state = _container_state(pod)
    if cursor is not None and cursor.closed:
        return LiveLog(attempt, "", cursor, note=f"{where}: ended; the attempt's section (every rank) comes when "
                                                 "classify stores it")
    if "running" not in state and "terminated" not in state:
        waiting = (state.get("waiting") or {}).get("reason") or (pod.get("status") or {}).get("phase") or "Pending"
        return LiveLog(attempt, "", None, note=f"{where}: its container has not started yet ({waiting})")
    try:
        piece = _Reader(client, namespace, name, max(limit, READ_BYTES)).read(cursor, lines)
    except (ApiException, HTTPError, OSError) as exc:
        return LiveLog(attempt, "", None, note=f"{where}: no log now ({_why(exc)})")
    text, cursor, more = _compose(pod, run, attempt, name, piece, cursor, limit)
    ended = state.get("terminated")
    if ended is not None and not more:
        text += job_log_footer(attempt=attempt, at=parse_time(ended.get("finishedAt")) or now_utc(),
                               exit_code=ended.get("exitCode"),
                               note=f"rank 0, pod {name}; every rank's log comes with the attempt's stored section") + "\n"
        cursor = LiveCursor(cursor.attempt, cursor.source, cursor.at, cursor.count, closed=True)
    status = "ended" if ended is not None else "running"
    return LiveLog(attempt, text, cursor, more, note=f"{where}: {status}; the other ranks' logs join the section when "
                                                     "classify stores it")


class _Piece:
    """One read's lines as (timestamp ns or None, text), whether it stopped at its bound, and what it left out."""

    def __init__(self, lines: list[tuple[int | None, str]], clipped: bool, earlier: bool, skipped: bool) -> None:
        self.lines, self.clipped, self.earlier, self.skipped = lines, clipped, earlier, skipped


class _Reader:
    def __init__(self, client: Any, namespace: str, name: str, bound: int) -> None:
        self.client, self.namespace, self.name, self.bound = client, namespace, name, bound

    def read(self, cursor: LiveCursor | None, lines: int) -> _Piece:
        """The lines after `cursor` (from the tail without one, or when lines older than it fill the read)."""
        if cursor is None:
            return self._tail(lines)
        if not cursor.at:  # no line yet: the tail window says whether it missed some
            found, clipped = self._request(tail_lines=FOLLOW_LINES + 1, since_seconds=None)
            full = len(found) > FOLLOW_LINES
            return _Piece(found[1:] if full else found, clipped, False, full)
        back = time.time() - cursor.at / 1e9
        for margin in (SKEW_S, 1):  # the second read: from the cursor's own second, when older lines filled the first
            found, clipped = self._request(tail_lines=FOLLOW_LINES + 1, since_seconds=math.ceil(back) + margin)
            new = _after(found, cursor)
            if new or not clipped:
                break
        else:  # more than one read of lines within the cursor's second: go on from the tail
            tail = self._tail(lines)
            return _Piece(_after(tail.lines, cursor), tail.clipped, False, True)
        first = found[0][0] if found else None  # the cursor's own line is there unless the window began after it
        return _Piece(new, clipped, False, first is not None and first > cursor.at)

    def _tail(self, lines: int) -> _Piece:
        found, clipped = self._request(tail_lines=lines + 1, since_seconds=None)
        earlier = len(found) > lines or (clipped and len(found) > 1)  # clipped: the window is bigger than one read
        return _Piece(found[1:] if earlier else found, clipped, earlier, False)

    def _request(self, *, tail_lines: int, since_seconds: int | None) -> tuple[list[tuple[int | None, str]], bool]:
        """One bounded read: (the lines, stamped), True when it stopped at `bound` bytes."""
        extra = {"since_seconds": max(1, since_seconds)} if since_seconds is not None else {}
        response = self.client.read_namespaced_pod_log(
            self.name, self.namespace, container=MAIN_CONTAINER_NAME, timestamps=True, tail_lines=tail_lines,
            limit_bytes=self.bound, _preload_content=False, **extra)  # raw bytes: kubernetes-client/python#2596
        try:
            kept, size = [], 0
            for chunk in response.stream(_CHUNK) if hasattr(response, "stream") else [response.data]:
                kept.append(chunk)
                size += len(chunk)
                if size >= self.bound:
                    break
        finally:
            getattr(response, "release_conn", lambda: None)()
        data = b"".join(kept)[:self.bound]
        clipped = size >= self.bound
        if clipped and b"\n" in data:
            data = data[:data.rfind(b"\n") + 1]  # the part line comes whole with the next read
        return [split_stamp(line) for line in data.decode("utf-8", errors="replace").splitlines()], clipped


def _after(lines: list[tuple[int | None, str]], cursor: LiveCursor) -> list[tuple[int | None, str]]:
    """The lines a reader at `cursor` does not have (a line without a timestamp counts as new)."""
    new, same = [], 0
    for at, text in lines:
        if at is not None and at < cursor.at:
            continue
        if at is not None and at == cursor.at:
            same += 1
            if same <= cursor.count:
                continue
        new.append((at, text))
    return new


def _compose(pod: dict[str, Any], run: JobRun, attempt: int, name: str, piece: _Piece, cursor: LiveCursor | None,
             limit: int) -> tuple[str, LiveCursor, bool]:
    """The text for the reader (at most `limit` bytes, whole lines), its new cursor and whether more is waiting."""
    out: list[str] = []
    if cursor is None:
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        started = parse_time(status.get("startTime")) or parse_time(pod["metadata"].get("creationTimestamp"))
        out.append(job_log_header(job=run.job.name, attempt=attempt, node=spec.get("nodeName"),
                                  at=started or now_utc(), note=f"log of pod {name} (rank 0) follows") + "\n")
        cursor = LiveCursor(attempt, name)
    if piece.earlier:
        out.append(f"{now_utc().isoformat()} [sat] pod {name}: earlier lines are not shown here (the download and "
                   "the attempt's stored section go further back)\n")
    if piece.skipped:
        out.append(f"{now_utc().isoformat()} [sat] pod {name}: lines left out here (more came since the last read "
                   "than one read takes); the attempt's stored section has them\n")
    used, more = sum(len(part.encode()) for part in out), piece.clipped
    for index, (at, text) in enumerate(piece.lines):
        line = text + "\n"
        size = len(line.encode())
        if used + size > limit:
            if index or used:  # the rest comes with the next read
                more = True
                break
            line = line.encode()[:limit - 1].decode("utf-8", errors="ignore") + "\n"  # one line longer than the limit
        out.append(line)
        used += len(line.encode())
        cursor = cursor.after(at if at is not None else cursor.at)
    return "".join(out), cursor, more


def _attempt_of(pod: dict[str, Any]) -> int | None:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {})[names.LABEL_ATTEMPT])
    except (KeyError, ValueError):
        return None


def _container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s.get("state") or {} for s in statuses if s.get("name") == MAIN_CONTAINER_NAME), {})


def _why(exc: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        known = {404: "the pod is gone", 400: "its container has not started", 403: "not allowed: RBAC"}
        return f"{exc.status} {exc.reason}" + (f": {known[exc.status]}" if exc.status in known else "")
    return f"{type(exc).__name__}: the API server did not answer"
