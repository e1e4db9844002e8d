"""Every `[sat]` setting, declared once: name, type, default, description, an example, the version it came in.

As Airflow's `provider.yaml` `config:` section does for a provider. `sat_tasks.config.sat_setting`
reads only what is declared here; `sat up` and `sat validate` refuse an unknown or mistyped key
in the config file or the environment (`AIRFLOW__SAT__<KEY>`), naming the nearest known one
(`unknown_key_problems`, `value_problems`); and the `[sat]` section of the shipped `airflow.cfg` and
`docs/configuration.md` are generated from this table (`python -m sat_tasks.settings --write`;
`tests/sat_tasks/test_settings.py` checks that they agree).

A family (`family=True`, a name ending in `_<something>`) is one setting per instance: `data_roots_<workspace>`.
This module imports the standard library only: the bottom of the layers.
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

VERSION_0_1 = "0.1.0"  # no release yet: every setting so far arrived before the first one


@dataclass(frozen=True)
class Setting:
    """One `[sat]` setting.

    Attributes:
        name: the key (`family`: its prefix, e.g. `data_roots_<workspace>`).
        type: string, integer, number, boolean, choice, list (comma-separated), json, path or uri.
        default: the value when neither the environment nor the config file sets one ("" = not set).
        description: what it does, for the reference and the generated airflow.cfg comment.
        example: a value worth showing (optional).
        added: the version it came in.
        choices: the values a `choice` takes.
        shipped: the value the project's airflow.cfg sets for `make up` (None: left at its default there).
        family: a setting per instance (the part after the prefix: a workspace name, ...).
    """

    name: str
    type: str
    default: str
    description: str
    example: str = ""
    added: str = VERSION_0_1
    choices: tuple[str, ...] = ()
    shipped: str | None = None
    family: bool = False

    @property
    def prefix(self) -> str:
        """A family's key prefix (`data_roots_`); a plain setting's name."""
        return self.name.split("<", 1)[0] if self.family else self.name


_K8S = "Kubernetes backend (`KubernetesSettings`): "

SETTINGS: tuple[Setting, ...] = (
    # ---- the deployment ----------------------------------------------------------------------------------
    Setting("backend", "choice", "local", "Where `launch` runs: local (this host, a pool of named local nodes) or "
            "kubernetes.", choices=("local", "kubernetes"), shipped="local"),
    Setting("allowed_backends", "list", "", "The backends a job spec may name (ADR 0019). Empty: `backend` only, so "
            "a spec cannot stage its data onto another backend's workers.", example="local,kubernetes"),
    Setting("object_storage_conn_id", "string", "sat_object_storage", "The Airflow connection for Object Storage "
            "(conn type aws; endpoint_url in its extra).", shipped="sat_object_storage"),
    Setting("jobs_dir", "path", "<project>/include/jobs", "Job specs turned into DAGs.",
            shipped="${AIRFLOW_HOME}/../include/jobs"),
    Setting("workspaces_dir", "path", "<project>/include/workspaces", "Training Workspaces' YAML definitions "
            "(ADR 0015): the `sat workspace` command and the Workspaces page write here."),
    Setting("workspace_wait_seconds", "integer", "3600", "How long a job waits for its workspace's nodes (or a "
            "local node slot) before it fails."),
    Setting("final_checkpoint_grace_seconds", "number", "60", "Seconds a pre-empted or stopped attempt gets to "
            "write its final checkpoint before SIGKILL (a job's env.CKPT_GRACE_SECONDS overrides it).",
            shipped="60"),
    Setting("data_watch_interval_seconds", "number", "60", "How often the data-watch DAG looks for new objects "
            "under the data sources of asset-scheduled jobs."),
    # ---- local backend -----------------------------------------------------------------------------------
    Setting("work_dir", "path", "<project>/.sat/work", "Local backend: the working directory (staged data, "
            "outputs, job logs per run). Workers of one deployment must share it (one host).",
            shipped="${AIRFLOW_HOME}/../.sat/work"),
    Setting("local_nodes", "list", "local-node-0,local-node-1,local-node-2,local-node-3,local-node-4",
            "Local backend: the pool of named local nodes.",
            shipped="local-node-0,local-node-1,local-node-2,local-node-3,local-node-4"),
    Setting("local_node_slots", "integer", "1", "Local backend: attempts each node runs at once; a job takes a slot "
            "on the least-loaded healthy node and queues while every slot is taken (issue 31.4)."),
    Setting("local_runtime", "choice", "host", "Where the local backend runs each attempt (ADR 0035): container (in "
            "the job's image, with podman: its run's directories and Object Storage endpoint only), host (this "
            "host's environment; the image is not used), or auto (container wherever podman is installed and SAT "
            "runs as root). `sat run --runtime` and `sat demo --runtime` choose for one run.",
            choices=("host", "container", "auto"), shipped="auto"),
    Setting("local_launch_watch", "choice", "worker", "Local backend: what watches a running attempt (issue 48.3, "
            "ADR 0044). worker: its launch task, holding a worker slot for the whole training; triggerer: a "
            "process of the attempt's own runs it and the launch task defers to the triggerer (no worker slot "
            "held meanwhile; opt-in until the Celery test of issue 48 passes in this mode).",
            choices=("worker", "triggerer")),
    Setting("local_host_mode", "choice", "allowed", "forbidden: no attempt runs on this host outside a container "
            "(a deployment for more than one trusted team).", choices=("allowed", "forbidden"), shipped="allowed"),
    Setting("containers_dir", "path", "", "Local backend: the project's podman configuration and image store. "
            "Empty: <project>/.sat/containers."),
    Setting("registry_ca_file", "path", "", "A CA certificate (PEM) the local container runtime trusts when it "
            "pulls a job's image; only for those pulls, never added to the machine's trust store."),
    Setting("embedded_registry", "choice", "auto", "`sat up` runs a container registry of the deployment's own on "
            "127.0.0.1 (ADR 0042: TLS from a generated CA, a generated login shared with jobs as the connection "
            "sat_embedded_registry) and pushes SAT's training image to it. auto: where docker-registry and htpasswd "
            "are installed; off: never.", choices=("auto", "off")),
    Setting("embedded_registry_port", "integer", "0", "The embedded registry's port on 127.0.0.1. 0: a free one, "
            "chosen on the first `sat up` and kept while it stays free.", example="5000"),
    Setting("failover_warm_interpreter", "choice", "auto", "A failover job's next attempt starts in a standby "
            "interpreter that has imported the framework (local backend, ADR 0031); auto: on while the host has "
            "the memory for it.", choices=("auto", "true", "false")),
    Setting("warm_pool_preload", "list", "torch,datasets,tokenizers,transformers,transformers.trainer,accelerate",
            "The modules a warm interpreter imports ahead of the next run (local warm pool); none: no "
            "interpreter."),
    # ---- Kubernetes backend ------------------------------------------------------------------------------
    Setting("kubernetes_namespace", "string", "sat-jobs", "Kubernetes backend: the jobs' namespace.",
            shipped="sat-jobs"),
    Setting("kubernetes_conn_id", "string", "kubernetes_default", "Kubernetes backend: the Airflow connection to "
            "the cluster.", shipped="kubernetes_default"),
    Setting("k8s_termination_grace_seconds", "integer", "120", _K8S + "pod grace period (SIGTERM to SIGKILL); at "
            "least final_checkpoint_grace_seconds + 60."),
    Setting("k8s_master_port", "integer", "29500", _K8S + "rendezvous port of rank 0."),
    Setting("k8s_capacity_label", "string", "sat.ai/capacity", _K8S + "node label telling Spot from on-demand."),
    Setting("k8s_spot_label_value", "string", "spot", _K8S + "value of the capacity label on Spot nodes."),
    Setting("k8s_spot_taint_key", "string", "sat.ai/capacity", _K8S + "the taint key Spot nodes carry."),
    Setting("k8s_spot_taint_value", "string", "spot", _K8S + "the taint value Spot nodes carry."),
    Setting("k8s_gpu_resource", "string", "nvidia.com/gpu", _K8S + "the extended resource name of a GPU."),
    Setting("k8s_gpu_product_label", "string", "nvidia.com/gpu.product", _K8S + "node label with the GPU model."),
    Setting("k8s_gpu_taint_key", "string", "nvidia.com/gpu", _K8S + "the taint GPU nodes carry."),
    Setting("k8s_startup_timeout_seconds", "integer", "1800", _K8S + "how long the operator waits for a pod to "
            "start (large image pulls)."),
    Setting("k8s_run_volume_size", "string", "100Gi", _K8S + "the size of the per-run claim."),
    Setting("k8s_run_volume_storage_class", "string", "", _K8S + "the per-run claim's storage class (empty: the "
            "cluster's default)."),
    Setting("k8s_rendezvous_dns_wait_seconds", "integer", "600", _K8S + "how long ranks > 0 wait for rank 0's DNS "
            "name."),
    Setting("k8s_object_storage_endpoint", "uri", "", _K8S + "the S3 endpoint pods use (empty: AWS's own)."),
    Setting("k8s_object_storage_secret", "string", "sat-object-storage", _K8S + "the Secret holding the Object "
            "Storage keys, read by pods through secretKeyRef."),
    Setting("k8s_staging_image", "string", "registry.example.com/sat/airflow:0.1.0", _K8S + "the image of the "
            "run's helper pods (staging, upload)."),
    Setting("k8s_staging_pull_secret", "string", "", _K8S + "the pull Secret of the staging image."),
    Setting("k8s_workspace_label", "string", "sat.ai/workspace", _K8S + "the node label and taint key of a "
            "workspace's nodes."),
    Setting("k8s_kueue", "boolean", "false", _K8S + "Kueue queues workspace jobs (else an Airflow pool per "
            "workspace)."),
    Setting("k8s_run_as_user", "integer", "1000", _K8S + "the uid training pods run as; never 0 (ADR 0040)."),
    Setting("k8s_run_as_group", "integer", "1000", _K8S + "the gid training pods run as; never 0."),
    Setting("k8s_staging_run_as_user", "integer", "50000", _K8S + "the uid of the helper pods; never 0."),
    Setting("k8s_fs_group", "integer", "1000", _K8S + "the supplementary group of every SAT pod."),
    Setting("k8s_probe_start_seconds", "integer", "60", _K8S + "how long the health check's probe pod may stay "
            "Pending on a suspect node before the probe gives up and decides nothing."),
    # ---- failures, nodes, Spot ---------------------------------------------------------------------------
    Setting("spot_node_labels", "list", "", "Node labels or taints (key=value or key) that mark an on-premise pool "
            "as Spot capacity: a pod lost with such a node is a preemption, not a hardware fault. GKE, EKS, "
            "Karpenter and AKS labels are known without it.", example="pool=preemptible", shipped=""),
    Setting("node_ledger_uri", "uri", "", "The node health ledger (ADR 0004). Empty: "
            "<results destination>/_node-health/ of each job; set it so that jobs with different destinations "
            "share one ledger.", example="s3://sat-ops/_node-health/"),
    Setting("node_quarantine_window_seconds", "integer", "86400", "A node with faults of two different jobs within "
            "this window is quarantined until a person releases it."),
    Setting("quarantine_cordon", "boolean", "false", "Kubernetes: also cordon and taint a quarantined node "
            "(SAT's account then needs get/patch on nodes)."),
    Setting("warm_pool_uri", "uri", "", "Where warm pool states live (ADR 0015). Empty: "
            "<results destination>/_warm-pool/ of each job."),
    # ---- metrics -----------------------------------------------------------------------------------------
    Setting("metrics_interval_seconds", "number", "300", "Per-job metrics every this many seconds, as JSON lines "
            "under the run's metrics/ (a job's env.SAT_METRICS_INTERVAL_SECONDS overrides it).", shipped="300"),
    Setting("otlp_endpoint", "uri", "", "Also export the metrics as OTLP/HTTP here. Empty: the training "
            "environment's OTEL_EXPORTER_OTLP_ENDPOINT, if set.", example="http://otel-collector:4318",
            shipped=""),
    # ---- tenancy -----------------------------------------------------------------------------------------
    Setting("shared_registry_connections", "list", "", "Registry connection ids every job may name besides its own "
            "sat_registry_<job>; list pull-only logins."),
    Setting("notification_connections", "list", "", "Airflow connections every job may name for its end-of-job "
            "notifications (a webhook's http connection, an SMTP connection); besides these a webhook may name only "
            "an http connection the person who triggered the run may read. Never list the Object Storage "
            "connection.", example="team_webhook,smtp_default"),
    Setting("registry_hosts", "list", "", "Registry hosts (host or host:port) the image check may contact; empty: "
            "loopback and the hosts of the registry connections. An image.url elsewhere is refused.",
            example="registry.example.com,ghcr.io"),
    Setting("scoped_credentials", "choice", "on", "Each training attempt's Object Storage credentials (ADR 0020): "
            "on: STS AssumeRole scoped to its run; off: the service's keys (a store without STS), with a warning.",
            choices=("on", "off")),
    Setting("scoped_credentials_role_arn", "string", "arn:aws:iam::123456789012:role/sat-training", "The role the "
            "scoped credentials assume."),
    Setting("scoped_credentials_seconds", "integer", "43200", "The scoped credentials' lifetime."),
    Setting("data_roots", "list", "", "Where jobs may read data and scripts from (ADR 0039): comma-separated "
            "s3:// prefixes. Empty: any prefix outside SAT's own trees.", example="s3://team-data/"),
    Setting("data_roots_<workspace>", "list", "", "A workspace's own data roots (the workspace name with every "
            "character but letters and digits as _), instead of data_roots.", family=True,
            example="s3://team-a-data/"),
    Setting("file_storage_volumes", "json", "", "File Storage volumes a job may mount by name (ADR 0040): a JSON "
            "object of name -> {claim, mount_path, read_only}: a PersistentVolumeClaim (a host directory only through a "
            "PersistentVolume bound to a claim), read-only unless read_only is false.",
            example='{"datasets": {"claim": "team-datasets", "mount_path": "/mnt/datasets"}}'),
)

_BY_NAME = {s.name: s for s in SETTINGS if not s.family}
_FAMILIES = tuple(s for s in SETTINGS if s.family)
_TRUE_FALSE = ("true", "false", "1", "0", "yes", "no", "on", "off")


def declared(key: str) -> Setting | None:
    """The setting `key` is (a family's member names its family), None when nothing declares it."""
    key = key.lower()
    if key in _BY_NAME:
        return _BY_NAME[key]
    return next((f for f in _FAMILIES if key.startswith(f.prefix) and len(key) > len(f.prefix)), None)


def unknown_key_problem(key: str, where: str) -> str | None:
    """A line naming an undeclared key and the nearest declared one; None for a declared key."""
    if declared(key) is not None:
        return None
    near = difflib.get_close_matches(key.lower(), [s.name for s in SETTINGS], n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else "; see docs/configuration.md"
    return f"[sat] {key} ({where}): no such setting{hint}"


def value_problem(setting: Setting, key: str, raw: str, where: str) -> str | None:
    """A line naming the key and its type's rule when `raw` is not a value of it; None when it is (or empty)."""
    value = raw.strip()
    if not value:
        return None
    rule = None
    if setting.type == "integer":
        rule = None if value.lstrip("-").isdigit() else "must be a whole number"
    elif setting.type == "number":
        try:
            float(value)
        except ValueError:
            rule = "must be a number"
    elif setting.type == "boolean":
        rule = None if value.lower() in _TRUE_FALSE else "must be true or false"
    elif setting.type == "choice":
        rule = None if value.lower() in setting.choices else f"must be one of {', '.join(setting.choices)}"
    elif setting.type == "json":
        try:
            json.loads(value)
        except ValueError:
            rule = "must be JSON"
    return None if rule is None else f"[sat] {key} = {value[:80]!r} ({where}): {rule}"


def problems(file_keys: dict[str, str], env_keys: dict[str, str]) -> list[str]:
    """Every unknown key and mistyped value of a `[sat]` section (`file_keys`) and the environment's keys."""
    found = []
    for where, keys in (("the config file", file_keys), ("the environment", env_keys)):
        for key, raw in keys.items():
            setting = declared(key)
            line = unknown_key_problem(key, where) if setting is None else value_problem(setting, key, raw, where)
            if line:
                found.append(line)
    return found


# ---- what is generated from the table ---------------------------------------------------------------
CFG_HEADER = ("# Generated from sat_tasks/settings.py (python -m sat_tasks.settings --write); the reference is "
              "docs/configuration.md.\n")


def _wrap(text: str, width: int, lead: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, initial_indent=lead, subsequent_indent=lead)


def cfg_section() -> str:
    """The `[sat]` section of the shipped airflow.cfg: every setting, its description; set where `shipped`."""
    lines = ["[sat]", CFG_HEADER.rstrip("\n")]
    for s in SETTINGS:
        lines += _wrap(s.description, 100, "# ")
        if s.shipped is not None:
            lines.append(f"{s.name} = {s.shipped}".rstrip())
        elif not s.family:
            lines.append(f"# {s.name} = {s.default}".rstrip())
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """docs/configuration.md: the reference of every `[sat]` setting."""
    lines = [
        "# Configuration reference: the `[sat]` section",
        "",
        "Generated from `sat_tasks/settings.py` by `python -m sat_tasks.settings --write`; do not edit by hand.",
        "",
        "A setting comes from the environment (`AIRFLOW__SAT__<KEY>`), then the `[sat]` section of the Airflow",
        "config file, then its default. `sat up` and `sat validate` refuse an unknown key or a value of the wrong",
        "type, naming the key (and the nearest known one).",
        "",
        "| Setting | Type | Default | Since | Description |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        kind = s.type + (f" ({' / '.join(s.choices)})" if s.choices else "")
        text = s.description + (f" Example: `{s.example}`." if s.example else "")
        default = f"`{s.default}`" if s.default else "(empty)"
        lines.append(f"| `{s.name}` | {kind} | {default} | {s.added} | {text.replace('|', '&#124;')} |")
    return "\n".join(lines) + "\n"


def replace_cfg_section(text: str) -> str:
    """`text` (an airflow.cfg) with its `[sat]` section replaced by `cfg_section()` (appended when absent)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.strip() == "[sat]"), None)
    if start is None:
        return text.rstrip("\n") + "\n\n" + cfg_section()
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + cfg_section() + ("\n" + tail if tail else "")


def generated_files(root: Path) -> dict[Path, str]:
    """The files generated from the table under the project `root`, with the text each must hold."""
    cfg = root / "airflow.cfg"
    return {cfg: replace_cfg_section(cfg.read_text(encoding="utf-8")),
            root / "docs" / "configuration.md": markdown()}


def regenerate(files: dict[Path, str], project: Path, argv: list[str]) -> int:
    """A generator's command line: with `--write`, write the stale `files`; else name them (exit status 1)."""
    stale = [p for p, text in files.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if "--write" in argv:
        for path in stale:
            path.write_text(files[path], encoding="utf-8")
        print("\n".join(f"wrote {p.relative_to(project)}" for p in stale) or "up to date")
        return 0
    print("\n".join(f"stale: {p.relative_to(project)}" for p in stale) or "up to date")
    return 1 if stale else 0


if __name__ == "__main__":  # pragma: no cover - `python -m sat_tasks.settings --write | --check`
    _project = Path(__file__).resolve().parents[1]
    sys.exit(regenerate(generated_files(_project), _project, sys.argv))
