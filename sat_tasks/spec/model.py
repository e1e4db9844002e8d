"""The Training Job model: every field, its rule as a constraint JSON Schema can carry, and the cross-field rules.

Rules that JSON Schema can express (lengths, patterns, ranges, enums) are field
constraints, so `TrainingJob.model_json_schema()` carries them (`sat schema` prints it,
the generic DAG's form is built from it). Each constrained field also carries its rule in
the service's words (`x-rule` in the schema); `sat_tasks.spec.loading` turns a broken
constraint into `<field>: <rule>`. What a schema cannot say (a cron expression, a
quantity's value, spot without failover, GPUs of a server type) stays a validator.
"""

from __future__ import annotations

import importlib.util
import math
import pkgutil
import re
from enum import Enum
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from ckpt_engine.contract import GRACE_ENV, PROGRESS_NAME
from sat_tasks.spec.file_storage import VOLUME_NAME_RULE, check_volume_name
from sat_tasks.spec.quantities import QUANTITY_PATTERN, parse_quantity
from sat_tasks.spec.testing import JobTest
from sat_tasks.spec.uris import S3_URI_PATTERN, S3_URI_RULE, check_s3_uri

NAME_PATTERN = r"^[a-z0-9](?:(?:[a-z0-9-]|\.[a-z0-9-])*(?:[a-z0-9]|\.[a-z0-9]))?$"
NAME_RULE = (
    "must be 3-63 chars of lowercase letters, digits, '-' or '.', starting and ending with a letter or digit"
)
CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
TAG_KEY_PATTERN = r"^[A-Za-z0-9_.:/=+@-]{1,128}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
QUANTITY_RULE = "must be a Kubernetes quantity such as 512Mi, 8Gi, 500m or 2"
# A suite is looked up under the project's suites directory (include/expectations) on the worker.
SUITE_PATTERN = r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*$"
SUITE_RULE = ("must be a suite name or a relative path inside include/expectations: letters, digits, '_', '-' "
              "and '.', parts joined by '/', no '.' or '..' part, not absolute")
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")
MAX_TAGS = 50
MAX_KEEP_ALIVE_SECONDS = 3600  # the warm pool's keep-alive at most (SageMaker's limit too)
# The engine's final-checkpoint grace period after SIGTERM (GRACE_ENV, the runtime contract's);
# a job's env may set it (the default is `[sat] final_checkpoint_grace_seconds`).
MAX_GRACE_SECONDS = 3600

# Server types a job can ask for; the Kubernetes backend maps them to GPU models.
SERVER_TYPES: dict[str, dict[str, Any]] = {
    "cpu": {"gpu_model": None, "gpus": 0},
    "g2": {"gpu_model": "NVIDIA-H100-80GB-HBM3", "gpus": 8},
    "g3": {"gpu_model": "NVIDIA-B300", "gpus": 8},
}
ServerType = Literal["cpu", "g2", "g3"]


def ruled(default: Any = ..., *, rule: str, description: str | None = None, **constraints: Any) -> Any:
    """A field whose constraints come with their rule in words (`x-rule`), for errors and forms."""
    return Field(default, description=description or rule, json_schema_extra={"x-rule": rule}, **constraints)


def positive_quantity(v: str) -> str:
    """`v` when it is a Kubernetes quantity greater than 0 (a field validator's body)."""
    try:
        value = parse_quantity(v)
    except ValueError:
        raise ValueError(QUANTITY_RULE) from None
    if not value > 0:
        raise ValueError(f"{QUANTITY_RULE}, greater than 0")
    return v


def check_gpus_fit_server(server_type: str, gpus_per_node: int) -> None:
    """No more GPUs per node than the server type has."""
    limit = SERVER_TYPES[server_type]["gpus"]
    if gpus_per_node > limit:
        raise ValueError(f"gpus_per_node: server type {server_type} has {limit} GPUs per node")


class LearningType(str, Enum):
    """How capacity is bought: on-demand or Spot (pre-emptible)."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Framework(str, Enum):
    """The training framework the command uses."""

    PYTORCH = "pytorch"
    DEEPSPEED = "deepspeed"


# Backends are found by name, never listed here: each is a Python entry point in this group
# (`[project.entry-points."sat.backends"]` in pyproject.toml, `<name> = "<module>:BACKEND"`), and, so
# that a checkout without its entry points installed keeps working, each subpackage of
# `sat_tasks.backends` (found on disk, not imported: the spec sits below the backends).
BACKENDS_ENTRY_POINTS = "sat.backends"


def installed_backends() -> tuple[str, ...]:
    """The names a spec's `backend` may take: every `sat.backends` entry point and built-in subpackage, sorted."""
    names = {entry.name for entry in entry_points(group=BACKENDS_ENTRY_POINTS)}
    builtin = importlib.util.find_spec("sat_tasks.backends")
    if builtin is not None and builtin.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(builtin.submodule_search_locations) if m.ispkg}
    return tuple(sorted(names))


# Where `launch` runs the training: one member per installed backend (`BackendKind("local")`,
# `.value`). What a backend does differently is its `capabilities` (`sat_tasks.backends.base`),
# never a comparison with one of these.
BackendKind = Enum("BackendKind", [(name.upper().replace("-", "_").replace(".", "_"), name)  # type: ignore[misc]
                                   for name in installed_backends()], type=str, module=__name__)
BackendKind.__doc__ = "Where `launch` runs the training: an installed backend (`installed_backends`)."


class FaultKind(str, Enum):
    """Faults the local backend can inject (tests and the demo)."""

    HARDWARE = "hardware"
    NODE_LOSS = "node_loss"
    PREEMPTION = "preemption"
    HANG = "hang"


# The backends whose launcher injects a spec's `faults` (`capabilities.injects_faults`; the
# conformance suite keeps the two in step): a spec naming another backend is refused. The
# spec keeps its own copy because it validates without loading a backend.
FAULT_INJECTING_BACKENDS = ("local",)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class Resources(_Model):
    """Compute asked for per node."""

    gpus_per_node: int = ruled(0, rule="must be between 0 and 8", description="GPUs per node (0-8)", ge=0, le=8)
    memory: str = ruled("8Gi", rule=QUANTITY_RULE, pattern=QUANTITY_PATTERN,
                        description="memory per node, a Kubernetes quantity such as 64Gi")
    shared_memory: str = ruled("1Gi", rule=QUANTITY_RULE, pattern=QUANTITY_PATTERN,
                               description="size of /dev/shm, a Kubernetes quantity")
    server_type: ServerType = Field("cpu", description="server type: cpu, g2 (8x H100) or g3 (8x B300)")
    cpu: str = ruled("2", rule=QUANTITY_RULE, pattern=QUANTITY_PATTERN,
                     description="CPU cores per node, a Kubernetes quantity such as 2 or 500m")

    @field_validator("memory", "shared_memory", "cpu")
    @classmethod
    def _positive_quantity(cls, v: str) -> str:
        return positive_quantity(v)

    @model_validator(mode="after")
    def _gpus_fit_server(self) -> Resources:
        check_gpus_fit_server(self.server_type, self.gpus_per_node)
        return self


class Image(_Model):
    """The training container image and the connection holding its registry credentials."""

    url: str = ruled(rule="must be an image reference of 1-512 chars without spaces", min_length=1,
                     max_length=512, pattern=r"^\S+$",
                     description="image reference, e.g. registry.example.com/team/train:1.0")
    registry_conn_id: str | None = ruled(None, rule="must be an Airflow connection id (letters, digits, _ . -)",
                                         pattern=CONN_ID_PATTERN,
                                         description="Airflow connection id with the registry credentials")
    insecure: bool = Field(False, description="talk plain HTTP to the registry (test registries only)")

    @field_validator("url")
    @classmethod
    def _no_credentials(cls, v: str) -> str:
        host = v.split("/")[0]
        if "@" in host and ":" in v.split("@")[0].split("/")[0]:
            raise ValueError("must not carry credentials; use registry_conn_id")
        return v


class Storage(_Model):
    """Where the training script comes from and an optional File Storage mount."""

    script_url: str | None = ruled(None, rule=S3_URI_RULE, pattern=S3_URI_PATTERN,
                                   description="s3:// URI of the training script (or a prefix ending in /)")
    # A volume's name, not a path (issue 44.3, ADR 0040): the operator defines the volumes (claim, mount path,
    # read-only by default) in `[sat] file_storage_volumes`; an absolute path is refused, saying so.
    file_storage_mount: str | None = ruled(None, rule=VOLUME_NAME_RULE, max_length=63,
                                           description="name of a File Storage volume the operator defined "
                                                       "([sat] file_storage_volumes); mounted read-only unless "
                                                       "the operator says otherwise")

    @field_validator("script_url")
    @classmethod
    def _script(cls, v: str | None) -> str | None:
        return None if v is None else check_s3_uri(v)

    @field_validator("file_storage_mount")
    @classmethod
    def _mount(cls, v: str | None) -> str | None:
        return None if v is None else check_volume_name(v)


class DataSource(_Model):
    """Training data in Object Storage."""

    source: str = ruled(rule=S3_URI_RULE, pattern=S3_URI_PATTERN, description="s3:// prefix holding the training data")
    expectation_suite: str | None = ruled(
        None, rule=SUITE_RULE, pattern=SUITE_PATTERN, max_length=255,
        description="Great Expectations suite (JSON file under include/expectations) to run on the data",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return check_s3_uri(v)

    @field_validator("expectation_suite")
    @classmethod
    def _suite(cls, v: str | None) -> str | None:
        if v is not None and any(part in (".", "..") for part in v.split("/")):
            raise ValueError(SUITE_RULE)
        return v


class Results(_Model):
    """Where the results go."""

    destination: str = ruled(rule=S3_URI_RULE, pattern=S3_URI_PATTERN,
                             description="s3:// prefix; results land under <destination>/<DAG>/<job>/<run id>/")
    # The DAG whose run this is, set by validate_spec (what a spec says here is replaced): it scopes the
    # run's results prefix (sat_tasks.io.run_layout, ADR 0024). None: a run validated before it (legacy rule).
    dag_id: SkipJsonSchema[str | None] = Field(None, max_length=250, pattern=r"^[A-Za-z0-9_.-]+$")

    @field_validator("destination")
    @classmethod
    def _dest(cls, v: str) -> str:
        return check_s3_uri(v)


class SpotPolicy(_Model):
    """How a Spot job waits for capacity and resumes."""

    max_resumes: int = ruled(3, rule="must be between 0 and 5", description="resumes after pre-emption (0-5)",
                             ge=0, le=5)
    max_wait_seconds: int = ruled(3600, rule="must be > 0", gt=0,
                                  description="total time to wait for capacity (like MaxWaitTimeInSeconds)")
    poll_seconds: float = ruled(30, rule="must be > 0", gt=0, description="how often to look for capacity")


class WarmPool(_Model):
    """Keep a run warm for the job's next run: staged data, image check, node (issue 19; ADR 0015)."""

    keep_alive_seconds: int = ruled(
        rule=f"must be between 1 and {MAX_KEEP_ALIVE_SECONDS}", ge=1, le=MAX_KEEP_ALIVE_SECONDS,
        description="seconds after a run ends during which the job's next run reuses its staged data, "
                    f"image check and node (1-{MAX_KEEP_ALIVE_SECONDS}, as SageMaker's KeepAlivePeriodInSeconds)",
    )


#: The frameworks an elastic job may use (ADR 0029): DDP's replicated state loads on any world size; DeepSpeed's
#: ZeRO shards are converted to its universal format by the engine when the world size changed.
ELASTIC_FRAMEWORKS = ("pytorch", "deepspeed")
MAX_ELASTIC_WAIT_SECONDS = 86400


class Elastic(_Model):
    """Fail over onto fewer nodes when no spare is healthy (issue 32, ADR 0029): off unless set.

    A failover that finds fewer than `nodes` healthy nodes within `wait_seconds` resumes on as
    many as it has, down to `min_nodes`, with the global batch kept (gradient accumulation
    scaled by the node ratio, so only node counts that divide `nodes` are used).
    """

    min_nodes: int = ruled(rule="must be >= 1 and less than nodes", ge=1,
                           description="the fewest nodes a failover may resume on (1 <= min_nodes < nodes)")
    wait_seconds: float = ruled(
        0, rule=f"must be between 0 and {MAX_ELASTIC_WAIT_SECONDS}", ge=0, le=MAX_ELASTIC_WAIT_SECONDS,
        description="seconds a failover waits for `nodes` healthy nodes before it resumes on fewer")


def elastic_problems(data: dict[str, Any]) -> list[str]:
    """The elastic field's cross-field rules as `elastic.<field>: <rule>` lines (empty: none broken or no elastic)."""
    elastic = data.get("elastic")
    if not isinstance(elastic, dict):
        return []
    problems = []
    if data.get("job_failover") is not True:
        problems.append("elastic: only with job_failover: true (a shrink is a failover onto fewer nodes)")
    nodes, low = data.get("nodes", 1), elastic.get("min_nodes")
    if isinstance(nodes, int) and isinstance(low, int) and not low < nodes:
        problems.append(f"elastic.min_nodes: must be less than nodes ({nodes}), got {low}")
    framework = data.get("framework", Framework.PYTORCH.value)
    if framework not in ELASTIC_FRAMEWORKS:
        problems.append(f"elastic: not allowed with framework {framework}: allowed with "
                        f"{' or '.join(ELASTIC_FRAMEWORKS)} only (ADR 0029)")
    return problems


class NotifyOn(str, Enum):
    """A job's ends a notification is for (the status words: Completed; Failed; any Pending - *; Stopped)."""

    COMPLETED = "completed"
    FAILED = "failed"
    PENDING = "pending"
    STOPPED = "stopped"


EMAIL_PATTERN = r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$"
MAX_NOTIFICATIONS = 10


class Notification(_Model):
    """Who hears of the job's end: a webhook (an Airflow HTTP connection) or e-mail (an SMTP connection).

    Sent by Airflow's own notifiers (the http and smtp providers') from the DAG's
    `on_success_callback`/`on_failure_callback`; the URL, tokens and mail server live in the
    connection, never in the spec.
    """

    on: list[NotifyOn] = Field(default_factory=lambda: list(NotifyOn), min_length=1,
                               description="the ends to notify: completed, failed, pending, stopped (default: all)",
                               json_schema_extra={"default": [end.value for end in NotifyOn]})
    webhook: str | None = ruled(None, rule="must be an Airflow connection id: letters, digits, '_', '.', '-'",
                                pattern=CONN_ID_PATTERN,
                                description="an Airflow HTTP connection (its URL and any token): the job's end is "
                                            "POSTed there as JSON")
    endpoint: str | None = ruled(None, rule="must be a path on the connection's URL, at most 1024 chars, no spaces",
                                 pattern=r"^[^\s]{0,1024}$", description="the path under the webhook connection's URL")
    email: list[str] | None = Field(None, min_length=1, max_length=20,
                                    description="e-mail addresses (1-20) told of the job's end")
    smtp_conn_id: str = ruled("smtp_default", rule="must be an Airflow connection id: letters, digits, '_', '.', '-'",
                              pattern=CONN_ID_PATTERN, description="the Airflow SMTP connection e-mail goes through")

    @field_validator("email")
    @classmethod
    def _addresses(cls, v: list[str] | None) -> list[str] | None:
        for address in v or []:
            if not re.match(EMAIL_PATTERN, address):
                raise ValueError(f"{address!r} is not an e-mail address (name@domain)")
        return v

    @model_validator(mode="after")
    def _one_channel(self) -> Notification:
        if (self.webhook is None) == (self.email is None):
            raise ValueError("set exactly one of webhook (an HTTP connection id) or email (addresses)")
        if self.endpoint is not None and self.webhook is None:
            raise ValueError("endpoint: only with webhook")
        return self

    def wants(self, status: str) -> bool:
        """Whether this notification is for a job that ended with `status` (a status word)."""
        word = status.split(" ", 1)[0].lower()
        return any(word == on.value for on in self.on)


class Fault(_Model):
    """A fault the local backend injects into one attempt."""

    kind: FaultKind = Field(description="what breaks: hardware (a GPU error), node_loss, preemption (Spot) or "
                                       "hang (no progress)")
    attempt: int = ruled(1, rule="attempt must be >= 1", ge=1, description="1-based attempt the fault hits")
    at_step: int | None = Field(None, description=f"training step (from {PROGRESS_NAME}) at which to strike")
    after_seconds: float | None = Field(None, description="seconds after launch at which to strike")
    xid: int = Field(79, description="NVIDIA Xid written to the node's kernel log (hardware faults)")
    capacity_delay_seconds: float = Field(
        0, description="preemption: seconds before the local pool has Spot capacity again"
    )

    @model_validator(mode="after")
    def _when(self) -> Fault:
        if (self.at_step is None) == (self.after_seconds is None):
            raise ValueError("set exactly one of at_step or after_seconds")
        return self


class TrainingJob(_Model):
    """A Training Job: one spec, one DAG."""

    name: str = ruled(rule=NAME_RULE, min_length=3, max_length=63, pattern=NAME_PATTERN,
                      description="3-63 chars: lowercase letters, digits, '-', '.'; alphanumeric at both ends")
    learning_type: LearningType = Field(LearningType.ON_DEMAND, description="on-demand or spot")
    framework: Framework = Field(Framework.PYTORCH, description="pytorch or deepspeed")
    job_failover: bool = Field(False, description="fail over to another node on a hardware fault (not with spot)")
    resources: Resources = Field(default_factory=Resources)
    nodes: int = ruled(1, rule="must be between 1 and 64", ge=1, le=64,
                       description="number of nodes; distributed from 2")
    image: Image
    storage: Storage = Field(default_factory=Storage)
    data: DataSource
    results: Results
    command: str = ruled(rule="must be 3-1024 chars", min_length=3, max_length=1024,
                         description="the training command, 3-1024 chars")
    tags: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_TAGS,
        description=f"at most {MAX_TAGS} key/value pairs (keys 1-128 chars of letters, digits or _.:/=+@-; "
                    "values at most 256 chars)",
        json_schema_extra={"x-rule": f"at most {MAX_TAGS} key/value pairs",
                           "propertyNames": {"pattern": TAG_KEY_PATTERN},
                           "additionalProperties": {"type": "string", "maxLength": 256}},
    )
    schedule: str | None = Field(None, description="cron, a preset such as @daily, or asset:<s3 uri>")
    backend: BackendKind | None = Field(
        None, description=f"{' or '.join(installed_backends())}; default from airflow.cfg [sat] backend")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="extra environment for the training process "
                    f"({GRACE_ENV}: the final checkpoint's grace period, 0-{MAX_GRACE_SECONDS} s)",
        json_schema_extra={"propertyNames": {"pattern": ENV_NAME_PATTERN}},
    )
    spot: SpotPolicy = Field(default_factory=SpotPolicy)
    faults: list[Fault] = Field(default_factory=list, description="injected faults (local backend only)")
    startup_timeout_seconds: float = ruled(
        1800, rule="must be >= 0 (0 turns the start-up deadline off)", ge=0,
        description="seconds from launch to the first training step the checkpoint engine reports "
                    "(loading a model and data); running out of it is a start-up failure, not a hang. "
                    "0 turns it off (a script without the engine reports no steps)",
    )
    heartbeat_timeout_seconds: float = ruled(
        300, rule="must be > 0", gt=0,
        description="once training has started: no progress (step, output line) for this long is a hang",
    )
    max_runtime_seconds: float | None = ruled(
        None, rule="must be > 0 (seconds of Running time; leave it out for no limit)", gt=0,
        description="the stopping condition (SageMaker's MaxRuntimeInSeconds): once the job has been Running this "
                    "long, over every attempt (waits in Pending do not count), it is stopped as a person's Stop "
                    "would: SIGTERM, a final checkpoint, status Stopped saying why. Needs a backend that watches a "
                    "run's stop request",
    )
    max_failovers: int = ruled(3, rule="must be between 0 and 3", ge=0, le=3,
                               description="hardware failovers at most (0-3)")
    max_interruptions: int = ruled(
        3, rule="must be between 0 and 5", ge=0, le=5,
        description="resumes after an interruption from outside with no evidence of a fault (an unnamed "
                    "SIGTERM/SIGKILL, a controller's eviction or deletion, a reclaimed node) at most (0-5); one "
                    "more ends the job Failed. Each is resumed without a failover or blame, and also counts as an "
                    "attempt (and for Spot jobs, a resume)",
    )
    test: JobTest | None = Field(
        None, description="how `sat test` and SAT's pytest plugin run this job short and which failures they "
                          "rehearse (ignored in production; ADR 0016)")
    warm_pool: WarmPool | None = Field(
        None, description="keep the run warm for the job's next run (not with learning_type spot)")
    notifications: list[Notification] = Field(
        default_factory=list, max_length=MAX_NOTIFICATIONS,
        description=f"at most {MAX_NOTIFICATIONS}: a webhook or e-mail told of the job's end (completed, failed, "
                    "pending, stopped), through Airflow's notifiers",
        json_schema_extra={"x-rule": f"at most {MAX_NOTIFICATIONS} notifications"})
    elastic: Elastic | None = Field(
        None, description="fail over onto fewer nodes (down to min_nodes) when no spare node is healthy within "
                          "wait_seconds, and grow back when they return; only with job_failover (ADR 0029)")
    workspace: str | None = ruled(
        None, rule="must be a workspace name: 1-63 chars of lowercase letters, digits, '-' or '.'",
        max_length=63, pattern=r"^[a-z0-9](?:(?:[a-z0-9-]|\.[a-z0-9-])*(?:[a-z0-9]|\.[a-z0-9]))?$",
        description="the Training Workspace (include/workspaces/<name>.yaml) whose reserved nodes the job runs on",
    )

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.match(TAG_KEY_PATTERN, key):
                raise ValueError(f"key {key!r} must be 1-128 chars of letters, digits or _.:/=+@-")
            if len(value) > 256:
                raise ValueError(f"value of {key!r} must be at most 256 chars")
        return v

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
            if not re.match(ENV_NAME_PATTERN, key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
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

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJob:
        for problem in cross_field_problems(self.model_dump(mode="json")):
            raise ValueError(problem)
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

    def with_backend(self, backend: BackendKind | str) -> TrainingJob:
        """Return a copy with the backend resolved (the spec wins over the default)."""
        resolved = self.backend or BackendKind(backend)
        return TrainingJob.model_validate({**self.model_dump(mode="json"), "backend": resolved.value})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (no secrets: a spec never holds one)."""
        return self.model_dump(mode="json")


def cross_field_problems(data: dict[str, Any]) -> list[str]:
    """The cross-field rules, as `<field>: <rule>` lines, on a raw mapping or a dumped model.

    Run on the model (a validator) and on the raw mapping when fields fail too, so every
    problem is reported at once.
    """
    problems = []
    if data.get("job_failover") is True and data.get("learning_type") == LearningType.SPOT.value:
        problems.append("job_failover: not allowed with learning_type spot (Spot jobs resume instead)")
    if data.get("warm_pool") and data.get("learning_type") == LearningType.SPOT.value:
        problems.append("warm_pool: not allowed with learning_type spot (Spot capacity cannot be held between runs)")
    problems.extend(elastic_problems(data))
    backend = data.get("backend")
    if data.get("faults") and backend in {b.value for b in BackendKind} and backend not in FAULT_INJECTING_BACKENDS:
        problems.append(f"faults: fault injection is only allowed on the {' or '.join(FAULT_INJECTING_BACKENDS)} "
                        "backend")
    return problems


# ---- registry logins (issue 29.3) -----------------------------------------------------------------
REGISTRY_CONN_PREFIX = "sat_registry_"


def own_registry_conn_id(job_name: str) -> str:
    """The registry connection a job owns: `sat_registry_<job name>` (the Create form writes it)."""
    return f"{REGISTRY_CONN_PREFIX}{job_name}"


def registry_conn_id_problem(job: TrainingJob, shared: frozenset[str] | set[str] = frozenset()) -> str | None:
    """`image.registry_conn_id: <rule>` when the job names a registry login that is neither its own nor shared.

    A connection is someone's credentials: a job may use only `sat_registry_<its name>` or one the
    deployment lists in `[sat] shared_registry_connections` (`shared`). The rule needs the
    deployment's list, so it is checked when the job runs (the image check), not when a spec parses.
    """
    conn_id = job.image.registry_conn_id
    if conn_id is None or conn_id == own_registry_conn_id(job.name) or conn_id in shared:
        return None
    return (f"image.registry_conn_id: must be the job's own {own_registry_conn_id(job.name)!r} or a connection "
            f"listed in [sat] shared_registry_connections, not {conn_id!r}")


# ---- allowed backends (issue 29.7, ADR 0019) ------------------------------------------------------
def backend_problem(job: TrainingJob, allowed: tuple[str, ...]) -> str | None:
    """`backend: <rule>` when the spec names a backend this deployment does not allow (`[sat] allowed_backends`)."""
    if job.backend is None or job.backend.value in allowed:
        return None
    return (f"backend: {job.backend.value} is not allowed on this deployment: a job may run on "
            f"{' or '.join(allowed)} only ([sat] allowed_backends)")
