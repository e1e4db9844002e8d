"""Static checks of the images in docker/ (no Docker daemon here): sources, pins, the vendor dir."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
# The seed's library pins the training image must carry (issue: images).
TRAINING_PINS = ("torch", "transformers", "deepspeed", "accelerate", "datasets", "safetensors")
K8S_VERSION = "1.37.0"


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and `\\` continuations joined."""
    instructions, current = [], ""
    for raw in dockerfile.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, f"{dockerfile.name}: dangling line continuation"
    return instructions


def copy_sources(dockerfile: Path) -> list[str]:
    """Build-context sources of every COPY/ADD (stage copies `--from=...` are skipped)."""
    sources = []
    for keyword, args in _instructions(dockerfile):
        if keyword not in ("COPY", "ADD"):
            continue
        if args.startswith("["):
            words = json.loads(args)
        else:
            words = shlex.split(args)
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        if any(flag.startswith("--from=") for flag in flags):
            continue
        assert len(paths) >= 2, f"{dockerfile.name}: {keyword} {args}: needs a source and a destination"
        sources += paths[:-1]
    return sources


def _dockerignore(dockerfile: Path) -> list[str]:
    """Patterns of the Dockerfile's own ignore file (BuildKit: `<name>.dockerignore` next to it)."""
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not ignore.exists():
        return []
    lines = [line.strip() for line in ignore.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; `!` re-includes; a match on a parent counts."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        if body.startswith("**/"):
            matched = any(fnmatch.fnmatch(part, body[3:]) for part in parts)
        else:
            matched = any(fnmatch.fnmatch(candidate, body) for candidate in candidates)
        if matched:
            ignored = not negate
    return ignored


def _lock() -> dict[str, str]:
    """Release of every package the lock pins (`name==version \\`, hashes on the next lines).

    A local version label (`+cpu`) is dropped: the lock holds the CPU build of torch that lies on
    this machine, the training image the CUDA build of the same release.
    """
    pins = {}
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if match:
            pins[_normalise(match.group(1))] = match.group(2).split("+", 1)[0]
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dockerfile_pins(dockerfile: Path) -> dict[str, str]:
    text = " ".join(args for keyword, args in _instructions(dockerfile) if keyword == "RUN")
    return {_normalise(name): version for name, version in re.findall(r"\b([A-Za-z0-9][A-Za-z0-9_.-]*)==([0-9][^\s\"'\\]*)", text)}


# ---- the parser itself -------------------------------------------------------------------------
def test_copy_parser_handles_flags_stages_json_and_continuations(tmp_path):
    dockerfile = tmp_path / "x.Dockerfile"
    dockerfile.write_text(
        "FROM a AS b\n# COPY commented.txt /x\nCOPY --from=b /uv /usr/bin/uv\n"
        "COPY --chown=1:0 one.txt \\\n    two/ /dest/\nADD [\"three.txt\", \"/dest/\"]\n"
        "RUN pip install torch==2.13.0 \\\n  # a comment inside\n  numpy==2.4.6\n"
    )
    assert copy_sources(dockerfile) == ["one.txt", "two/", "three.txt"]
    assert _dockerfile_pins(dockerfile) == {"torch": "2.13.0", "numpy": "2.4.6"}


def test_dockerignore_rules():
    patterns = ["*", "!requirements.lock", "!ckpt_engine/", "**/__pycache__"]
    assert not _ignored("requirements.lock", patterns)
    assert not _ignored("ckpt_engine", patterns)
    assert _ignored("ckpt_engine/__pycache__", patterns)
    assert _ignored("dags", patterns)


# ---- the Dockerfiles ---------------------------------------------------------------------------
def test_both_images_exist():
    assert {p.name for p in DOCKERFILES} >= {"training.Dockerfile", "airflow.Dockerfile"}


@pytest.mark.parametrize("dockerfile", [pytest.param(p, id=p.stem) for p in DOCKERFILES])
def test_every_copy_source_exists_in_the_build_context(dockerfile):
    sources = copy_sources(dockerfile)
    assert sources, f"{dockerfile.name} copies nothing"
    patterns = _dockerignore(dockerfile)
    for source in sources:
        path = REPO / source
        assert path.exists(), f"{dockerfile.name}: COPY source {source} does not exist in the repository"
        if path.is_dir():
            files = [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            # git keeps no empty folder: a fresh clone would lack it and the build would fail
            assert files, f"{dockerfile.name}: COPY source {source} is an empty directory"
        assert not _ignored(source, patterns), f"{dockerfile.name}: COPY source {source} is excluded by its .dockerignore"


@pytest.mark.parametrize("dockerfile", [pytest.param(p, id=p.stem) for p in DOCKERFILES])
def test_dockerfile_starts_from_a_pinned_base(dockerfile):
    instructions = _instructions(dockerfile)
    args = dict(re.match(r"(\w+)=(\S*)", a).groups() for k, a in instructions if k == "ARG" and "=" in a)
    bases = [a.split()[0] for k, a in instructions if k == "FROM"]
    assert bases
    for base in bases:
        base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        assert ":" in base.rsplit("/", 1)[-1] and not base.endswith(":latest"), base


def test_training_image_pins_equal_the_lock():
    pins = _dockerfile_pins(DOCKER / "training.Dockerfile")
    lock = _lock()
    assert set(TRAINING_PINS) <= set(pins)
    for name, version in pins.items():
        assert lock.get(name) == version, f"training.Dockerfile pins {name}=={version}, requirements.lock has {lock.get(name)}"


def test_training_image_vendors_the_engine_and_sets_the_env():
    from sat_tasks.core.runtime_env import IMAGE_VENDOR_DIR

    instructions = _instructions(DOCKER / "training.Dockerfile")
    runs = " ".join(a for k, a in instructions if k == "RUN")
    env = " ".join(a for k, a in instructions if k == "ENV")
    assert "write_vendor_dir" in runs and IMAGE_VENDOR_DIR in runs
    assert f"CHECKPOINT_VENDOR={IMAGE_VENDOR_DIR}" in env
    assert f"PYTHONPATH={IMAGE_VENDOR_DIR}" in env
    assert "from datastates.llm import DecoratedCheckpointing" in runs  # the build smoke-tests the vendor dir


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(re.match(r"(\w+)=(\S*)", a).groups() for k, a in _instructions(dockerfile) if k == "ARG" and "=" in a)


def test_training_image_defaults_are_still_the_cuda_variant():
    """`make image` builds the CPU variant through build-args alone; without them the file is the CUDA image."""
    args = _arg_defaults(DOCKER / "training.Dockerfile")
    assert args["BASE_IMAGE"].startswith("nvidia/cuda:12.9.") and "cudnn-devel" in args["BASE_IMAGE"]
    assert args["UV_IMAGE"].startswith("ghcr.io/astral-sh/uv:")
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cu129"
    assert args["PYTHON_VERSION"] == "3.11"
    # the build-time additions default to nothing: no wheel folder, no extra CA, no cache
    assert args["FIND_LINKS"] == "" and args["BUILD_CA_BUNDLE"] == "" and args["UV_NO_CACHE"] == "1"


def test_training_image_build_settings_stay_out_of_the_image_env():
    instructions = _instructions(DOCKER / "training.Dockerfile")
    env = " ".join(a for k, a in instructions if k == "ENV")
    runs = " ".join(a for k, a in instructions if k == "RUN")
    for name in ("SSL_CERT_FILE", "BUILD_CA_BUNDLE", "FIND_LINKS", "UV_NO_CACHE", "UV_INDEX_STRATEGY",
                 "REQUESTS_CA_BUNDLE", "UV_NATIVE_TLS"):
        assert name not in env, f"{name} would be baked into the image's environment"
    # the CA bundle is trusted for the build's own step only, and the torch step compares every index
    assert 'export SSL_CERT_FILE="${BUILD_CA_BUNDLE}"' in runs
    assert "UV_INDEX_STRATEGY=unsafe-best-match uv pip install" in runs
    assert "${FIND_LINKS:+--find-links ${FIND_LINKS}}" in runs


def _run_fragment(pattern: str) -> str:
    runs = [a for k, a in _instructions(DOCKER / "training.Dockerfile") if k == "RUN"]
    for run in runs:
        match = re.search(pattern, run)
        if match:
            return match.group(0)
    raise AssertionError(f"no RUN matches {pattern}")


def test_training_image_constraints_are_the_lock_without_torch(tmp_path):
    """The CUDA build's torch (2.13.0+cu129) would contradict the lock's CPU pin: the build's constraints drop
    torch's entry (its hashes and comments with it) and keep every other pin with its hashes."""
    awk = _run_fragment(r"awk '[^']*' +/opt/sat/requirements\.lock")
    command = awk.replace("/opt/sat/requirements.lock", shlex.quote(str(REPO / "requirements.lock")))
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True).stdout
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(out, encoding="utf-8")
    kept = _locked(constraints)
    full = _locked(REPO / "requirements.lock")
    assert "torch" not in kept and full["torch"].endswith("+cpu")
    assert kept == {name: version for name, version in full.items() if name != "torch"}
    lock_lines = (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines()
    torch_block = _block(lock_lines, next(i for i, line in enumerate(lock_lines) if line.startswith("torch==")))
    torch_hashes = [line.strip() for line in torch_block if "--hash=" in line]
    assert torch_hashes and not set(torch_hashes) & {line.strip() for line in out.splitlines()}, "torch's hashes remained"
    assert out.count("--hash=") == "\n".join(lock_lines).count("--hash=") - len(torch_hashes)


def _block(lines: list[str], start: int) -> list[str]:
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line[:1].isspace():
            break
        block.append(line)
    return block


def test_training_image_login_shell_keeps_the_venv(tmp_path):
    """`bash -lc` (the pod's supervisor) runs /etc/profile, which resets PATH on Debian: /etc/profile.d/sat.sh
    puts the venv back in front, once."""
    printf = _run_fragment(r"printf .*> /etc/profile\.d/sat\.sh")
    profile = tmp_path / "sat.sh"
    subprocess.run(["bash", "-c", printf.replace("/etc/profile.d/sat.sh", shlex.quote(str(profile)))],
                   check=True, timeout=60)
    sourced = shlex.quote(str(profile))
    script = f'PATH=/usr/bin:/bin; . {sourced}; . {sourced}; echo "$PATH|$VIRTUAL_ENV"'
    out = subprocess.run(["env", "-i", "bash", "--norc", "--noprofile", "-c", script],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == "/opt/sat/venv/bin:/usr/bin:/bin|/opt/sat/venv"


def test_airflow_image_is_the_official_one_with_the_project():
    instructions = _instructions(DOCKER / "airflow.Dockerfile")
    assert any(k == "FROM" and a.startswith("apache/airflow:3.3.2-python3.11") for k, a in instructions)
    sources = {s.rstrip("/") for s in copy_sources(DOCKER / "airflow.Dockerfile")}
    assert {"dags", "plugins", "sat_tasks", "ckpt_engine", "include", "airflow.cfg", "requirements.lock",
            "pyproject.toml"} <= sources


# ---- the deployment files ----------------------------------------------------------------------
def test_helm_values_use_postgres_an_executor_and_secrets_only():
    values = yaml.safe_load((DOCKER / "helm-values.yaml").read_text(encoding="utf-8"))
    assert values["executor"] in ("KubernetesExecutor", "CeleryExecutor")
    assert values["data"]["metadataSecretName"]
    assert "metadataConnection" not in values["data"]  # no inline database password
    env_names = {item["envName"] for item in values["secret"]}
    assert {"AIRFLOW_CONN_SAT_OBJECT_STORAGE", "AIRFLOW_CONN_SAT_REGISTRY_MAIN"} <= env_names
    for item in values.get("env", []):
        value = item.get("value", "")
        assert "password" not in value.lower() and "secret" not in item["name"].lower(), item
    assert values["config"]["sat"]["backend"] == "kubernetes"
    assert values["images"]["airflow"]["repository"].endswith("/sat/airflow")


def test_rbac_manifests_are_schema_valid():
    import kubernetes_validate

    documents = [d for d in yaml.safe_load_all((DOCKER / "k8s-rbac.yaml").read_text(encoding="utf-8")) if d]
    assert {d["kind"] for d in documents} >= {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    for document in documents:
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)


# ---- the vendor directory imports on its own ---------------------------------------------------
_ISOLATED_IMPORT = """
import sys
# The project is installed editable in the dev venv; drop its finder so only PYTHONPATH counts.
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__]
from datastates.llm import DecoratedCheckpointing
import ckpt_engine, datastates
repo = sys.argv[1]
leaked = sorted(n for n, m in list(sys.modules.items())
                if (getattr(m, "__file__", None) or "").startswith(repo + "/") and "/.venv/" not in m.__file__)
print(ckpt_engine.__file__)
print(datastates.__file__)
print("leaked:", leaked)
print("repo on path:", any(p.rstrip("/") == repo for p in sys.path))
"""


@pytest.mark.skipif(not (REPO / "ckpt_engine" / "vendor.py").exists(), reason="ckpt_engine/vendor.py not written yet")
def test_vendor_dir_imports_on_its_own(tmp_path):
    from ckpt_engine.vendor import write_vendor_dir

    vendor = write_vendor_dir(tmp_path / "vendor")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(vendor), "HOME": str(tmp_path),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-s", "-c", _ISOLATED_IMPORT, str(REPO)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(str(vendor) + "/ckpt_engine/")
    assert lines[1].startswith(str(vendor) + "/datastates/")
    assert lines[2] == "leaked: []"
    assert lines[3] == "repo on path: False"


# ---- the Helm path: the chart's schema, the airflow.cfg it renders, the RBAC, the slim lock ----------
VALUES = DOCKER / "helm-values.yaml"
CHART_SCHEMA = REPO / "tests" / "fixtures" / "airflow_chart_values.schema.subset.json"
HEAVY = ("torch", "transformers", "deepspeed", "accelerate", "datasets", "safetensors", "tokenizers")
# The chart's own `config:` defaults (chart/values.yaml, as of the schema's commit), the keys that matter here:
# it sets no dags_are_paused_at_creation, import timeout or auth manager, so Airflow's defaults apply.
CHART_CONFIG_DEFAULTS = {
    "core": {"load_examples": "False", "colored_console_log": "False", "remote_logging": "False"},
    "logging": {"remote_logging": "False", "colored_console_log": "False"},
    "scheduler": {"standalone_dag_processor": "True", "run_duration": "41460"},
    "triggerer": {"default_capacity": "1000"},
}


def _values() -> dict:
    return yaml.safe_load(VALUES.read_text(encoding="utf-8"))


def _airflow_defaults() -> dict[str, dict[str, str]]:
    """Airflow's own defaults, from the installed package's config.yml (what applies where no file sets a key)."""
    import importlib.util

    path = Path(importlib.util.find_spec("airflow").origin).parent / "config_templates" / "config.yml"
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {section: {key: str(option.get("default")) for key, option in (body.get("options") or {}).items()
                      if option.get("default") is not None} for section, body in spec.items()}


def render_chart_config(values: dict) -> dict[str, dict[str, str]]:
    """What Airflow reads in a chart pod: its defaults < the chart's airflow.cfg (chart defaults < values `config:`)
    < the image's ENV < the values' `env:` (AIRFLOW__SECTION__KEY variables win over any file)."""
    rendered = {section: dict(body) for section, body in _airflow_defaults().items()}
    for layer in (CHART_CONFIG_DEFAULTS, values.get("config", {})):
        for section, body in layer.items():
            rendered.setdefault(section, {}).update({key: str(value) for key, value in body.items()})
    image_env = {}
    for keyword, args in _instructions(DOCKER / "airflow.Dockerfile"):
        if keyword == "ENV":
            image_env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    values_env = {item["name"]: item["value"] for item in values.get("env", [])}
    for name, value in {**image_env, **values_env}.items():
        match = re.fullmatch(r"AIRFLOW__([A-Z0-9_]+?)__([A-Z0-9_]+)", name)
        if match:
            rendered.setdefault(match.group(1).lower(), {})[match.group(2).lower()] = value
    return rendered


def _project_cfg() -> dict[str, dict[str, str]]:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO / "airflow.cfg", encoding="utf-8")
    return {section: dict(parser[section]) for section in parser.sections()}


def test_helm_values_pass_the_chart_schema():
    import jsonschema

    schema = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    values = _values()
    jsonschema.validate(values, schema)
    unknown = set(values) - set(schema["x-sat-top-level"])
    assert not unknown, f"helm-values.yaml sets top-level keys the chart does not declare: {sorted(unknown)}"
    assert set(values) <= set(schema["properties"]), "every key the values set has its schema subtree vendored"


@pytest.mark.parametrize("path, bad", [
    pytest.param(("dags", "gitSync", "subpath"), "dags", id="misspelt-gitSync-key"),
    pytest.param(("dags", "persistence", "accessMode"), "ReadWriteAll", id="accessMode-not-in-enum"),
    pytest.param(("config", "core", "dagbag_import_timeout"), ["60"], id="config-value-not-scalar"),
    pytest.param(("env",), [{"name": "X", "valueFrom": {}}], id="env-without-value"),
])
def test_the_chart_schema_rejects_what_the_chart_rejects(path, bad):
    import copy

    import jsonschema

    schema = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    values = copy.deepcopy(_values())
    node = values
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, schema)


def test_the_chart_renders_the_config_sat_depends_on():
    values = _values()
    cfg = render_chart_config(values)
    project = _project_cfg()
    airflow = _airflow_defaults()
    assert cfg["core"]["dags_are_paused_at_creation"] == "False", "job DAGs would start paused"
    assert cfg["core"]["dags_are_paused_at_creation"] == project["core"]["dags_are_paused_at_creation"]
    assert float(cfg["core"]["dagbag_import_timeout"]) == float(project["core"]["dagbag_import_timeout"])
    processor_timeout = project.get("dag_processor", {}).get("dag_file_processor_timeout") \
        or airflow["dag_processor"]["dag_file_processor_timeout"]
    assert float(cfg["dag_processor"]["dag_file_processor_timeout"]) >= float(processor_timeout)
    assert float(cfg["dag_processor"]["dag_file_processor_timeout"]) > float(cfg["core"]["dagbag_import_timeout"])
    assert int(cfg["dag_processor"]["parsing_processes"]) >= 1
    # authentication on, with users, passwords kept where every API server replica reads them
    assert cfg["core"]["auth_manager"].endswith("SimpleAuthManager")
    assert cfg["core"]["simple_auth_manager_all_admins"] == "False"
    assert cfg["core"]["simple_auth_manager_users"].split(",")[0].split(":") == ["admin", "admin"]
    mounts = [m["mountPath"] for m in values["volumeMounts"]]
    assert any(cfg["core"]["simple_auth_manager_passwords_file"].startswith(m + "/") for m in mounts)
    # task logs survive the KubernetesExecutor's pods
    assert cfg["logging"]["remote_logging"] == "True"
    assert cfg["logging"]["remote_log_conn_id"] == cfg["sat"]["object_storage_conn_id"] == "sat_object_storage"
    assert cfg["logging"]["remote_base_log_folder"].startswith("s3://")
    # SAT's own section
    assert cfg["sat"]["backend"] == "kubernetes"
    for key in ("object_storage_conn_id", "kubernetes_namespace", "kubernetes_conn_id",
                "final_checkpoint_grace_seconds", "metrics_interval_seconds"):
        assert cfg["sat"][key] == project["sat"][key], key
    assert cfg["sat"]["k8s_object_storage_secret"] == "sat-object-storage"
    # the DAG files are the image's (with its sat_tasks); specs arrive by git-sync on the DAG claim: jobs_dir lies in
    # its checkout; workspaces on the shared claim
    assert cfg["core"]["dags_folder"] == "/opt/airflow/dags", "the image's DAG files, not a git checkout's"
    assert values["dags"]["persistence"]["enabled"] and values["dags"]["persistence"]["accessMode"] == "ReadWriteMany"
    checkout = f"{values['dags']['mountPath']}/repo"
    assert not cfg["core"]["dags_folder"].startswith(values["dags"]["mountPath"])
    assert cfg["sat"]["jobs_dir"] == f"{checkout}/include/jobs"
    assert any(cfg["sat"]["workspaces_dir"].startswith(m + "/") for m in mounts)
    assert "site-packages" not in cfg["sat"]["workspaces_dir"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in values["volumes"]}
    assert claims == {"sat-shared": "sat-shared"}
    api_mounts = {m["mountPath"] for m in values["apiServer"]["extraVolumeMounts"]}
    assert values["dags"]["mountPath"] in api_mounts, "the API server reads the specs too (Training Jobs list)"
    # the settings of the project's airflow.cfg a chart pod would otherwise lose (issue 48, item 6)
    for section, key in (("workers", "execution_api_timeout"), ("workers", "min_heartbeat_interval"),
                         ("scheduler", "scheduler_idle_sleep_time"), ("scheduler", "min_file_process_interval")):
        assert float(cfg[section][key]) == float(project[section][key]), (section, key)
    assert int(cfg["core"]["parallelism"]) > int(airflow["core"]["parallelism"]) // 2


def test_helm_values_work_for_any_release_name_and_create_no_user():
    """No claim named after one release; no FAB create-user Job (it fails with the simple auth manager) and so no
    admin/admin in the install notes. tests/test_helm_render.py checks the same on the rendered chart."""
    values = _values()
    assert "airflow-dags" not in VALUES.read_text(encoding="utf-8")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in values["apiServer"]["extraVolumes"]]
    assert claims == ['{{ include "airflow_dags_volume_claim" . }}']
    assert values["createUserJob"]["enabled"] is False
    assert values["webserver"]["defaultUser"]["enabled"] is False
    assert values["dags"]["gitSync"]["enabled"] is False, "the chart's git-sync: see the values' dags comment"
    sync = values["dagProcessor"]["extraContainers"]
    assert [c["name"] for c in sync] == ["git-sync"] and sync[0]["volumeMounts"][0]["name"] == "dags"


@pytest.mark.parametrize("component", ["scheduler", "dagProcessor", "triggerer", "apiServer", "statsd",
                                       "migrateDatabaseJob", "workers"])
def test_every_component_has_resources(component):
    resources = _values()[component]["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]


def test_the_render_sees_what_the_chart_alone_would_give():
    """Without the values' config the chart leaves Airflow's defaults: paused DAGs, a 30 s import timeout."""
    cfg = render_chart_config({"config": {}, "env": []})
    assert cfg["core"]["dags_are_paused_at_creation"] == "True"
    assert float(cfg["core"]["dagbag_import_timeout"]) == 30.0
    assert cfg["logging"]["remote_logging"] == "False"


def test_pgbouncer_is_off_or_has_its_secrets():
    pgbouncer = _values().get("pgbouncer", {})
    if pgbouncer.get("enabled"):
        assert pgbouncer.get("configSecretName"), "pgbouncer with an external database needs configSecretName"
        assert (pgbouncer.get("metricsExporterSidecar") or {}).get("statsSecretName")


def test_dag_processor_is_sized():
    processor = _values()["dagProcessor"]
    assert processor["enabled"]
    assert processor["resources"]["requests"]["cpu"] and processor["resources"]["limits"]["memory"]


# Kubernetes API calls of the backend -> (api group, resource, verb, cluster-wide?)
_K8S_CALLS = {
    "create_namespaced_pod": ("", "pods", "create", False),
    "read_namespaced_pod": ("", "pods", "get", False),
    "list_namespaced_pod": ("", "pods", "list", False),
    "patch_namespaced_pod": ("", "pods", "patch", False),
    "delete_namespaced_pod": ("", "pods", "delete", False),
    "read_namespaced_pod_log": ("", "pods/log", "get", False),
    "create_namespaced_service": ("", "services", "create", False),
    "list_namespaced_service": ("", "services", "list", False),
    "read_namespaced_service": ("", "services", "get", False),
    "delete_namespaced_service": ("", "services", "delete", False),
    "create_namespaced_secret": ("", "secrets", "create", False),
    "patch_namespaced_secret": ("", "secrets", "patch", False),
    "delete_namespaced_secret": ("", "secrets", "delete", False),
    "delete_collection_namespaced_secret": ("", "secrets", "deletecollection", False),
    "create_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "create", False),
    "delete_collection_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "deletecollection", False),
    "create_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "create", False),
    "read_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "get", False),
    "list_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "list", False),
    "delete_namespaced_persistent_volume_claim": ("", "persistentvolumeclaims", "delete", False),
    "list_namespaced_event": ("", "events", "list", False),
    "read_node": ("", "nodes", "get", True),
    "list_node": ("", "nodes", "list", True),
    "patch_node": ("", "nodes", "patch", True),
    "read_priority_class": ("scheduling.k8s.io", "priorityclasses", "get", True),
    # the one custom object SAT reads: a workspace's Kueue LocalQueue (elastic.workspace_queue_waiting)
    "get_namespaced_custom_object": ("kueue.x-k8s.io", "localqueues", "get", False),
}
# Calls the manifests deliberately do not grant, and why.
_NOT_GRANTED = {
    # the PriorityClass is shipped in k8s-rbac.yaml; SAT only creates it where it may (a 403 is one log line)
    "create_priority_class": "shipped by the manifest",
}


def _backend_calls() -> set[str]:
    """Kubernetes API methods (of CoreV1Api / SchedulingV1Api / CustomObjectsApi / NetworkingV1Api) named in
    sat_tasks/backends/kubernetes/."""
    from kubernetes.client import (
        CoreV1Api,
        CustomObjectsApi,
        NetworkingV1Api,
        SchedulingV1Api,
    )

    names = set()
    for path in (REPO / "sat_tasks" / "backends" / "kubernetes").glob("*.py"):
        names |= set(re.findall(r"\.((?:create|read|get|list|patch|delete|replace|watch|connect)_[a-z_]+)\b",
                                path.read_text(encoding="utf-8")))
    apis = (CoreV1Api, SchedulingV1Api, CustomObjectsApi, NetworkingV1Api)
    return {name for name in names if any(hasattr(api, name) for api in apis)}


def _grants() -> set[tuple[str, str, str, bool]]:
    """(group, resource, verb, cluster-wide) for the Airflow worker's account."""
    documents = [d for d in yaml.safe_load_all((DOCKER / "k8s-rbac.yaml").read_text(encoding="utf-8")) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in documents if d["kind"] in ("Role", "ClusterRole")}
    granted = set()
    for binding in (d for d in documents if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["name"] == "airflow-worker" for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        cluster = binding["kind"] == "ClusterRoleBinding"
        if not cluster and binding["metadata"]["namespace"] != "sat-jobs":
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb, cluster))
    return granted


def test_rbac_grants_every_call_of_the_kubernetes_backend():
    calls = _backend_calls()
    assert {"list_node", "create_namespaced_secret", "read_priority_class", "get_namespaced_custom_object",
            "create_namespaced_network_policy"} <= calls  # the grep works
    unknown = calls - set(_K8S_CALLS) - set(_NOT_GRANTED)
    assert not unknown, f"new Kubernetes calls in sat_tasks/backends/kubernetes/: map them in _K8S_CALLS: {unknown}"
    granted = _grants()
    missing = []
    for call in sorted(calls - set(_NOT_GRANTED)):
        group, resource, verb, cluster = _K8S_CALLS[call]
        if (group, resource, verb, True) not in granted and (cluster or (group, resource, verb, False) not in granted):
            missing.append(f"{call}: {verb} {resource}" + (" (cluster-wide)" if cluster else " in sat-jobs"))
    assert not missing, "k8s-rbac.yaml lacks: " + "; ".join(missing)


def test_rbac_grants_on_secrets_exactly_what_the_backend_calls():
    """Secrets hold credentials: the Role grants on them exactly the verbs the backend's calls use, no more
    (no `get`/`watch`: SAT never reads a Secret back), and nothing cluster-wide (ADR 0032)."""
    calls = _backend_calls()
    assert {"create_namespaced_secret", "patch_namespaced_secret", "delete_namespaced_secret"} <= calls
    called = {_K8S_CALLS[c][2] for c in calls if _K8S_CALLS.get(c, ("", ""))[1] == "secrets"}
    granted = {(verb, cluster) for group, resource, verb, cluster in _grants() if resource == "secrets"}
    assert granted == {(verb, False) for verb in called}, granted


def test_rbac_ships_the_warm_pool_priority_class():
    from sat_tasks.backends.kubernetes.warm import render_priority_class

    documents = [d for d in yaml.safe_load_all((DOCKER / "k8s-rbac.yaml").read_text(encoding="utf-8")) if d]
    shipped = [d for d in documents if d["kind"] == "PriorityClass"]
    assert shipped == [render_priority_class()]


def test_staging_and_upload_pods_carry_the_pull_secret():
    from sat_tasks.backends.kubernetes.settings import KubernetesSettings
    from sat_tasks.backends.kubernetes.staging import build_upload_pod
    from sat_tasks.spec.loading import load_spec

    job = load_spec(REPO / "include" / "jobs" / "tiny-llama-demo.yaml")
    with_secret = build_upload_pod(job, "manual__1", namespace="sat-jobs",
                                   settings=KubernetesSettings(staging_pull_secret="sat-airflow-image-pull"))
    assert with_secret["spec"]["imagePullSecrets"] == [{"name": "sat-airflow-image-pull"}]
    without = build_upload_pod(job, "manual__1", namespace="sat-jobs", settings=KubernetesSettings())
    assert "imagePullSecrets" not in without["spec"]
    assert _values()["config"]["sat"]["k8s_staging_pull_secret"] == _values()["registry"]["secretName"]


def _locked(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if match:
            pins[_normalise(match.group(1))] = match.group(2)
    return pins


def test_airflow_lock_is_the_project_lock_without_the_training_stack():
    slim, full = _locked(REPO / "requirements-airflow.lock"), _locked(REPO / "requirements.lock")
    assert slim and set(slim) <= set(full)
    assert {name: version for name, version in slim.items() if full[name] != version} == {}
    assert not set(HEAVY) & set(slim), "the Airflow image must not carry the training stack"
    assert {"apache-airflow", "apache-airflow-providers-cncf-kubernetes", "apache-airflow-providers-amazon",
            "boto3"} <= set(slim)
    assert full["torch"].startswith("2.13.0")
    runs = " ".join(a for k, a in _instructions(DOCKER / "airflow.Dockerfile") if k == "RUN")
    assert "--require-hashes -r /opt/sat/src/requirements-airflow.lock" in runs
    assert "requirements.lock" not in runs.replace("requirements-airflow.lock", "")
    assert "deepspeed" not in runs and "TORCH_INDEX_URL" not in runs


def _module_level_imports(path: Path) -> set[str]:
    """Modules imported when `path` is imported (not inside functions; TYPE_CHECKING blocks skipped)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
    visit(tree.body)
    return found


def test_no_airflow_side_module_imports_the_training_stack_at_import_time():
    """The slim Airflow image holds only if sat_tasks (and what it imports of ckpt_engine) imports no torch & co."""
    def module_file(name: str) -> Path | None:
        parts = name.split(".")
        if parts[0] not in ("sat_tasks", "ckpt_engine"):
            return None
        base = REPO.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    roots = [p for p in (REPO / "sat_tasks").rglob("*.py") if "__pycache__" not in p.parts]
    roots += [p for p in (REPO / "dags").glob("*.py")] + [p for p in (REPO / "plugins").glob("*.py")]
    offenders = []
    for root in roots:
        seen, queue = set(), [root]
        while queue:
            path = queue.pop()
            if path in seen:
                continue
            seen.add(path)
            for name in _module_level_imports(path):
                if name.split(".")[0] in HEAVY:
                    offenders.append(f"{root.relative_to(REPO)} -> {path.relative_to(REPO)} imports {name}")
                parts = name.split(".")
                for i in range(1, len(parts) + 1):  # a package's __init__ runs too
                    found = module_file(".".join(parts[:i]))
                    if found is not None:
                        queue.append(found)
    assert not offenders, "\n".join(sorted(set(offenders))[:20])
