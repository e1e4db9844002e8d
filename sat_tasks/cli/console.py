"""What a run prints: a person's lines on the console, and everything else (Airflow's logs) in a file.

`Console` writes the lines a person follows, and one progress line (rewritten in place on
a terminal, else a line at most every `progress_every` seconds). `output_to_file(path)`
sends everything else this process and its children write to stdout and stderr into
`path` while it is open, and yields the console as it was.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

PROGRESS_EVERY_S = 120.0  # off a terminal: a progress line at least this often (milestones come between)
CLEAR_LINE = "\r\x1b[K"


class Console:
    """Where a run's lines go (thread-safe: the progress watcher writes from its own thread).

    `line(text)` one line a person follows (not when `quiet`); `progress(text, milestone)`
    the training progress (not when `quiet`); `summary(text)` always. `live`: rewrite the
    progress line in place at every call (default: when `stream` is a terminal); else a
    progress line is written at a milestone (a new checkpoint) or when `progress_every`
    seconds passed without one, so that a log holds a few lines however slow the machine.
    """

    def __init__(self, stream: TextIO, *, quiet: bool = False, live: bool | None = None,
                 progress_every: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.quiet = quiet
        self.live = _is_terminal(stream) if live is None else live
        self.progress_every = progress_every
        self._clock = clock
        self._lock = threading.Lock()
        self._progress_shown = False
        self._progress_at: float | None = None

    def line(self, text: str) -> None:
        if not self.quiet:
            self._write(text)

    def summary(self, text: str) -> None:
        self._write(text)

    def progress(self, text: str, milestone: bool = False) -> None:
        """The training progress: in place on a terminal, else a line at a milestone or after `progress_every`."""
        if self.quiet:
            return
        with self._lock:
            if self.live:  # cut to the terminal's width: a wrapped line would not be rewritten in place
                self.stream.write(CLEAR_LINE + text[:_columns(self.stream) - 1])
                self._progress_shown = True
            else:
                now = self._clock()
                if not milestone and self._progress_at is not None and now - self._progress_at < self.progress_every:
                    return
                self._progress_at = now
                self.stream.write(text + "\n")
            self.stream.flush()

    def _write(self, text: str) -> None:
        with self._lock:
            if self._progress_shown:  # the next line takes the progress line's place
                self.stream.write(CLEAR_LINE)
                self._progress_shown = False
            self.stream.write(text + "\n")
            self.stream.flush()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return shutil.get_terminal_size().columns


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def output_to_file(path: Path) -> Iterator[TextIO]:
    """While open, what is written to stdout and stderr goes to `path`; yields a stream on the console as it was.

    Writers hold stdout in three ways, so three things are redirected (and put back on exit):
    file descriptors 1 and 2 (child processes; writers that kept the original `sys.stdout`,
    as structlog's cached loggers do), `sys.stdout`/`sys.stderr` (writers that look them
    up), and plain `logging.StreamHandler`s (Airflow's console handler keeps the stream it
    was configured with). The console stream is a duplicate of stdout's descriptor, or
    stdout itself when it has none (pytest's `capsys`).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = sys.stdout, sys.stderr
    for stream in previous:
        stream.flush()
    console, owned = _console_stream(sys.stdout)
    log = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed below
    saved = [os.dup(1), os.dup(2)]
    handlers = _retarget_stream_handlers(log)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    try:
        yield console
    finally:
        for stream in (log, *previous):  # what they buffered belongs in the file
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        sys.stdout, sys.stderr = previous
        for handler, stream in handlers:
            handler.setStream(stream)
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        log.close()
        console.flush()
        if owned:
            console.close()


def _console_stream(stdout: TextIO) -> tuple[TextIO, bool]:
    """A stream that keeps writing where stdout writes now, and whether it is ours to close."""
    try:
        fd = stdout.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return stdout, False
    return open(os.dup(fd), "w", encoding="utf-8", buffering=1, errors="replace"), True


def _retarget_stream_handlers(target: TextIO) -> list[tuple[logging.StreamHandler, TextIO]]:
    """Point every plain StreamHandler (a console handler; not a file's, not pytest's capture) at `target`."""
    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    replaced = []
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream is not target:
                replaced.append((handler, handler.setStream(target)))
    return replaced
