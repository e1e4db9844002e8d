"""The root of every error SAT raises on purpose; each subclass says what went wrong and what to do."""

from __future__ import annotations


class SatError(Exception):
    """Base class of SAT's own errors (the checkpoint engine has its own: `ckpt_engine.errors`).

    Every message names the thing at fault and what to do about it, so that it can be shown
    to a person as it is (a task log, `sat` on the command line, the UI).
    """


class JobStopped(SatError):
    """The job cannot go on; its status says why. The task fails (red) with this message."""


class NotApplicable(SatError):
    """This task has nothing to do in this run (e.g. an attempt that is not needed): it is skipped."""
