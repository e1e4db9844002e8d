"""docker/helm-values.yaml through the official Airflow chart and Helm's own template engine.

helm-python-sdk (the [test] extra, pinned in requirements.lock) binds Helm v4's Go SDK: the chart is rendered as
`helm install` would render it, with its values.schema.json, and the objects are checked (issue 48, item 6):
no setup Job that fails in SAT's image and no admin/admin in the install notes, every claim a pod mounts either
rendered by the release or one the operator guide has the operator create (for any release name), every
airflow.cfg setting SAT relies on in the chart's airflow.cfg, and resources for every component.

The chart is the official one, unmodified: SAT does not ship its source. Point SAT_AIRFLOW_CHART at a chart
directory or .tgz, or pull it into .sat/helm once where the chart repository is reachable:

    .venv/bin/python -c "import helm_python as h; h.pull('airflow', repo_url='https://airflow.apache.org', \\
        version='1.22.0', destination='.sat/helm', untar=True, untar_dir='.sat/helm')"

Without a chart the test module is skipped, and says so.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VALUES = REPO / "docker" / "helm-values.yaml"
CHART_VERSION = "1.22.0"  # the version docs/operator-guide.md installs
DEFAULT_CHART = REPO / ".sat" / "helm" / "airflow"
# Claims the operator creates before the install (docs/operator-guide.md, "Shared state and buckets").
OPERATOR_CLAIMS = {"sat-shared"}
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")
# The project's airflow.cfg settings a Helm install must keep (the chart's airflow.cfg replaces the image's):
# the settings SAT relies on, as (section, key). Paths and the local backend's settings differ on purpose.
RELIED_ON = [
    ("core", "load_examples"),
    ("core", "dagbag_import_timeout"),
    ("core", "default_timezone"),
    ("core", "dags_are_paused_at_creation"),
    ("core", "simple_auth_manager_all_admins"),
    ("core", "simple_auth_manager_users"),
    ("scheduler", "min_file_process_interval"),
    ("scheduler", "scheduler_idle_sleep_time"),
    ("dag_processor", "refresh_interval"),
    ("api", "expose_config"),
    ("workers", "execution_api_timeout"),
    ("workers", "min_heartbeat_interval"),
    ("sat", "object_storage_conn_id"),
    ("sat", "final_checkpoint_grace_seconds"),
    ("sat", "kubernetes_namespace"),
    ("sat", "kubernetes_conn_id"),
    ("sat", "metrics_interval_seconds"),
]
# Set here for the cluster, where the project's airflow.cfg leaves them to `sat up` or its defaults.
HELM_ONLY = [("core", "parallelism"), ("core", "auth_manager"), ("sat", "backend")]


def chart_path() -> Path | None:
    configured = os.environ.get("SAT_AIRFLOW_CHART")
    if configured:
        path = Path(configured)
        assert path.exists(), f"SAT_AIRFLOW_CHART={configured} does not exist"
        return path
    return DEFAULT_CHART if (DEFAULT_CHART / "Chart.yaml").exists() else None


def render(values: dict, release: str) -> tuple[list[dict], str, str]:
    """The release's objects, its install notes and the chart's version, as `helm install` renders them."""
    import helm_python as helm

    path = chart_path()
    if path is None:
        pytest.skip("no official Airflow chart here: set SAT_AIRFLOW_CHART or pull it into .sat/helm "
                    "(this module's docstring)")
    with helm.Chart.load(path) as chart:
        version = chart.version
        rendered = chart.render(values, name=release, namespace="airflow", is_install=True)
    objects, notes = [], ""
    for name, text in rendered.items():
        if name.endswith("NOTES.txt"):
            notes += text
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects, notes, version


def _values() -> dict:
    return yaml.safe_load(VALUES.read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=["airflow", "sat-prod"])
def release(request):
    objects, notes, version = render(_values(), request.param)
    return request.param, objects, notes, version


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(kind/name, pod spec) of every workload, and of the KubernetesExecutor's pod template in the config map."""
    specs = []
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in WORKLOADS:
            template = obj["spec"]["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" \
                else obj["spec"]["template"]
            specs.append((name, template["spec"]))
        elif obj["kind"] == "ConfigMap" and "pod_template_file.yaml" in (obj.get("data") or {}):
            specs.append((f"{name}:pod_template_file.yaml",
                          yaml.safe_load(obj["data"]["pod_template_file.yaml"])["spec"]))
    return specs


def chart_cfg(objects: list[dict]) -> configparser.ConfigParser:
    """The airflow.cfg the chart mounts over the image's."""
    texts = [obj["data"]["airflow.cfg"] for obj in objects
             if obj["kind"] == "ConfigMap" and "airflow.cfg" in (obj.get("data") or {})]
    assert len(texts) == 1, f"{len(texts)} airflow.cfg config maps rendered"
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(texts[0])
    return parser


def problems(objects: list[dict], notes: str, release: str) -> dict[str, list[str]]:
    """What is wrong with a render, by check (an empty list: the check passes)."""
    found: dict[str, list[str]] = {"setup-jobs": [], "notes": [], "claims": [], "config": [], "resources": []}
    specs = pod_specs(objects)
    # Setup Jobs: the chart's create-user Job runs FAB's `airflow users create`, absent with the simple auth manager.
    for obj in objects:
        if obj["kind"] == "Job":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                command = " ".join(container.get("command") or []) + " " + " ".join(container.get("args") or [])
                if "users create" in command or "create_user" in command:
                    found["setup-jobs"].append(f"Job/{obj['metadata']['name']} runs `airflow users create`")
    lowered = notes.lower()
    if "password: admin" in lowered or "admin/admin" in lowered:
        found["notes"].append("the install notes print the default admin/admin login")
    # Claims: each one a pod mounts is the release's own or one the operator made before the install.
    rendered_claims = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "PersistentVolumeClaim"}
    for name, spec in specs:
        for volume in spec.get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and claim not in rendered_claims | OPERATOR_CLAIMS:
                found["claims"].append(f"{name} mounts claim {claim!r}, which release {release!r} does not create "
                                       f"(it has {sorted(rendered_claims)})")
    # airflow.cfg: the settings SAT relies on, as the project's airflow.cfg has them.
    project = configparser.ConfigParser(interpolation=None)
    project.read(REPO / "airflow.cfg", encoding="utf-8")
    cfg = chart_cfg(objects)
    for section, key in RELIED_ON:
        want = project.get(section, key)
        got = cfg.get(section, key, fallback=None)
        if got is None or (got != want and _number(got) != _number(want)):
            found["config"].append(f"[{section}] {key} = {got!r} in the chart's airflow.cfg, {want!r} in the project's")
    for section, key in HELM_ONLY:
        if not cfg.get(section, key, fallback=None):
            found["config"].append(f"[{section}] {key} is not set in the chart's airflow.cfg")
    if cfg.get("core", "auth_manager", fallback="").rsplit(".", 1)[-1] != "SimpleAuthManager":
        found["config"].append("[core] auth_manager is not the simple auth manager")
    # Resources: every container of every component requests CPU and memory and has a memory limit. (Init
    # containers run before them, one at a time: the pod's request is the larger of theirs and its containers'.)
    for name, spec in specs:
        for container in spec.get("containers") or []:
            resources = container.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            missing = [f"requests.{k}" for k in ("cpu", "memory") if not requests.get(k)]
            missing += ["limits.memory"] if not limits.get("memory") else []
            if missing:
                found["resources"].append(f"{name} container {container['name']}: no {', '.join(missing)}")
    return found


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def test_the_chart_is_the_version_the_guide_installs(release):
    _, _, _, version = release
    assert version == CHART_VERSION, f"rendered chart {version}, the operator guide installs {CHART_VERSION}"


@pytest.mark.parametrize("check", ["setup-jobs", "notes", "claims", "config", "resources"])
def test_the_release_objects(release, check):
    name, objects, notes, _ = release
    assert objects, "the chart rendered nothing"
    assert problems(objects, notes, name)[check] == []


def test_the_release_runs_the_components_sat_needs(release):
    name, objects, _, _ = release
    workloads = {f"{obj['kind']}/{obj['metadata']['name']}" for obj in objects if obj["kind"] in WORKLOADS}
    for component in ("scheduler", "dag-processor", "api-server", "run-airflow-migrations"):
        assert any(w.endswith(f"/{name}-{component}") for w in workloads), (component, sorted(workloads))
    assert any(w.endswith(f"/{name}-triggerer") for w in workloads), sorted(workloads)
    assert f"PersistentVolumeClaim/{name}-dags" in {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
    # one git-sync writes the spec checkout into the release's DAG claim (the chart's own runs nowhere with a claim)
    writers = []
    for pod, spec in pod_specs(objects):
        claims = {v["name"]: (v.get("persistentVolumeClaim") or {}).get("claimName") for v in spec.get("volumes") or []}
        for container in spec["containers"]:
            env = {item["name"]: item.get("value") for item in container.get("env") or []}
            if "GITSYNC_REPO" in env and any(claims.get(m["name"]) == f"{name}-dags" and not m.get("readOnly")
                                             for m in container.get("volumeMounts") or []):
                writers.append(f"{pod}:{container['name']}")
    assert len(writers) == 1, writers


def test_the_checks_catch_the_values_issue_48_found():
    """The checks fail on the values before issue 48's item 6: a create-user Job, admin/admin in the notes, the API
    server on claim `airflow-dags` under another release name, [workers] and [scheduler] settings lost, a
    scheduler without resources."""
    values = _values()
    values["createUserJob"] = {"useHelmHooks": False}
    values.pop("webserver", None)
    values["apiServer"]["extraVolumes"][0]["persistentVolumeClaim"]["claimName"] = "airflow-dags"
    del values["config"]["workers"]
    del values["config"]["scheduler"]["scheduler_idle_sleep_time"]
    del values["scheduler"]
    objects, notes, _ = render(values, "sat-prod")
    found = problems(objects, notes, "sat-prod")
    assert any("users create" in p for p in found["setup-jobs"]), found
    assert found["notes"], found
    assert any("'airflow-dags'" in p for p in found["claims"]), found
    assert any("execution_api_timeout" in p for p in found["config"]), found
    assert any("scheduler_idle_sleep_time" in p for p in found["config"]), found
    assert any("scheduler" in p for p in found["resources"]), found
