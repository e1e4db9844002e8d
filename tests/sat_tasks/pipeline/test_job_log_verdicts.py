"""The uploaded job log says why each attempt ended: SAT's verdict line after its last end line (issue 45.6)."""

from __future__ import annotations

from types import SimpleNamespace

from sat_tasks.core.handoffs import Verdict, VerdictKind
from sat_tasks.pipeline.steps import VERDICT_LINE_LIMIT, _with_verdict_lines

LOG = """2026-12-07T10:00:00+00:00 [sat] attempt 1 of job j on node local-1: log of rank 0 follows
CUDA error: an illegal memory access was encountered
2026-12-07T10:01:00+00:00 [sat] attempt 1 ended: exit status 1 (rank 0)
2026-12-07T10:01:00+00:00 [sat] attempt 1 ended: exit status 137 (rank 1)
2026-12-07T10:01:30+00:00 [sat] attempt 2 of job j on node local-2: log of rank 0 follows
step 100
2026-12-07T10:05:00+00:00 [sat] attempt 2 ended: exit status 0 (rank 0)"""


class _Run:
    def __init__(self, verdicts: dict[int, Verdict], exits: dict[int, int | None]):
        self.verdicts, self.exits = verdicts, exits

    def load_verdict(self, attempt: int) -> Verdict | None:
        return self.verdicts.get(attempt)

    def load_record(self, attempt: int):
        return SimpleNamespace(exit_code=self.exits[attempt]) if attempt in self.exits else None


def _annotated(tmp_path, run, text: str = LOG) -> list[str] | None:
    path = tmp_path / "job.log"
    path.write_text(text)
    copy = _with_verdict_lines(run, path, print)
    if copy is None:
        return None
    lines = copy.read_text().splitlines()
    copy.unlink()
    assert path.read_text() == text  # the live log is left as it is
    return lines


def test_each_attempt_gets_its_verdict_after_its_last_end_line(tmp_path):
    run = _Run({1: Verdict.of(VerdictKind.SUSPECT_NODE, ["e"], "illegal memory access with no Xid: relocate"),
                2: Verdict.of(VerdictKind.SUCCEEDED, [], "exit status 0")}, {1: 1, 2: 0})
    lines = _annotated(tmp_path, run)
    assert lines[4] == ("2026-12-07T10:01:00+00:00 [sat] verdict on attempt 1: SUSPECT_NODE: illegal memory "
                        "access with no Xid: relocate (exit status 1)")
    assert "ended" in lines[3] and "(rank 1)" in lines[3]  # after the last rank's end, not the first's
    assert lines[-1] == "2026-12-07T10:05:00+00:00 [sat] verdict on attempt 2: SUCCEEDED: exit status 0 (exit status 0)"
    assert len(lines) == len(LOG.splitlines()) + 2


def test_no_stored_verdict_leaves_the_log_unchanged_and_a_lost_node_has_no_exit_status(tmp_path):
    assert _annotated(tmp_path, _Run({}, {})) is None
    long = "x" * (VERDICT_LINE_LIMIT + 50)
    lines = _annotated(tmp_path, _Run({2: Verdict.of(VerdictKind.HARDWARE, [], long)}, {2: None}),
                       text=LOG.replace("\n2026-12-07T10:05:00+00:00", "\nnot a time"))
    assert lines[-1].endswith("x…" + " (no exit status)") and len(lines[-1]) < VERDICT_LINE_LIMIT + 120
    assert not any("verdict on attempt 1" in line for line in lines)
