"""A job spec's `test:` section: how SAT's pytest plugin makes the job short and which failures it rehearses.

The section changes nothing in production: the DAG ignores it. The plugin
(`sat_tasks.testing`) reads it to run the job on the local backend with

- `max_steps` / `save_steps`, passed to the script as `SAT_MAX_STEPS` / `SAT_SAVE_STEPS`
  (the spec's command reads them with a default, e.g. `--max_steps "${SAT_MAX_STEPS:-5000}"`),
- `data_sample`: the first N objects of `data.source` only,
- `seed`: repository files put into the embedded Object Storage first (script, data),
- `rehearse`: one run per scenario, each with the outcome SAT's rules must reach.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ckpt_engine.contract import MAX_STEPS_ENV, SAVE_STEPS_ENV
from sat_tasks.spec.uris import S3_URI_PATTERN, S3_URI_RULE


class Scenario(str, Enum):
    """Failures a rehearsal can stage (local backend)."""

    HARDWARE_FAULT = "hardware_fault"  # a GPU falls off the bus (Xid 79) at step N: fail over, or fail
    SPOT_RECLAIM = "spot_reclaim"  # the Spot node is reclaimed (SIGTERM) at step N: wait, resume
    USER_ERROR = "user_error"  # the script raises at step N: internal error, no retry


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rehearsal(_Model):
    """One failure to rehearse, and optionally the final status the user expects (else SAT's rules decide)."""

    scenario: Scenario = Field(description="the failure: hardware_fault (Xid 79), spot_reclaim (SIGTERM) or "
                                           "user_error (the script raises)")
    at_step: int = Field(ge=1, description="training step at which the failure strikes")
    expect_status: str | None = Field(None, description="final job status to expect (default: what SAT's "
                                                        "restart policy implies for this job)")

    @property
    def label(self) -> str:
        """The test id: `<scenario>@<step>`."""
        return f"{self.scenario.value}@{self.at_step}"


class SeedObject(_Model):
    """A file or folder of the repository (`from`, relative to the spec file) put at `to` in Object Storage."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    source: str = Field(alias="from", min_length=1, description="file or folder, relative to the spec file")
    to: str = Field(pattern=S3_URI_PATTERN, description=S3_URI_RULE)


class JobTest(_Model):
    """The `test:` section of a spec (read by `sat test` and the pytest plugin only)."""

    max_steps: int | None = Field(None, ge=1, description=f"{MAX_STEPS_ENV} for the script in test runs")
    save_steps: int | None = Field(None, ge=1, description=f"{SAVE_STEPS_ENV}: a checkpoint every K steps")
    data_sample: int | None = Field(None, ge=1, description="test runs read only the first N data objects")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for test runs")
    seed: list[SeedObject] = Field(default_factory=list, description="repository files to put into the "
                                                                     "embedded Object Storage before the runs")
    smoke: bool = Field(True, description="generate the end-to-end smoke test")
    rehearse: list[Rehearsal] = Field(default_factory=list, description="failures to rehearse, one test run "
                                                                       "each (each scenario@step once)")

    @model_validator(mode="after")
    def _unique_labels(self) -> JobTest:
        labels = [r.label for r in self.rehearse]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"rehearse: scenario listed twice: {', '.join(duplicates)}")
        return self
