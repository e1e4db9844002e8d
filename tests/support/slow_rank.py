"""A stand-in training rank with a slow final checkpoint, shared by the launcher tests of both backends."""

from __future__ import annotations

import textwrap
from pathlib import Path

# A rank that needs `save_s` seconds for its final checkpoint after SIGTERM (its handler may
# run twice: the launcher forwards the signal the group already got).
RANK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
    os.makedirs(out, exist_ok=True)
    save_s = float(sys.argv[1])
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("rank: final checkpoint started", flush=True)
        time.sleep(save_s)
        open(os.path.join(out, "final"), "w").write(str(os.getpid()))
        print("rank: final checkpoint committed", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    open(os.path.join(out, "rank.pid"), "w").write(str(os.getpid()))
    with open(os.path.join(out, "progress.json"), "w") as f:
        json.dump({"step": 1}, f)
    while True:
        time.sleep(0.05)
    """
)


def running(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
