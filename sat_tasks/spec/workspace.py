"""The Training Workspace model: reserved nodes for a team (name, per-node allocation, node count, contract period).

A workspace is a YAML file under `include/workspaces/` (`[sat] workspaces_dir`); the
`sat workspace` command and the Training Jobs view's Workspaces page write the same files
(`sat_tasks.io.workspaces`). Errors read `<field>: <rule>` as a job spec's do
(`parse_workspace` / `load_workspace` raise `SpecError`). What a job may ask of a
workspace (its nodes, server type, contract dates) is `sat_tasks.core.workspaces`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sat_tasks.spec.loading import SpecError, SpecProblem, problems_from, read_yaml_file
from sat_tasks.spec.model import (
    QUANTITY_RULE,
    ServerType,
    WarmPool,
    check_gpus_fit_server,
    positive_quantity,
    ruled,
)
from sat_tasks.spec.quantities import QUANTITY_PATTERN

# Lowercase letters, digits, '-' and '.', at most 63 chars, alphanumeric at both ends: a
# Kubernetes label value and object name (the node label, the Kueue queues are named after it).
WORKSPACE_NAME_PATTERN = r"^[a-z0-9](?:(?:[a-z0-9-]|\.[a-z0-9-])*(?:[a-z0-9]|\.[a-z0-9]))?$"
WORKSPACE_NAME_RULE = ("must be 1-63 chars of lowercase letters, digits, '-' or '.', "
                       "starting and ending with a letter or digit")
MAX_WORKSPACE_NODES = 64


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkspaceResources(_Model):
    """What each node of the workspace has: the server type, its GPUs, memory and CPUs."""

    server_type: ServerType = Field("cpu", description="server type: cpu, g2 (8x H100) or g3 (8x B300)")
    gpus_per_node: int = ruled(0, rule="must be between 0 and 8", ge=0, le=8, description="GPUs per node (0-8)")
    memory: str = ruled("16Gi", rule=QUANTITY_RULE, pattern=QUANTITY_PATTERN,
                        description="memory per node, a Kubernetes quantity such as 1600Gi")
    cpu: str = ruled("4", rule=QUANTITY_RULE, pattern=QUANTITY_PATTERN, description="CPU cores per node")

    @field_validator("memory", "cpu")
    @classmethod
    def _positive(cls, v: str) -> str:
        return positive_quantity(v)

    @model_validator(mode="after")
    def _gpus_fit_server(self) -> WorkspaceResources:
        check_gpus_fit_server(self.server_type, self.gpus_per_node)
        if self.gpus_per_node == 0 and self.server_type != "cpu":
            raise ValueError("gpus_per_node: must be >= 1 on a GPU server type")
        return self


class Contract(_Model):
    """The contract period: the workspace's nodes are reserved from `start` to `end` (both days included)."""

    start: dt.date = Field(description="first day of the contract (YYYY-MM-DD)")
    end: dt.date = Field(description="last day of the contract (YYYY-MM-DD)")

    @model_validator(mode="after")
    def _ordered(self) -> Contract:
        if self.end < self.start:
            raise ValueError(f"end: must be on or after start ({self.start.isoformat()})")
        return self

    def covers(self, day: dt.date) -> bool:
        """Whether `day` lies in the contract period."""
        return self.start <= day <= self.end

    def describe(self) -> str:
        return f"{self.start.isoformat()} to {self.end.isoformat()}"


class Workspace(_Model):
    """A Training Workspace: `nodes` reserved nodes of one allocation for a contract period.

    Jobs name it (`workspace: NAME`) and run only on its nodes; they queue for its capacity
    (one slot per node). Editing `nodes` takes effect for the next job that starts.
    """

    name: str = ruled(rule=WORKSPACE_NAME_RULE, min_length=1, max_length=63, pattern=WORKSPACE_NAME_PATTERN,
                      description="1-63 chars: lowercase letters, digits, '-', '.'; alphanumeric at both ends")
    description: str = ruled("", rule="must be at most 256 chars", max_length=256, description="what it is for")
    resources: WorkspaceResources = Field(default_factory=WorkspaceResources)
    nodes: int = ruled(rule=f"must be between 1 and {MAX_WORKSPACE_NODES}", ge=1, le=MAX_WORKSPACE_NODES,
                       description="reserved nodes; distributed training from 2")
    contract: Contract
    warm_pool: WarmPool | None = Field(
        None, description="keep its jobs' runs warm for their next run (a job's own warm_pool wins; not for spot jobs)")

    def to_dict(self) -> dict[str, Any]:
        """The YAML form (dates as YYYY-MM-DD); what the store writes."""
        return self.model_dump(mode="json", exclude_defaults=False)

    def with_nodes(self, nodes: int) -> Workspace:
        """A copy with another node count (validated)."""
        return parse_workspace({**self.to_dict(), "nodes": nodes}, source=self.name)


def parse_workspace(data: Any, source: str = "<workspace>") -> Workspace:
    """Validate a mapping into a Workspace or raise SpecError listing every problem."""
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem(field="<workspace>", rule="must be a mapping of fields")])
    try:
        return Workspace.model_validate(data)
    except ValidationError as exc:
        problems = problems_from(exc, Workspace)
        for problem in problems:
            if problem.field.startswith("contract.") and "date" in problem.rule.lower():
                problem.rule = "must be a date YYYY-MM-DD"
        raise SpecError(source, problems) from None


def load_workspace(path: str | Path) -> Workspace:
    """Read and validate one workspace YAML file."""
    return parse_workspace(read_yaml_file(path), source=str(path))
