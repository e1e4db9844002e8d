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
    args = dict(re.match(r"(\w+)=(\S+)", a).groups() for k, a in instructions if k == "ARG" and "=" in a)
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
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(str(vendor) + "/ckpt_engine/")
    assert lines[1].startswith(str(vendor) + "/datastates/")
    assert lines[2] == "leaked: []"
    assert lines[3] == "repo on path: False"
