"""The Training Job spec: a typed model of every field, its rule, and clear errors."""

from __future__ import annotations

import math
import re
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
S3_URI_RE = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")
TAG_KEY_RE = re.compile(r"^[A-Za-z0-9_.:/=+@-]{1,128}$")
SCHEDULE_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"}
MAX_TAGS = 50
# The engine's final-checkpoint grace period after SIGTERM; a job's env may set it
# (the default is `[sat] final_checkpoint_grace_seconds`).
GRACE_ENV = "CKPT_GRACE_SECONDS"
MAX_GRACE_SECONDS = 3600

# Server types a job can ask for; the Kubernetes backend maps them to GPU models.
SERVER_TYPES = {
    "cpu": {"gpu_model": None, "gpus": 0},
    "g2": {"gpu_model": "NVIDIA-H100-80GB-HBM3", "gpus": 8},
    "g3": {"gpu_model": "NVIDIA-B300", "gpus": 8},
}


class LearningType(str, Enum):
    """How capacity is bought: on-demand or Spot (pre-emptible)."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Framework(str, Enum):
    """The training framework the command uses."""

    PYTORCH = "pytorch"
    DEEPSPEED = "deepspeed"


class Backend(str, Enum):
    """Where `launch` runs the training."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


class FaultKind(str, Enum):
    """Faults the local backend can inject (tests and the demo)."""

    HARDWARE = "hardware"
    NODE_LOSS = "node_loss"
    PREEMPTION = "preemption"
    HANG = "hang"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def check_s3_uri(value: str) -> str:
    """Return the URI when it is a well-formed `s3://bucket[/prefix]`, else raise ValueError."""
    if not isinstance(value, str) or not S3_URI_RE.match(value):
        raise ValueError("must be an Object Storage URI s3://<bucket>/<prefix> (bucket 3-63 chars, lowercase)")
    key = S3_URI_RE.match(value).group("key") or ""
    if any(part == ".." for part in key.split("/")):
        raise ValueError("must not contain '..' path segments")
    return value


def split_s3_uri(uri: str) -> tuple[str, str]:
    """Split `s3://bucket/prefix` into (bucket, prefix)."""
    match = S3_URI_RE.match(uri)
    if not match:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    return match.group("bucket"), match.group("key") or ""


class Resources(_Model):
    """Compute asked for per node."""

    gpus_per_node: int = Field(0, description="GPUs per node (0-8)")
    memory: str = Field("8Gi", description="memory per node, a Kubernetes quantity such as 64Gi")
    shared_memory: str = Field("1Gi", description="size of /dev/shm, a Kubernetes quantity")
    server_type: str = Field("cpu", description="server type: cpu, g2 (8x H100) or g3 (8x B300)")
    cpu: str = Field("2", description="CPU cores per node, a Kubernetes quantity")

    @field_validator("gpus_per_node")
    @classmethod
    def _gpus(cls, v: int) -> int:
        if not 0 <= v <= 8:
            raise ValueError("must be between 0 and 8")
        return v

    @field_validator("memory", "shared_memory", "cpu")
    @classmethod
    def _quantity(cls, v: str) -> str:
        if not QUANTITY_RE.match(str(v)):
            raise ValueError("must be a Kubernetes quantity such as 512Mi, 8Gi or 2")
        return str(v)

    @field_validator("server_type")
    @classmethod
    def _server_type(cls, v: str) -> str:
        if v not in SERVER_TYPES:
            raise ValueError(f"must be one of {', '.join(sorted(SERVER_TYPES))}")
        return v

    @model_validator(mode="after")
    def _gpus_fit_server(self) -> Resources:
        limit = SERVER_TYPES[self.server_type]["gpus"]
        if self.gpus_per_node > limit:
            raise ValueError(f"gpus_per_node: server type {self.server_type} has {limit} GPUs per node")
        return self


class Image(_Model):
    """The training container image and the connection holding its registry credentials."""

    url: str = Field(description="image reference, e.g. registry.example.com/team/train:1.0")
    registry_conn_id: str | None = Field(None, description="Airflow connection id with the registry credentials")
    insecure: bool = Field(False, description="talk plain HTTP to the registry (test registries only)")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not 1 <= len(v) <= 512 or any(c.isspace() for c in v):
            raise ValueError("must be an image reference of 1-512 chars without spaces")
        if "@" in v.split("/")[0] and ":" in v.split("@")[0].split("/")[0]:
            raise ValueError("must not carry credentials; use registry_conn_id")
        return v

    @field_validator("registry_conn_id")
    @classmethod
    def _conn(cls, v: str | None) -> str | None:
        if v is not None and not CONN_ID_RE.match(v):
            raise ValueError("must be an Airflow connection id (letters, digits, _ . -)")
        return v


class Storage(_Model):
    """Where the training script comes from and an optional File Storage mount."""

    script_url: str | None = Field(None, description="s3:// URI of the training script (or a prefix ending in /)")
    file_storage_mount: str | None = Field(None, description="absolute mount path of a File Storage volume")

    @field_validator("script_url")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return None if v is None else check_s3_uri(v)

    @field_validator("file_storage_mount")
    @classmethod
    def _mount(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or ".." in v.split("/")):
            raise ValueError("must be an absolute path without '..'")
        return v


class DataSource(_Model):
    """Training data in Object Storage."""

    source: str = Field(description="s3:// prefix holding the training data")
    expectation_suite: str | None = Field(
        None, description="Great Expectations suite (JSON file under include/expectations) to run on the data"
    )

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return check_s3_uri(v)


class Results(_Model):
    """Where the results go."""

    destination: str = Field(description="s3:// prefix; results land under <destination>/<job>/<run_id>/")

    @field_validator("destination")
    @classmethod
    def _dest(cls, v: str) -> str:
        return check_s3_uri(v)


class SpotPolicy(_Model):
    """How a Spot job waits for capacity and resumes."""

    max_resumes: int = Field(3, description="resumes after pre-emption (0-5)")
    max_wait_seconds: int = Field(3600, description="total time to wait for capacity (like MaxWaitTimeInSeconds)")
    poll_seconds: float = Field(30, description="how often to look for capacity")

    @field_validator("max_resumes")
    @classmethod
    def _resumes(cls, v: int) -> int:
        if not 0 <= v <= 5:
            raise ValueError("must be between 0 and 5")
        return v

    @field_validator("max_wait_seconds", "poll_seconds")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v


class Fault(_Model):
    """A fault the local backend injects into one attempt."""

    kind: FaultKind
    attempt: int = Field(1, description="1-based attempt the fault hits")
    at_step: int | None = Field(None, description="training step (from progress.json) at which to strike")
    after_seconds: float | None = Field(None, description="seconds after launch at which to strike")
    xid: int = Field(79, description="NVIDIA Xid written to the node's kernel log (hardware faults)")
    capacity_delay_seconds: float = Field(
        0, description="preemption: seconds before the local pool has Spot capacity again"
    )

    @model_validator(mode="after")
    def _when(self) -> Fault:
        if (self.at_step is None) == (self.after_seconds is None):
            raise ValueError("set exactly one of at_step or after_seconds")
        if self.attempt < 1:
            raise ValueError("attempt must be >= 1")
        return self


class TrainingJob(_Model):
    """A Training Job: one spec, one DAG."""

    name: str = Field(description="3-63 chars: lowercase letters, digits, '-', '.'; alphanumeric at both ends")
    learning_type: LearningType = Field(LearningType.ON_DEMAND, description="on-demand or spot")
    framework: Framework = Field(Framework.PYTORCH, description="pytorch or deepspeed")
    job_failover: bool = Field(False, description="fail over to another node on a hardware fault (not with spot)")
    resources: Resources = Field(default_factory=Resources)
    nodes: int = Field(1, description="number of nodes; distributed from 2")
    image: Image
    storage: Storage = Field(default_factory=Storage)
    data: DataSource
    results: Results
    command: str = Field(description="the training command, 3-1024 chars")
    tags: dict[str, str] = Field(default_factory=dict, description="at most 50 key/value pairs")
    schedule: str | None = Field(None, description="cron, a preset such as @daily, or asset:<s3 uri>")
    backend: Backend | None = Field(None, description="local or kubernetes; default from airflow.cfg [sat] backend")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for the training process "
                                     "(CKPT_GRACE_SECONDS: the final checkpoint's grace period, 0-3600 s)")
    spot: SpotPolicy = Field(default_factory=SpotPolicy)
    faults: list[Fault] = Field(default_factory=list, description="injected faults (local backend only)")
    heartbeat_timeout_seconds: float = Field(300, description="no training progress for this long = a hang")
    max_failovers: int = Field(3, description="hardware failovers at most (0-3)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v) or ".." in v:
            raise ValueError(
                "must be 3-63 chars of lowercase letters, digits, '-' or '.', "
                "starting and ending with a letter or digit"
            )
        return v

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: int) -> int:
        if not 1 <= v <= 64:
            raise ValueError("must be between 1 and 64")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        if not 3 <= len(v) <= 1024:
            raise ValueError("must be 3-1024 chars")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} key/value pairs (got {len(v)})")
        for key, value in v.items():
            if not TAG_KEY_RE.match(key):
                raise ValueError(f"key {key!r} must be 1-128 chars of letters, digits or _.:/=+@-")
            if len(str(value)) > 256:
                raise ValueError(f"value of {key!r} must be at most 256 chars")
        return {k: str(val) for k, val in v.items()}

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None or v in SCHEDULE_PRESETS:
            return v
        if v.startswith("asset:"):
            check_s3_uri(v[len("asset:"):])
            return v
        from croniter import croniter

        if len(v.split()) not in (5, 6) or not croniter.is_valid(v):
            raise ValueError("must be a cron expression, a preset (@daily, @hourly, ...) or asset:s3://...")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        v = {k: str(val) for k, val in v.items()}
        if GRACE_ENV in v:
            # Sizes the pod's grace period and the launchers' SIGKILL, so it is checked here
            # and not first by the engine after the Spot notice.
            try:
                grace = float(v[GRACE_ENV])
            except ValueError:
                grace = math.nan
            if not 0 < grace <= MAX_GRACE_SECONDS:
                raise ValueError(f"{GRACE_ENV}={v[GRACE_ENV]!r}: the final checkpoint's grace period must be "
                                 f"a number of seconds > 0 and <= {MAX_GRACE_SECONDS}")
        return v

    @field_validator("max_failovers")
    @classmethod
    def _failovers(cls, v: int) -> int:
        if not 0 <= v <= 3:
            raise ValueError("must be between 0 and 3")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJob:
        if self.job_failover and self.learning_type is LearningType.SPOT:
            raise ValueError("job_failover: not allowed with learning_type spot (Spot jobs resume instead)")
        if self.faults and self.backend is Backend.KUBERNETES:
            raise ValueError("faults: fault injection is only allowed on the local backend")
        if self.resources.gpus_per_node == 0 and self.resources.server_type != "cpu":
            raise ValueError("resources.gpus_per_node: must be >= 1 on a GPU server type")
        return self

    # ---- derived values -------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        """True when the job spans two or more nodes."""
        return self.nodes >= 2

    @property
    def is_spot(self) -> bool:
        """True for Spot jobs."""
        return self.learning_type is LearningType.SPOT

    def max_attempts(self) -> int:
        """Attempts the DAG unrolls: the first one plus failovers or Spot resumes."""
        extra = self.spot.max_resumes if self.is_spot else (self.max_failovers if self.job_failover else 0)
        return 1 + extra

    def with_backend(self, backend: Backend | str) -> TrainingJob:
        """Return a copy with the backend resolved (the spec wins over the default)."""
        resolved = self.backend or Backend(backend)
        return TrainingJob.model_validate({**self.model_dump(mode="json"), "backend": resolved.value})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (no secrets: a spec never holds one)."""
        return self.model_dump(mode="json")


class SpecProblem(BaseModel):
    """One problem in a spec: the field path and the rule it breaks."""

    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


class SpecError(ValueError):
    """A spec breaks one or more rules; `problems` lists them all."""

    def __init__(self, source: str, problems: list[SpecProblem]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


class SpecFileErrors(ImportError):
    """One or more job spec files break rules; the message lists `<file>: <field>: <rule>` lines."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__(
            f"{len(errors)} job spec file(s) are invalid and have no DAG:\n" + "\n".join(errors.values())
        )


def _problems_from(exc: ValidationError) -> list[SpecProblem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"])
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "enum":
            msg = f"must be one of {err.get('ctx', {}).get('expected', '')}".strip()
        # Cross-field messages name their own field ("job_failover: ...").
        if not loc and ": " in msg:
            loc, msg = msg.split(": ", 1)
        problems.append(SpecProblem(field=loc or "<spec>", rule=msg))
    return problems


def parse_spec(data: Any, source: str = "<spec>") -> TrainingJob:
    """Validate a mapping into a TrainingJob or raise SpecError listing every problem."""
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem(field="<spec>", rule="must be a mapping of fields")])
    try:
        return TrainingJob.model_validate(data)
    except ValidationError as exc:
        problems = _problems_from(exc)
        # Cross-field rules run only on a field-valid model; report them now too.
        for extra in _raw_cross_field_problems(data):
            if all(p.field != extra.field for p in problems):
                problems.append(extra)
        raise SpecError(source, problems) from None


def _raw_cross_field_problems(data: dict[str, Any]) -> list[SpecProblem]:
    problems = []
    if data.get("job_failover") is True and data.get("learning_type") == LearningType.SPOT.value:
        problems.append(SpecProblem(field="job_failover", rule="not allowed with learning_type spot (Spot jobs resume instead)"))
    if data.get("faults") and data.get("backend") == Backend.KUBERNETES.value:
        problems.append(SpecProblem(field="faults", rule="fault injection is only allowed on the local backend"))
    return problems


def load_spec(path: str | Path) -> TrainingJob:
    """Read and validate one YAML spec file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(path), [SpecProblem(field="<file>", rule=f"cannot be read: {exc}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(str(path), [SpecProblem(field="<file>", rule=f"is not valid YAML{where}")]) from None
    return parse_spec(data, source=str(path))


def dag_id_for(job: TrainingJob) -> str:
    """The DAG id of a job spec: its name (valid job names are valid DAG ids)."""
    return job.name
