"""The training image `make image` builds (sat_tasks/backends/local/image_build.py), run with podman.

`make test` builds the image first wherever podman is installed, so here a missing image is a
failure that says what to run, not a skip. Only a host without podman at all skips the checks that
run the image (and says so); the build's own arguments are checked everywhere.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from sat_tasks.backends.local import image_build
from sat_tasks.backends.local.containers import containers_dir, podman, podman_installed
from sat_tasks.config import PROJECT_ROOT

IMAGE = image_build.TRAINING_IMAGE
VENV_PYTHON = "/opt/sat/venv/bin/python"
# What a pod runs (sat_tasks.backends.kubernetes.supervisor: `bash -lc`), as the local runtime runs a job:
# no network, a uid and gid of its own, a read-only root filesystem, no capabilities.
RUN_AS_A_JOB = ["run", "--rm", "--network=none", "--user", "1000:1000", "--read-only", "--cap-drop=all",
                "--security-opt=no-new-privileges"]
PROBE = r"""
import json, os, subprocess, sys
import torch, transformers, deepspeed, ckpt_engine
from datastates.llm import DecoratedCheckpointing
print("SAT-PROBE " + json.dumps({
    "python": list(sys.version_info[:3]),
    "executable": sys.executable,
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "deepspeed": deepspeed.__version__,
    "ckpt_engine": ckpt_engine.__file__,
    "checkpointing": DecoratedCheckpointing.__name__,
    "uid": os.getuid(), "gid": os.getgid(),
    "login_python": os.environ["LOGIN_PYTHON"],
    "root_writable": os.access("/", os.W_OK),
    "env": sorted(os.environ),
}))
"""


def _lock_version(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", (PROJECT_ROOT / "requirements.lock").read_text(encoding="utf-8"),
                      flags=re.MULTILINE)
    assert match, name
    return match.group(1)


# ---- the build's arguments (no podman needed) ---------------------------------------------------
def test_the_image_is_the_one_the_demo_spec_names():
    spec = yaml.safe_load((PROJECT_ROOT / "include" / "jobs" / "tiny-llama-demo.yaml").read_text(encoding="utf-8"))
    assert spec["image"]["url"] == IMAGE


def test_the_cpu_build_mounts_wheels_ca_and_cache_for_the_build_only(tmp_path):
    argv = image_build.bud_command(wheels=tmp_path / "wheels", ca_bundle=tmp_path / "ca.crt", uv_cache=tmp_path / "uv")
    args = dict(a.split("=", 1) for a in (argv[i + 1] for i, w in enumerate(argv) if w == "--build-arg"))
    volumes = [argv[i + 1] for i, w in enumerate(argv) if w == "--volume"]
    assert args["BASE_IMAGE"] == image_build.BASE_IMAGE and args["UV_IMAGE"] == image_build.UV_IMAGE
    assert args["TORCH_INDEX_URL"] == "https://pypi.org/simple"  # download.pytorch.org is not reachable here
    assert f"{tmp_path / 'wheels'}:{args['FIND_LINKS']}:ro" in volumes
    assert f"{tmp_path / 'ca.crt'}:{args['BUILD_CA_BUNDLE']}:ro" in volumes
    assert f"{tmp_path / 'uv'}:{image_build.BUILD_UV_CACHE}" in volumes and args["UV_NO_CACHE"] == "0"
    assert argv[argv.index("-t") + 1] == IMAGE and argv[-1] == str(PROJECT_ROOT)
    # buildah 1.28 keeps the `uv` stage's working container (and its overlay mount) after each build without it
    assert "--layers" in argv and "--force-rm" in argv
    assert argv[argv.index("--ignorefile") + 1].endswith("docker/training.Dockerfile.dockerignore")
    bare = image_build.bud_command(wheels=None, ca_bundle=None, uv_cache=None)
    assert "--volume" not in bare and not any(a.startswith(("FIND_LINKS", "BUILD_CA", "UV_NO_CACHE")) for a in bare)


def test_debootstrap_uses_the_mirror_apt_uses(tmp_path, monkeypatch):
    monkeypatch.delenv("SAT_DEBIAN_MIRROR", raising=False)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\n# a snapshot, commented\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n")
    assert image_build.debian_mirror([deb822]) == "http://mirror.example/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old.example/debian bookworm main\n"
                        "deb [signed-by=/k.gpg] https://other.example/apt cloud-sdk-bookworm main\n"
                        "deb [arch=amd64] http://line.example/debian bookworm main\n")
    assert image_build.debian_mirror([one_line, deb822]) == "http://line.example/debian"
    assert image_build.debian_mirror([tmp_path / "absent.list"]) == image_build.DEFAULT_MIRROR
    monkeypatch.setenv("SAT_DEBIAN_MIRROR", "http://override.example/debian/")
    assert image_build.debian_mirror([deb822]) == "http://override.example/debian"


def test_missing_tools_are_named_with_what_installs_them(monkeypatch, capsys):
    monkeypatch.setattr(image_build.shutil, "which", lambda tool, path=None: None if tool == "debootstrap" else tool)
    assert image_build.main([]) == 1
    err = capsys.readouterr().err
    assert "debootstrap" in err and "make system-deps" in err


# ---- the built image ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image():
    if not podman_installed():
        pytest.skip("podman (with runc) is not installed on this host, so the training image cannot be run: "
                    "`make system-deps` installs it, and `make test` then builds the image")
    if podman(["image", "exists", IMAGE], check=False, timeout=120).returncode != 0:
        pytest.fail(f"the training image {IMAGE} is not in the project's image store ({containers_dir()}): "
                    "run `make image` (`make test` builds it first where podman is installed; "
                    "if the store was emptied, remove .sat/containers/image.stamp)", pytrace=False)
    return IMAGE


def test_the_image_runs_a_job_as_a_non_root_user_offline_read_only(image):
    script = f"LOGIN_PYTHON=$(command -v python) exec python -c {shlex.quote(PROBE)}"
    out = podman([*RUN_AS_A_JOB, image, "bash", "-lc", script], timeout=600, check=False)
    assert out.returncode == 0, f"podman run exited {out.returncode}:\n{out.stderr[-3000:]}"
    lines = [line for line in out.stdout.splitlines() if line.startswith("SAT-PROBE ")]
    assert lines, out.stdout[-2000:]
    probe = json.loads(lines[-1].removeprefix("SAT-PROBE "))
    assert probe["python"][:2] == [3, 11]
    assert probe["login_python"] == VENV_PYTHON, "a login shell (`bash -lc`) lost the venv's PATH"
    assert probe["executable"] == VENV_PYTHON
    assert probe["torch"] == _lock_version("torch")  # the lock's CPU build, from the machine's wheel folder
    assert probe["transformers"] == _lock_version("transformers")
    assert probe["deepspeed"] == _lock_version("deepspeed")
    assert probe["ckpt_engine"].startswith("/opt/sat/checkpoint_vendor/ckpt_engine/")
    assert probe["checkpointing"] == "DecoratedCheckpointing"
    assert (probe["uid"], probe["gid"]) == (1000, 1000)
    assert probe["root_writable"] is False
    # build-time settings are not the image's environment
    assert not {"SSL_CERT_FILE", "BUILD_CA_BUNDLE", "FIND_LINKS", "UV_NO_CACHE", "UV_INDEX_STRATEGY"} & set(probe["env"])


def test_the_image_keeps_none_of_the_builds_mounts(image):
    config = json.loads(podman(["image", "inspect", image], timeout=120).stdout)[0]["Config"]
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    assert env["PATH"].startswith("/opt/sat/venv/bin:") and env["CHECKPOINT_VENDOR"] == "/opt/sat/checkpoint_vendor"
    assert not {"SSL_CERT_FILE", "BUILD_CA_BUNDLE", "FIND_LINKS", "UV_NO_CACHE"} & set(env)
    # the wheel folder, the host's CA bundle and uv cache were mounted, not copied: at most empty mount points remain
    # as root: the image's own user (1000, ADR 0040) could not look into /root
    listing = podman(["run", "--rm", "--network=none", "--user=0", image, "bash", "-c",
                      ("find /run/sat-build /root/.cache -type f -size +0 2>/dev/null; "
                       "find /opt/sat /usr/local/bin -name '*.whl' 2>/dev/null; ls /tmp")],
                     timeout=300, check=False)
    assert listing.returncode == 0, listing.stderr[-2000:]
    assert listing.stdout.strip() == "", f"build leftovers in the image: {listing.stdout}"


def test_a_stamp_without_its_image_is_dropped_so_make_builds_again(image, tmp_path):
    current = json.loads(podman(["image", "inspect", image], timeout=120).stdout)[0]["Id"]
    kept, stale = tmp_path / "kept.stamp", tmp_path / "stale.stamp"
    kept.write_text(json.dumps({"id": current}), encoding="utf-8")
    stale.write_text(json.dumps({"id": "0" * 64}), encoding="utf-8")
    assert image_build.main(["--stamp", str(kept), "--drop-stale-stamp"]) == 0
    assert image_build.main(["--stamp", str(stale), "--drop-stale-stamp"]) == 0
    assert kept.exists() and not stale.exists()
