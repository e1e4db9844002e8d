"""Multi-node attempts: which rank's record speaks for the attempt."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sat_tasks.classify.classifier import classify
from sat_tasks.classify.ended import INTERRUPTED
from sat_tasks.classify.rules import PEER_STOP_REASON
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Log, VerdictKind

# Verdict reasons that a healthy rank shows when a *peer* (or the network between them)
# failed, and the exit of a rank stopped from outside by the gang teardown. A rank with
# such a verdict only does not decide a multi-node attempt while another rank has
# evidence of its own.
PEER_SYMPTOM_REASONS = re.compile(
    r"NCCL network error|NCCL remote error|InfiniBand transport error|gloo network error"
    r"|collective operation hung|collective or peer operation timed out|rendezvous store timed out"
    r"|did not reach the barrier or its communicator was aborted"
    r"|NCCL system error on a socket|killed by SIG(?:TERM|KILL|HUP) from outside"
)


def combine_rank_records(records: Sequence[AttemptRecord], log: Log = print) -> AttemptRecord:
    """The record that speaks for a multi-node attempt (records in rank order).

    Precedence: a pre-empted rank (with evidence of the preemption); a rank with hardware
    evidence of its own; a rank whose image could not be pulled; a rank with an internal error
    of its own; a rank that only shows a peer's failure (NCCL/gloo network errors) or was
    interrupted from outside with no evidence of a fault ("interrupted:", ADR 0004: the gang's
    teardown stops the healthy ranks so); a rank that stopped because another rank got SIGTERM
    (the one that got it comes first); else (every rank succeeded) rank 0. So an attempt whose
    every rank was interrupted stays interrupted, and one rank's own fault outranks the rest. The chosen rank's node is the one a failover avoids.
    Its progress is the newest checkpoint every rank has committed.
    """
    if len(records) == 1:
        return records[0]
    verdicts = [classify(record) for record in records]

    def order(index: int) -> int:
        verdict = verdicts[index]
        peer_only = verdict.kind is VerdictKind.HARDWARE and bool(PEER_SYMPTOM_REASONS.search(verdict.reason))
        if PEER_STOP_REASON in verdict.reason and verdict.kind in (VerdictKind.HARDWARE, VerdictKind.PREEMPTED):
            return 5
        if verdict.kind is VerdictKind.PREEMPTED and verdict.reason.startswith(INTERRUPTED):
            return 4
        if verdict.kind is VerdictKind.HARDWARE:
            return 4 if peer_only else 1
        return {VerdictKind.PREEMPTED: 0, VerdictKind.IMAGE_PULL: 2, VerdictKind.INTERNAL: 3,
                VerdictKind.SUCCEEDED: 6}[verdict.kind]

    chosen = min(range(len(records)), key=lambda i: (order(i), i))
    for rank, verdict in enumerate(verdicts):
        log(f"rank {rank} on {records[rank].node}: {verdict.kind.value} — {verdict.reason}")
    log(f"rank {chosen} decides the attempt")
    committed = [r.last_committed_step for r in records if r.last_committed_step is not None]
    if committed:
        return records[chosen].with_progress(last_committed_step=min(committed))
    return records[chosen]
