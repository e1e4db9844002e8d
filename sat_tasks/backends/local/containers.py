"""Podman with the project's own configuration: the local backend's container runtime (ADR 0035).

Nothing here edits the machine's global files (`/etc/containers`): every podman or buildah
call gets `podman_env()`, which points `CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF` and
`CONTAINERS_REGISTRIES_CONF` at files under `containers_dir()` (`.sat/containers` by default;
`[sat] containers_dir`). What the files say, and why (measured on this kind of machine):

- `runtime = "runc"`: crun refuses this kernel's hybrid cgroup layout;
- `default_ulimits = []`: podman's default `nofile=1048576` is above the hard limit, and a
  container may not raise it (no CAP_SYS_RESOURCE);
- `cgroup_manager = "cgroupfs"` and a file events log: no systemd session is needed;
- the image store (graphroot, runroot) is the project's own, so `make image` and the tests
  never touch another user's images;
- short names are not resolved against any registry: an image is always named in full.

`python -m sat_tasks.backends.local.containers` prints the `export` lines for a shell
(`eval "$(... containers)"`), so a person can run `podman images` against the same store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from sat_tasks.config import PROJECT_ROOT, sat_setting

CONTAINERS_CONF = """\
# SAT's own podman settings (sat_tasks/backends/local/containers.py); never the machine's global files.
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""

REGISTRIES_CONF = """\
# Images are named in full (registry/repository:tag): no short-name search.
unqualified-search-registries = []
short-name-mode = "enforcing"
"""


def containers_dir() -> Path:
    """Where the project's podman configuration and image store live (`[sat] containers_dir`)."""
    configured = sat_setting("containers_dir", "")
    return Path(configured).expanduser() if configured else PROJECT_ROOT / ".sat" / "containers"


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)


def podman_env(base: Path | None = None) -> dict[str, str]:
    """The variables every podman/buildah call of the project gets; writes the files they name."""
    base = base or containers_dir()
    (base / "storage").mkdir(parents=True, exist_ok=True)
    (base / "run").mkdir(parents=True, exist_ok=True)
    (base / "tmp").mkdir(parents=True, exist_ok=True)
    _write_if_changed(base / "containers.conf", CONTAINERS_CONF)
    _write_if_changed(base / "registries.conf", REGISTRIES_CONF)
    _write_if_changed(base / "storage.conf",
                      f'[storage]\ndriver = "overlay"\ngraphroot = "{base / "storage"}"\nrunroot = "{base / "run"}"\n')
    return {
        "CONTAINERS_CONF": str(base / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(base / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(base / "registries.conf"),
        # buildah's and podman's large temporary files (image layers) stay on the store's disk
        "TMPDIR": str(base / "tmp"),
    }


def podman_installed() -> bool:
    """Whether this host can run containers the way SAT runs them (podman and runc on PATH)."""
    return shutil.which("podman") is not None and shutil.which("runc") is not None


def podman(args: Sequence[str], *, timeout: float = 120, check: bool = True, input: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `podman ARGS` (a list: nothing passes through a shell) with the project's configuration."""
    return subprocess.run(["podman", *args], env={**os.environ, **podman_env(), **(env or {})}, text=True,
                          capture_output=True, timeout=timeout, check=check, input=input)


def main() -> None:
    for key, value in podman_env().items():
        print(f"export {key}={value}")


if __name__ == "__main__":
    main()
