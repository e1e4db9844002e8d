"""The Training Job's form fields: one table that both Create forms read (issue 46).

SAT's Create Training Job page (`sat_tasks.ui.create`) and the generic DAG's Airflow trigger
form (`sat_tasks.airflow.params`) ask for the same things. Each row of `FIELDS` says once what
a field is: its label, the kind of input, the value a fresh form shows, its choices, the spec
path it fills and its help; its rule (type, length, pattern, range, enum, description) is the
Training Job model's, read from the JSON Schema (`field_schema`), never copied here.

Each form lays the rows out in its own sections: `section` is the field's on the Create page
(None: not there), `dag` its place among the generic DAG's flat Params (None: not there). A form
shows its sections in its own order (`PAGE_SECTIONS`, `DAG_SECTIONS`) and, inside a section, the
rows in the order of this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sat_tasks.spec.loading import job_schema
from sat_tasks.spec.model import SERVER_TYPES, Framework, LearningType

# The Create page's sections (the service's words) and the generic DAG's.
REQUIRED, SERVICE, IMAGE, COMMAND, TAGS, NOTIFICATIONS, ADVANCED = (
    "Required information", "Service information", "Image", "Command and volume", "Tags", "Notifications", "Advanced")
PAGE_SECTIONS = (REQUIRED, SERVICE, IMAGE, COMMAND, TAGS, NOTIFICATIONS, ADVANCED)
DAG_JOB, DAG_COMPUTE, DAG_IMAGE, DAG_DATA, DAG_ADVANCED = (
    "Job", "Compute", "Container image", "Data and results", "Advanced")
DAG_SECTIONS = (DAG_JOB, DAG_COMPUTE, DAG_IMAGE, DAG_DATA, DAG_ADVANCED)

# The page's choice of ends to notify -> the spec's `on` (a finer choice goes in Advanced: "notifications").
NOTIFY_ENDS = {"every end": ["completed", "failed", "pending", "stopped"],
               "failed, pending or stopped": ["failed", "pending", "stopped"], "completed": ["completed"]}
UNSET: Any = object()  # no DAG-form default of its own: the row's default, else the model's


@dataclass(frozen=True)
class InDag:
    """A field's place among the generic DAG's Params, which are flat: its param name and section, and what that
    form says differently (a default that makes a valid job as the form stands, its own description)."""

    param: str
    section: str
    default: Any = UNSET
    description: str = ""


@dataclass(frozen=True)
class FormField:
    """One field of the Create forms.

    `name` is the page's input name: the spec path the field fills, or a form-only name for an
    input the page turns into the spec itself (the registry login, tags as lines, notifications,
    the Advanced JSON). `kind`: text, number (whole), decimal, select, checkbox, password,
    textarea. `help`: what the page says beyond the model's description of `path` (empty: that
    description).
    """

    name: str
    label: str
    section: str | None  # on the Create page; None: not on it
    kind: str = "text"
    default: Any = None
    options: tuple[str, ...] = ()
    help: str = ""
    path: str | None = None  # the spec path it fills; None: none, or several (form-only)
    dag: InDag | None = None  # in the generic DAG's trigger form; None: not in it

    @property
    def schema(self) -> dict[str, Any]:
        """The model's JSON Schema of the spec field (its type and rule); empty for a form-only field."""
        return field_schema(self.path) if self.path else {}

    @property
    def rule(self) -> str:
        """The model's rule in words (`x-rule`, else its description); empty for a form-only field."""
        schema = self.schema
        return str(schema.get("x-rule") or schema.get("description") or "")

    @property
    def description(self) -> str:
        """The page's help: its own, else the model's description of the spec field."""
        return self.help or str(self.schema.get("description", ""))


def _at(path: str, label: str, section: str | None, kind: str = "text", default: Any = None,
        options: tuple[str, ...] = (), help: str = "", dag: InDag | None = None) -> FormField:
    """A row that fills the spec path `path` (the page's input is named after it)."""
    return FormField(path, label, section, kind, default, options, help, path, dag)


REGISTRY_USER, REGISTRY_PASSWORD, TAGS_FIELD, ADVANCED_FIELD = "registry_user", "registry_password", "tags", "advanced"
NOTIFY_WEBHOOK, NOTIFY_EMAIL, NOTIFY_ON = "notify_webhook", "notify_email", "notify_on"
ELASTIC_MIN_NODES, ELASTIC_WAIT = "elastic.min_nodes", "elastic.wait_seconds"
ADVANCED_HELP = (
    "a JSON object merged into the spec: env, faults (local backend), spot, backend, startup_timeout_seconds, ... "
    "env holds no secrets: everyone who may read the generic DAG's runs in Airflow reads it, so a key naming one "
    "(TOKEN, SECRET, PASSWORD, API_KEY, ...) or a value that looks like one (hf_..., AKIA..., a private key, "
    "user:password@) is refused; a secret reaches the job by reference (an Airflow connection id, like the registry "
    "login above, or a Kubernetes Secret name)")
EXTRA_DESCRIPTION = ("more spec fields as JSON: spot, elastic, env, faults (local backend), backend, "
                     "startup_timeout_seconds, ...")

FIELDS: tuple[FormField, ...] = (
    _at("name", "Training Job name", REQUIRED, dag=InDag("name", DAG_JOB, "my-training-job")),
    _at("learning_type", "Learning type", REQUIRED, "select", LearningType.ON_DEMAND.value,
        tuple(t.value for t in LearningType), dag=InDag("learning_type", DAG_JOB)),
    _at("framework", "Framework", REQUIRED, "select", Framework.PYTORCH.value, tuple(f.value for f in Framework),
        dag=InDag("framework", DAG_JOB)),
    _at("nodes", "Nodes", REQUIRED, "number", 1, dag=InDag("nodes", DAG_COMPUTE)),
    _at("resources.server_type", "Server type", REQUIRED, "select", "cpu", tuple(SERVER_TYPES),
        dag=InDag("server_type", DAG_COMPUTE)),
    _at("resources.gpus_per_node", "GPUs per node", REQUIRED, "number", 0, dag=InDag("gpus_per_node", DAG_COMPUTE)),
    _at("job_failover", "Job failover", SERVICE, "checkbox", True, dag=InDag("job_failover", DAG_JOB)),
    _at("max_failovers", "Failovers at most", SERVICE, "number", 3),
    _at(ELASTIC_MIN_NODES, "Elastic: fewest nodes to resume on", SERVICE, "number",
        help="optional, with Job failover: when no spare node is healthy, a failover resumes on fewer nodes, "
             "down to this many (1 to nodes - 1), and grows back when they return; empty: waits for all nodes"),
    _at(ELASTIC_WAIT, "Elastic: seconds to wait for every node", SERVICE, "decimal",
        help="with the fewest nodes: how long a failover waits for all nodes before it resumes on fewer "
             "(0-86400; empty: 0)"),
    _at("resources.cpu", "CPU per node", SERVICE, default="2"),
    _at("resources.memory", "Memory per node", SERVICE, default="8Gi", dag=InDag("memory", DAG_COMPUTE)),
    _at("resources.shared_memory", "Shared memory (/dev/shm)", SERVICE, default="1Gi",
        dag=InDag("shared_memory", DAG_COMPUTE)),
    _at("heartbeat_timeout_seconds", "Heartbeat timeout (seconds)", SERVICE, "number", 300),
    _at("workspace", "Training Workspace", SERVICE,
        help="optional: the workspace whose reserved nodes the job runs on (the Workspaces page lists them)"),
    _at("image.url", "Image", IMAGE, default="registry.sat.local/sat/training:0.1.0",
        dag=InDag("image_url", DAG_IMAGE)),
    FormField(REGISTRY_USER, "Registry user", IMAGE,
              help="with the password, kept as an Airflow connection; the job names only the connection"),
    FormField(REGISTRY_PASSWORD, "Registry password", IMAGE, "password",
              help="never stored in the job or its run; shown to nobody"),
    _at("image.insecure", "Registry speaks plain HTTP (test registries only)", IMAGE, "checkbox", False),
    # The page asks for the login itself and names the connection it keeps it in; the DAG's form names one.
    _at("image.registry_conn_id", "Registry connection (Airflow connection id)", None,
        dag=InDag("registry_conn_id", DAG_IMAGE)),
    _at("command", "Command", COMMAND, default="python train.py", dag=InDag("command", DAG_JOB)),
    _at("storage.script_url", "Training script (Object Storage)", COMMAND, dag=InDag("script_url", DAG_DATA)),
    _at("data.source", "Training data (Object Storage)", REQUIRED, default="s3://sat-demo/datasets/tiny-corpus/",
        dag=InDag("data_source", DAG_DATA)),
    _at("results.destination", "Results (Object Storage)", REQUIRED, default="s3://sat-demo/results/",
        dag=InDag("results_destination", DAG_DATA)),
    _at("storage.file_storage_mount", "File Storage volume mount path", COMMAND,
        dag=InDag("file_storage_mount", DAG_DATA)),
    # The page takes key=value lines, the DAG's form a JSON object.
    FormField(TAGS_FIELD, "Tags", TAGS, "textarea", help="key=value, one per line (at most 50; keys of letters, "
                                                         "digits or _.:/=+@-)",
              path="tags", dag=InDag("tags", DAG_ADVANCED, {})),
    FormField(NOTIFY_WEBHOOK, "Webhook (Airflow HTTP connection id)", NOTIFICATIONS,
              help="the job's end is POSTed as JSON to this connection's URL (its token stays in the connection)"),
    FormField(NOTIFY_EMAIL, "E-mail (addresses, comma-separated)", NOTIFICATIONS,
              help="sent through the Airflow SMTP connection smtp_default"),
    FormField(NOTIFY_ON, "Notify on", NOTIFICATIONS, "select", "every end", tuple(NOTIFY_ENDS),
              help="Completed; Failed; Pending - * (max retries, image pull, internal error); Stopped"),
    # Every other spec field: JSON text on the page, a JSON object in the DAG's form.
    FormField(ADVANCED_FIELD, "More spec fields (JSON)", ADVANCED, "textarea", help=ADVANCED_HELP,
              dag=InDag("extra", DAG_ADVANCED, {}, EXTRA_DESCRIPTION)),
)


def page_fields() -> tuple[FormField, ...]:
    """The Create page's fields, in the order it shows them: by its sections, then as the table lists them."""
    return tuple(sorted((f for f in FIELDS if f.section is not None), key=lambda f: PAGE_SECTIONS.index(f.section)))


def dag_fields() -> tuple[FormField, ...]:
    """The generic DAG form's fields, in the order of its Params: by its sections, then as the table lists them."""
    placed = [(DAG_SECTIONS.index(f.dag.section), f) for f in FIELDS if f.dag is not None]
    return tuple(f for _, f in sorted(placed, key=lambda pair: pair[0]))


# ---- the model's rule for a field ------------------------------------------------------------------
def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` with a `$ref` into `$defs` replaced by the definition (its own keys win)."""
    if "$ref" in node:
        target = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _section(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The object `node` describes, refs resolved; an optional section (`elastic: Elastic | None`) its object branch."""
    node = _resolve(schema, node)
    if "properties" not in node and "anyOf" in node:
        node = next((branch for b in node["anyOf"] if "properties" in (branch := _resolve(schema, b))), node)
    return node


def field_schema(path: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema of the spec field at `path` (`resources.memory`), refs resolved, Optional as a type list."""
    schema = schema or job_schema()
    node: dict[str, Any] = schema
    for part in path.split("."):
        node = _section(schema, node)
        node = node["properties"][part]
    node = _resolve(schema, node)
    if "anyOf" in node:  # `X | None`: the form takes null or X's constraints
        branches = [_resolve(schema, b) for b in node["anyOf"]]
        real = [b for b in branches if b.get("type") != "null"]
        merged = {k: v for k, v in node.items() if k != "anyOf"}
        if len(real) == 1:
            merged.update({k: v for k, v in real[0].items() if k != "type"})
            merged["type"] = ["null", real[0].get("type", "string")]
        node = merged
    return node
