"""Rehearsals in SAT's test harness: the failure strikes at step N of the first attempt, however fast the script trains.

SAT's test harness puts this directory first on PYTHONPATH of a rehearsal's command and sets
SAT_REHEARSE_AT_STEP, SAT_REHEARSE_ACTION and SAT_REHEARSE_ATTEMPT; Python imports
`sitecustomize` at start-up. A thread watches the checkpoint engine's progress.json (the
file the launcher's fault injection reads) and, once it reports step N of that attempt,
interrupts the main thread through a signal handler:

- `raise` (scenario user_error): the script dies with a Python traceback, exit status 1,
  as a bug in user code would;
- `hold` (hardware_fault, spot_reclaim): training pauses at that step until the launcher
  injects the fault (SIGKILL, or SIGTERM, which is passed on to the script's own handler so
  the engine takes its final checkpoint), at most SAT_REHEARSE_HOLD_SECONDS. A tiny test
  model trains faster than the launcher polls; without the hold it could finish first.

Without SAT_REHEARSE_AT_STEP, or in another attempt, this module does nothing. The names
are the runtime contract's (`ckpt_engine.contract`: the vendored engine is on PYTHONPATH).
"""

import os
import signal
import sys
import threading
import time

from ckpt_engine import contract

_AT = os.environ.get(contract.REHEARSE_AT_STEP_ENV)
_ACTION = os.environ.get(contract.REHEARSE_ACTION_ENV, "raise")
_ATTEMPT = os.environ.get(contract.REHEARSE_ATTEMPT_ENV, "1")
_HOLD_SECONDS = float(os.environ.get(contract.REHEARSE_HOLD_SECONDS_ENV, "120"))
_LAUNCHERS = ("torchrun", "deepspeed")


class RehearsedUserError(RuntimeError):
    """Raised inside the training script by SAT's user_error rehearsal."""


def _raise(signum, frame):
    raise RehearsedUserError(f"rehearsed user error at step >= {_AT} (SAT test harness, scenario user_error)")


def _hold(signum, frame):
    released = []
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(sig, frm):
        released.append(sig)
        signal.signal(signal.SIGTERM, previous)
        if callable(previous):
            previous(sig, frm)
        elif previous == signal.SIG_DFL:  # no handler of the script's own: die of it as the script would
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"[sat test] rehearsal: training held at step >= {_AT} until the injected failure strikes", flush=True)
    deadline = time.monotonic() + _HOLD_SECONDS
    while not released and time.monotonic() < deadline:
        time.sleep(0.05)
    if not released:
        signal.signal(signal.SIGTERM, previous)
        print(f"[sat test] rehearsal: no failure came within {_HOLD_SECONDS:.0f}s; training goes on", flush=True)


def _watch(path, at_step, attempt):
    time.sleep(0.1)  # sys.argv is set once start-up is over
    if os.path.basename((getattr(sys, "argv", None) or [""])[0]).startswith(_LAUNCHERS):
        return  # a launcher: its ranks act
    while True:
        time.sleep(0.05)
        try:
            with open(path, "rb") as handle:
                progress = contract.ProgressRecord.from_json(handle.read())
        except OSError:
            continue
        mine = progress.attempt in (None, attempt)
        if mine and int(progress.step or 0) >= at_step:
            os.kill(os.getpid(), signal.SIGUSR2)
            return


if _AT and os.environ.get(contract.ATTEMPT_ENV, "1") == _ATTEMPT:
    signal.signal(signal.SIGUSR2, _hold if _ACTION == "hold" else _raise)
    _progress = os.path.join(os.environ.get(contract.OUTPUT_DIR_ENV, "."), contract.CONCURRENT_DIR,
                             contract.PROGRESS_NAME)
    threading.Thread(target=_watch, args=(_progress, int(_AT), int(_ATTEMPT)), daemon=True,
                     name="sat-rehearsal").start()
