"""SIGTERM handling: the grace period bounds how long a final checkpoint may take; the exit status is 143."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckpt_engine.signals import GracefulTermination

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, signal, sys, time
from ckpt_engine.signals import GracefulTermination
term = GracefulTermination(float(sys.argv[1]), on_timeout=lambda: print("grace expired", flush=True))
term.install()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(float(sys.argv[2]))  # the final checkpoint takes this long
print("requested", term.requested, flush=True)
term.finish()
"""


@pytest.mark.parametrize("grace, work, expired", [pytest.param(5.0, 0.2, False, id="within-grace"),
                                                  pytest.param(0.5, 30.0, True, id="grace-expired")])
def test_exit_status_and_grace(grace: float, work: float, expired: bool) -> None:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(grace), str(work)], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert result.returncode == 143, result.stderr
    assert "SIGKILLs its ranks" not in result.stderr  # no launcher above a plain process
    assert ("grace expired" in result.stdout) is expired
    assert ("requested True" in result.stdout) is not expired
    assert time.monotonic() - start < 25  # not the 30 s of work: the signal ended it


def test_a_launcher_that_sigkills_early_is_named_at_start(tmp_path: Path) -> None:
    """Under the real `deepspeed` launcher a grace period over its hard-coded 30 s is called out."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from ckpt_engine.signals import GracefulTermination\n"
        "for grace in (20.0, 60.0):\n"
        "    GracefulTermination(grace).install()\n"
        "    print('installed', grace, file=sys.stderr, flush=True)\n"
    )
    venv_bin = str(Path(sys.executable).parent)
    result = subprocess.run(["deepspeed", "--no_local_rank", "--num_gpus", "1", str(script)], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{venv_bin}:{os.environ['PATH']}"))
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    before_60 = out[out.index("installed 20.0"):out.index("installed 60.0")]
    assert "deepspeed.launcher.launch SIGKILLs its ranks 30s after SIGTERM" in before_60
    assert "grace period of 60s" in before_60
    assert "SIGKILLs its ranks" not in out[:out.index("installed 20.0")]  # 20 s fit in the launcher's 30 s


def test_the_sigterm_handler_starts_no_thread_and_logs_nothing_itself(caplog) -> None:
    """The handler runs between two bytecodes of whatever the main thread does: it takes no lock that code may hold.

    Starting a thread there (``threading``'s registry lock) or logging (a stream's buffer) can
    deadlock or raise when the signal lands inside the same call in the main thread; the
    watchdog is started by ``install()`` and says what the request was.
    """
    term = GracefulTermination(60.0)
    assert term.install()
    try:
        threads = threading.active_count()
        with caplog.at_level(logging.WARNING, logger="ckpt_engine"):
            term._handle(signal.SIGTERM, None)
            term._handle(signal.SIGTERM, None)  # a second one: nothing new
            assert threading.active_count() == threads
            assert term.requested and term._said.wait(30)
        said = [r.getMessage() for r in caplog.records if "finishing the in-flight" in r.getMessage()]
        assert said == [("[Concurrent Checkpoint] SIGTERM received: finishing the in-flight checkpoint and "
                         "taking a final one within 60s")]
    finally:
        term.uninstall()
        term._finished.set()  # the watchdog returns instead of exiting this process
