"""Processes found through `/proc`: by a variable in their environment, whatever session or parent they have now.

A process inherits its parent's environment, so a variable set once (an attempt's tag, a
deployment's home) marks every descendant, including those that started sessions of
their own (torchrun's workers, the local runner's training processes) or were re-parented
to init. Zombies do not count: they run nothing.
"""

from __future__ import annotations

import os
import signal
import time


def state_of(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of `pid`; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state, _ppid, pgrp = handle.read().rpartition(")")[2].split()[:3]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else (state, int(pgrp))


def carries(pid: int, needle: bytes) -> bool:
    """Whether `pid`'s environment holds the entry `needle` (b"NAME=value") exactly."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:  # gone, or not ours to read
        return False
    return environ.startswith(needle + b"\0") or (b"\0" + needle + b"\0") in environ


def marked(name: str, value: str) -> list[int]:
    """Running processes (not this one) whose environment says `name=value`."""
    needle = f"{name}={value}".encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    me = os.getpid()
    return [int(e) for e in entries
            if e.isdigit() and int(e) != me and state_of(int(e)) is not None and carries(int(e), needle)]


def terminate(pids: list[int], grace: float) -> None:
    """SIGTERM to `pids`, SIGKILL to those still running after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if state_of(pid) is not None]
            time.sleep(0.2)
