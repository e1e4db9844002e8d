"""The typed hand-offs between a job's tasks: Plan (what an attempt does), Verdict (what happened), Decision (what next).

Each travels through XCom as the JSON of `to_xcom()` and comes back with `from_xcom()`;
kinds and actions are enums, so no task compares string literals. Call order per attempt:

    plan = plan_attempt(job, k, previous_decision)      # core.policy
    record = <the backend runs the attempt>
    verdict = classify(record)                          # sat_tasks.classify
    decision = decide_next(job, plan, verdict, now=...) # core.policy
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ckpt_engine.contract import LAST_STEP_ENV
from sat_tasks.core.status import JobStatus

#: Where a task function, a backend or a store says what it did: one line at a time (`print`, a task's logger).
Log = Callable[[str], None]

C = TypeVar("C", bound="Contract")


class VerdictKind(str, Enum):
    """What happened to an attempt, as far as the next step of the DAG cares."""

    SUCCEEDED = "SUCCEEDED"
    HARDWARE = "HARDWARE"
    PREEMPTED = "PREEMPTED"
    INTERNAL = "INTERNAL"
    IMAGE_PULL = "IMAGE_PULL"
    # An error one pod cannot pin on the node or the job (the classifier's "ambiguous:" HARDWARE):
    # the job fails over once to tell them apart (`core.node_health`, ADR 0004).
    SUSPECT_NODE = "SUSPECT_NODE"
    # A person stopped the job while the attempt ran: whatever signal ended it was theirs (never the
    # node's); `core.policy.stopped_verdict` derives it from the run's stop request after the classifier.
    STOPPED = "STOPPED"
    # The launcher stopped an elastic attempt on fewer nodes so that the job grows back onto more (ADR 0029):
    # neither a preemption nor a fault, and no failover is spent; `core.policy.grow_verdict` derives it from
    # the record's `planned_restart` after the classifier (never the classifier's own answer).
    PLANNED_RESTART = "PLANNED_RESTART"


class Action(str, Enum):
    """What a decision tells the next attempt group (or upload) to do."""

    UPLOAD = "upload"
    FAILOVER = "failover"
    RESUME = "resume"
    STOP = "stop"


class Contract(BaseModel):
    """A record that crosses a task boundary: frozen, no unknown fields, JSON through XCom."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_xcom(self) -> dict[str, Any]:
        """The JSON-able form a task returns (and Airflow stores as XCom)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_xcom(cls, data: dict[str, Any] | Self | None) -> Self | None:
        """The model back from an XCom value; None stays None (the upstream task was skipped)."""
        if data is None or isinstance(data, cls):
            return data
        return cls.model_validate(data)


class Plan(Contract):
    """What attempt `attempt` does: where it must not run and from which step it resumes."""

    attempt: int = Field(ge=1)
    exclude_nodes: list[str] = Field(default_factory=list, description="nodes of failed attempts")
    resume_step: int | None = Field(None, description=f"{LAST_STEP_ENV}; -1 = newest complete; None = fresh start")
    failovers: int = Field(0, ge=0, description="hardware failovers used before this attempt")
    resumes: int = Field(0, ge=0, description="Spot resumes used before this attempt")
    interruptions: int = Field(0, ge=0, description="resumes after an interruption from outside (`INTERRUPTED`) used "
                                                    "before this attempt (`TrainingJob.max_interruptions`)")


#: The reason's prefix of a PREEMPTED verdict decided by who ended the attempt: an interruption from outside
#: (an unnamed SIGTERM/SIGKILL, a controller, a reclaimed node) with no evidence of a fault (ADR 0004). It is
#: resumed without blame, within a budget of its own (`TrainingJob.max_interruptions`, `core.policy`).
INTERRUPTED = "interrupted:"


class Verdict(Contract):
    """The classifier's answer: a kind, the evidence lines that decided it, and why.

    `attempt`, `node` and `last_committed_step` say which attempt it is about, where it
    ran, and the newest checkpoint it committed (what a resume starts from).
    """

    kind: VerdictKind
    evidence: list[str] = Field(default_factory=list)
    reason: str = ""
    attempt: int | None = None
    node: str | None = None
    last_committed_step: int | None = None

    @classmethod
    def of(cls, kind: VerdictKind, evidence: list[str], reason: str) -> Verdict:
        """A verdict from its three parts (what the classifier builds)."""
        return cls(kind=kind, evidence=list(evidence), reason=reason)


class Decision(Contract):
    """What follows an attempt, and the job status it records (if any) with its reason."""

    attempt: int
    verdict: VerdictKind
    action: Action
    why: str
    exclude_nodes: list[str] = Field(default_factory=list)
    failovers: int = 0
    resumes: int = 0
    interruptions: int = 0
    resume_step: int = -1
    status: JobStatus | None = Field(None, description="the job status this decision records")
    preempted_at: float | None = Field(None, description="epoch seconds of the pre-emption (Spot)")
    capacity_at: float | None = Field(None, description="local pool: epoch seconds when Spot capacity returns")

    @property
    def needs_attempt(self) -> bool:
        """Whether another attempt follows (fail over or resume)."""
        return self.action in (Action.FAILOVER, Action.RESUME)
