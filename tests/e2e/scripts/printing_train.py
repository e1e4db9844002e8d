"""A stand-in trainer that prints lines of its own and exits with a code of its own on chosen attempts.

For the classification rehearsals (issue 43, tests/e2e/test_rehearsals.py): on the attempts named
in PRINT_ON_ATTEMPTS (comma-separated SAT_ATTEMPT values, or "all") it trains PRINT_AT_STEP steps,
prints PRINT_LINES (its lines) as the training's own output, and exits PRINT_EXIT (default 1);
on any other attempt it is fake_train.py (staged beside it).
"""

import json
import os
import runpy
import sys
import time

attempt = os.environ.get("SAT_ATTEMPT", "")
chosen = os.environ.get("PRINT_ON_ATTEMPTS", "")
if chosen == "all" or attempt in chosen.split(","):
    out = os.path.join(os.environ["SAT_OUTPUT_DIR"], "concurrent_checkpoint")
    os.makedirs(out, exist_ok=True)
    for step in range(1, int(os.environ.get("PRINT_AT_STEP", "3")) + 1):
        time.sleep(0.05)
        with open(os.path.join(out, "progress.json.tmp"), "w") as handle:
            json.dump({"step": step, "last_committed_step": None, "committed_steps": [],
                       "resumed_from_step": None, "attempt": int(attempt) if attempt.isdigit() else None}, handle)
        os.replace(os.path.join(out, "progress.json.tmp"), os.path.join(out, "progress.json"))
    for line in os.environ.get("PRINT_LINES", "").splitlines():
        print(line, file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("PRINT_EXIT", "1")))
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_train.py"), run_name="__main__")
