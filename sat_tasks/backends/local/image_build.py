"""`make image`: SAT's training image, built on this host from `docker/training.Dockerfile`.

Offline but for the package registries (the Debian mirror apt already uses, and PyPI):

1. the base: `debootstrap --variant=minbase bookworm` against apt's own Debian mirror, with
   Python 3.11 (the lock's interpreter), bash, libc-bin, git and ca-certificates, imported into
   the project's image store as `BASE_IMAGE` (no Docker Hub);
2. `UV_IMAGE`: an image holding only `/uv`, the venv's own uv binary (no ghcr.io);
3. `buildah bud` of the Dockerfile with those two, PyPI as `TORCH_INDEX_URL` and the machine's
   wheel folder (`/opt/wheels`: the lock's `torch==2.13.0+cpu`) mounted as `FIND_LINKS`. The
   build trusts the host's CA bundle (a TLS-inspecting proxy) and reuses the host's uv cache,
   both mounted for the build's steps only: neither is in the image.

Every buildah/podman call gets the project's own containers configuration
(`containers.podman_env()`), so the image lands in the project's store (`.sat/containers`),
tagged as the image the demo spec names. A stamp file records what was built; the Makefile
compares it with the sources, so a second `make image` does nothing.

`python -m sat_tasks.backends.local.image_build [--stamp PATH] [--rebuild-base] [--drop-stale-stamp]`
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sat_tasks.backends.local.containers import containers_dir, podman_env
from sat_tasks.config import PROJECT_ROOT
from sat_tasks.errors import SatError

TRAINING_IMAGE = "registry.sat.local/sat/training:0.1.0"  # include/jobs/tiny-llama-demo.yaml's image.url
BASE_IMAGE = "localhost/sat/debian-base:bookworm"
UV_IMAGE = "localhost/sat/uv:local"
DOCKERFILE = PROJECT_ROOT / "docker" / "training.Dockerfile"
SUITE = "bookworm"  # Debian 12: python3 is 3.11, the lock's interpreter
BASE_PACKAGES = ("python3", "ca-certificates", "bash", "libc-bin", "git")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
WHEELS_DIR = Path("/opt/wheels")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the build's steps see the host's files (build-time mounts, not in the image).
BUILD_WHEELS = "/run/sat-build/wheels"
BUILD_CA = "/run/sat-build/ca-certificates.crt"
BUILD_UV_CACHE = "/root/.cache/uv"
# The tools, and the Debian package of each (`make system-deps` installs them).
TOOLS = {"podman": "podman", "buildah": "buildah", "runc": "runc", "debootstrap": "debootstrap", "tar": "tar"}
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


class ImageBuildError(SatError, RuntimeError):
    """A step of `make image` failed; the message says which and what to do."""


def _log(message: str) -> None:
    print(f"[make image] {message}", flush=True)


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool, path=SBIN_PATH) is None]


def debian_mirror(sources: list[Path] | None = None) -> str:
    """The Debian archive apt already uses (deb822 `.sources` or one-line `sources.list`), for debootstrap.

    `SAT_DEBIAN_MIRROR` overrides. Security and ports archives are skipped; without any, deb.debian.org.
    """
    override = os.environ.get("SAT_DEBIAN_MIRROR")
    if override:
        return override.rstrip("/")
    if sources is None:
        apt = Path("/etc/apt")
        sources = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list")),
                   *sorted((apt / "sources.list.d").glob("*.sources"))]
    for path in sources:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", stanza, flags=re.MULTILINE))
                suites = fields.get("Suites", "").split()
                if "deb" in fields.get("Types", "").split() and any(s.split("-")[0] == SUITE for s in suites):
                    for uri in fields.get("URIs", "").split():
                        if _is_debian_archive(uri):
                            return uri.rstrip("/")
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2].split("-")[0] == SUITE \
                        and _is_debian_archive(words[1]):
                    return words[1].rstrip("/")
    return DEFAULT_MIRROR


def _is_debian_archive(uri: str) -> bool:
    path = uri.rstrip("/")
    return path.endswith("/debian") and "security" not in path


class _Builder:
    def __init__(self, store: Path) -> None:
        self.store = store
        self.env = {**os.environ, **podman_env(store), "PATH": SBIN_PATH}

    def run(self, argv: list[str], *, step: str, quiet: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run a command; its output streams (build progress) unless quiet. A failure names the step."""
        try:
            result = subprocess.run(argv, env=self.env, text=True, check=False,
                                    capture_output=quiet, **kwargs)
        except FileNotFoundError as exc:
            raise ImageBuildError(f"{step}: {argv[0]} is not installed: run `make system-deps`") from exc
        if result.returncode != 0:
            detail = (result.stderr or "").strip()[-2000:] if quiet else "(its output is above)"
            raise ImageBuildError(f"{step}: `{' '.join(argv[:3])} ...` exited {result.returncode}: {detail}")
        return result

    def image_exists(self, name: str) -> bool:
        return subprocess.run(["podman", "image", "exists", name], env=self.env, check=False).returncode == 0

    def image_id(self, name: str) -> str:
        out = self.run(["podman", "image", "inspect", "--format", "{{.Id}}", name], step="inspect", quiet=True)
        return out.stdout.strip()

    def image_label(self, name: str, label: str) -> str:
        out = self.run(["podman", "image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', name],
                       step="inspect", quiet=True)
        return out.stdout.strip()


def build_base(builder: _Builder, *, mirror: str) -> None:
    """BASE_IMAGE from `debootstrap --variant=minbase` (about 1 min, 270 MB), imported into the store."""
    if os.geteuid() != 0:
        raise ImageBuildError("the Debian base: debootstrap needs root (run `make image` as root)")
    rootfs = builder.store / "build" / f"debian-{SUITE}"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    builder.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE,
                 str(rootfs), mirror], step="debootstrap", stdout=subprocess.DEVNULL)
    # apt's downloads and lists are not the image's (the Dockerfile runs apt-get update itself)
    for leftover in [*(rootfs / "var/cache/apt/archives").glob("*.deb"), *(rootfs / "var/cache/apt").glob("*.bin")]:
        leftover.unlink()
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        builder.run(["podman", "import", "--change", 'CMD ["bash"]', "--change", f"LABEL sat.debian-mirror={mirror}",
                     "-", BASE_IMAGE], step="podman import", quiet=True, stdin=tar.stdout)
    finally:
        tar.stdout.close()
        if tar.wait() != 0:
            raise ImageBuildError(f"the Debian base: tar of {rootfs} failed")
    shutil.rmtree(rootfs)


def uv_binary() -> Path:
    for candidate in (Path(sys.prefix) / "bin" / "uv", PROJECT_ROOT / ".venv" / "bin" / "uv"):
        if candidate.is_file():
            return candidate
    found = shutil.which("uv")
    if found is None:
        raise ImageBuildError("UV_IMAGE: no uv binary (the venv installs it: run `make .venv`)")
    return Path(found)


def build_uv_image(builder: _Builder) -> None:
    """UV_IMAGE: `/uv`, the venv's own uv, in an otherwise empty image (rebuilt when uv changes)."""
    uv = uv_binary()
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    if builder.image_exists(UV_IMAGE) and builder.image_label(UV_IMAGE, "sat.uv-version") == version:
        _log(f"UV_IMAGE {UV_IMAGE}: uv {version}, already there")
        return
    container = builder.run(["buildah", "from", "scratch"], step="buildah from", quiet=True).stdout.strip()
    try:
        builder.run(["buildah", "copy", container, str(uv), "/uv"], step="buildah copy", quiet=True)
        builder.run(["buildah", "config", "--label", f"sat.uv-version={version}", container],
                    step="buildah config", quiet=True)
        builder.run(["buildah", "commit", "-q", container, UV_IMAGE], step="buildah commit", quiet=True)
    finally:
        subprocess.run(["buildah", "rm", container], env=builder.env, capture_output=True, check=False)
    _log(f"UV_IMAGE {UV_IMAGE}: uv {version}")


def bud_command(*, tag: str = TRAINING_IMAGE, wheels: Path | None = WHEELS_DIR, ca_bundle: Path | None = HOST_CA_BUNDLE,
                uv_cache: Path | None = None) -> list[str]:
    """The `buildah bud` of the CPU variant: local stand-ins for the two base images, PyPI for torch's index,
    the wheel folder, CA bundle and uv cache mounted for the build's steps only (build-args, not ENV)."""
    argv = ["buildah", "bud", "--layers", "--force-rm", "--network", "host",
            "-f", str(DOCKERFILE), "--ignorefile", str(DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")),
            "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", f"UV_IMAGE={UV_IMAGE}",
            "--build-arg", "TORCH_INDEX_URL=https://pypi.org/simple"]
    if wheels is not None:
        argv += ["--volume", f"{wheels}:{BUILD_WHEELS}:ro", "--build-arg", f"FIND_LINKS={BUILD_WHEELS}"]
    if ca_bundle is not None:
        argv += ["--volume", f"{ca_bundle}:{BUILD_CA}:ro", "--build-arg", f"BUILD_CA_BUNDLE={BUILD_CA}"]
    if uv_cache is not None:
        argv += ["--volume", f"{uv_cache}:{BUILD_UV_CACHE}", "--build-arg", "UV_NO_CACHE=0"]
    return [*argv, "-t", tag, str(PROJECT_ROOT)]


def host_uv_cache() -> Path | None:
    """The host's uv cache (filled by `make .venv`), shared with the build so that a rebuild downloads nothing."""
    try:
        out = subprocess.run([str(uv_binary()), "cache", "dir"], capture_output=True, text=True, check=True)
    except (ImageBuildError, subprocess.CalledProcessError):
        return None
    path = Path(out.stdout.strip())
    path.mkdir(parents=True, exist_ok=True)
    return path


def build(*, stamp: Path | None, rebuild_base: bool = False) -> dict:
    missing = missing_tools()
    if missing:
        raise ImageBuildError(f"make image needs {', '.join(missing)} (Debian packages: "
                              f"{' '.join(TOOLS[t] for t in missing)}): run `make system-deps`")
    store = containers_dir()
    builder = _Builder(store)
    timings: dict[str, float] = {}
    started = time.monotonic()

    t0 = time.monotonic()
    if rebuild_base or not builder.image_exists(BASE_IMAGE):
        mirror = debian_mirror()
        _log(f"1/3 BASE_IMAGE {BASE_IMAGE}: debootstrap --variant=minbase {SUITE} from {mirror} (about 1-2 min)")
        build_base(builder, mirror=mirror)
    else:
        _log(f"1/3 BASE_IMAGE {BASE_IMAGE}: already there (--rebuild-base to bootstrap it again)")
    timings["base_s"] = round(time.monotonic() - t0, 1)
    _log(f"1/3 done in {timings['base_s']} s")

    t0 = time.monotonic()
    _log(f"2/3 UV_IMAGE {UV_IMAGE}")
    build_uv_image(builder)
    timings["uv_s"] = round(time.monotonic() - t0, 1)

    t0 = time.monotonic()
    wheels = WHEELS_DIR if WHEELS_DIR.is_dir() else None
    ca_bundle = HOST_CA_BUNDLE if HOST_CA_BUNDLE.is_file() else None
    argv = bud_command(wheels=wheels, ca_bundle=ca_bundle, uv_cache=host_uv_cache())
    _log(f"3/3 {TRAINING_IMAGE}: buildah bud {DOCKERFILE.relative_to(PROJECT_ROOT)} "
         f"(a few minutes cold; cached layers after)")
    builder.run(argv, step="buildah bud")
    timings["training_s"] = round(time.monotonic() - t0, 1)
    _log(f"3/3 done in {timings['training_s']} s")

    image_id = builder.image_id(TRAINING_IMAGE)
    size = builder.run(["podman", "image", "inspect", "--format", "{{.Size}}", TRAINING_IMAGE],
                       step="inspect", quiet=True).stdout.strip()
    record = {"image": TRAINING_IMAGE, "id": image_id, "size_bytes": int(size or 0), "base": BASE_IMAGE,
              "uv_image": UV_IMAGE, "store": str(store), **timings,
              "total_s": round(time.monotonic() - started, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if stamp is not None:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    _log(f"{TRAINING_IMAGE} ({image_id[:12]}, {int(size or 0) / 1e9:.2f} GB) in {record['total_s']} s")
    return record


def stamp_holds(stamp: Path) -> bool:
    """Whether the image a stamp records is still the one in the store (a stamp without its image is stale)."""
    try:
        recorded = json.loads(stamp.read_text(encoding="utf-8")).get("id")
    except (OSError, ValueError, AttributeError):
        return False
    env = {**os.environ, **podman_env(), "PATH": SBIN_PATH}
    try:
        out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", TRAINING_IMAGE], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == recorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sat_tasks.backends.local.image_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stamp", type=Path, default=None, help="write this stamp file once the image is built")
    parser.add_argument("--rebuild-base", action="store_true", help="debootstrap the Debian base again")
    parser.add_argument("--drop-stale-stamp", action="store_true",
                        help="only remove the --stamp file if its image is no longer in the store (then make rebuilds)")
    args = parser.parse_args(argv)
    if args.drop_stale_stamp:
        if args.stamp is not None and args.stamp.exists() and not stamp_holds(args.stamp):
            _log(f"{args.stamp}: {TRAINING_IMAGE} is no longer in the store as built; building it again")
            args.stamp.unlink()
        return 0
    try:
        build(stamp=args.stamp, rebuild_base=args.rebuild_base)
    except ImageBuildError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
