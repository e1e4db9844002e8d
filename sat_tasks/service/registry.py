"""The deployment's embedded container registry: Debian's `docker-registry` on loopback, TLS and a login (ADR 0042).

Call order: `EmbeddedRegistry(folder, password, ...)` -> `prepare()` (the CA, a server certificate, the
htpasswd file, the config; the port kept for the deployment) -> the stack starts `command()` as a
supervised component -> `wait_ready()` -> `push(image)` for the images the deployment serves. The stack
stops it with its components (SIGTERM to its process group).

- **Where**: `127.0.0.1:<port>`; the port is `[sat] embedded_registry_port`, else a free one chosen on the
  first start and kept (`<folder>/port`) so that image references stay valid across restarts.
- **TLS**: a server certificate for `127.0.0.1` and `localhost`, signed by the deployment's own CA
  (`service.tls`, `<folder>/ca`). podman trusts that CA through the project's containers configuration
  only: `<containers_dir>/certs.d/127.0.0.1:<port>/ca.crt` (a per-registry cert folder, given to podman as
  `--cert-dir`); the machine's trust store and `/etc/containers` are never touched.
- **The login**: user `sat`, its password generated per deployment and kept with the other secrets
  (`service.secrets`, `registry_password`); the registry gets only its bcrypt hash (`htpasswd -B`, the
  password on its stdin, never on a command line). The stack gives the Airflow components the login as
  the connection `sat_embedded_registry` (`connection_env`), shared with every job
  (`[sat] shared_registry_connections`), and the CA as `[sat] registry_ca_file`: the image check and
  the container runtime's pull use the same login and trust.
- **The images**: `push(image)` copies an image of the project's store (SAT's training image, which
  `make image` builds) to `127.0.0.1:<port>/<its repository>:<tag>`, unless the registry already has that
  image id there (`<folder>/pushed.json`).

No password is printed, logged, or put in an error: podman's words are redacted before they are shown.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.errors import SatError
from sat_tasks.service import tls
from sat_tasks.service.secrets import private_dir

BINARY = "docker-registry"
HTPASSWD = "htpasswd"
USER = "sat"
CONN_ID = "sat_embedded_registry"
HOST = "127.0.0.1"
REALM = "sat-embedded-registry"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
                  "application/vnd.docker.distribution.manifest.v2+json, "
                  "application/vnd.docker.distribution.manifest.list.v2+json")
INSTALL_HINT = "`make system-deps` installs docker-registry and apache2-utils (htpasswd)"


class RegistryError(SatError):
    """The embedded registry could not be prepared, did not start, or a push failed; the message holds no secret."""


def installed() -> bool:
    """Whether this host has what the embedded registry needs (docker-registry and htpasswd)."""
    return shutil.which(BINARY) is not None and shutil.which(HTPASSWD) is not None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def htpasswd_line(user: str, password: str) -> str:
    """One bcrypt htpasswd line (the only hash docker-registry accepts), the password passed on stdin."""
    try:
        made = subprocess.run([HTPASSWD, "-niB", user], input=password + "\n", capture_output=True, text=True,
                              timeout=60, check=False)
    except FileNotFoundError:
        raise RegistryError(f"{HTPASSWD} is not installed: {INSTALL_HINT}") from None
    line = made.stdout.strip()
    if made.returncode != 0 or not line.startswith(f"{user}:$2"):
        raise RegistryError(f"{HTPASSWD} could not hash the registry login (exit {made.returncode})")
    return line + "\n"


def config_text(folder: Path, port: int, http_secret: str) -> str:
    """The embedded registry's configuration: filesystem storage under `folder`, TLS, htpasswd, loopback only."""
    return registry_config(folder / "storage", port, http_secret,
                           tls=(folder / "tls" / "registry.crt", folder / "tls" / "registry.key"),
                           htpasswd=folder / "htpasswd")


def registry_config(storage: Path, port: int, http_secret: str, *, tls: tuple[Path, Path] | None,
                    htpasswd: Path | None, realm: str = REALM, purge_uploads: bool = True) -> str:
    """docker-registry's configuration on 127.0.0.1:`port`: filesystem storage in `storage`, deletes allowed.

    `tls`: (certificate, key) to serve HTTPS, None for plain HTTP; `htpasswd`: the file of logins, None for
    no auth; `purge_uploads` False turns off the purge of unfinished uploads (a test registry).
    """
    def quoted(path: Path) -> str:
        return json.dumps(str(path))

    lines = ["version: 0.1", "log:", "  level: info", "  formatter: text",
             "storage:", "  filesystem:", f"    rootdirectory: {quoted(storage)}", "  delete:", "    enabled: true"]
    if not purge_uploads:
        lines += ["  maintenance:", "    uploadpurging:", "      enabled: false"]
    lines += ["http:", f"  addr: {HOST}:{port}", f"  secret: {json.dumps(http_secret)}"]
    if tls is not None:
        lines += ["  tls:", f"    certificate: {quoted(tls[0])}", f"    key: {quoted(tls[1])}"]
    if htpasswd is not None:
        lines += ["auth:", "  htpasswd:", f"    realm: {realm}", f"    path: {quoted(htpasswd)}"]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


@dataclass
class EmbeddedRegistry:
    """One deployment's registry.

    Args:
        folder: its files (0700): `ca/`, `tls/`, `htpasswd`, `config.yml`, `storage/`, `port`, `pushed.json`.
        password: the login's password (the deployment's `registry_password`); never shown.
        port: the port to bind (0: the one kept in `<folder>/port` if it is free, else a free one).
        certs_dir: the project's podman per-registry cert folders (`<containers_dir>/certs.d`).
        log: where progress lines go (never a secret).
    """

    folder: Path
    password: str = field(repr=False)
    port: int = 0
    certs_dir: Path | None = None
    log: Callable[[str], None] = print
    ca: tls.KeyPair | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        """`127.0.0.1:<port>`: the registry part of an image reference it serves."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"https://{self.address}"

    @property
    def config_path(self) -> Path:
        return self.folder / "config.yml"

    @property
    def trust_dir(self) -> Path:
        """The folder podman gets as `--cert-dir` for this registry: only the deployment's CA, as `ca.crt`."""
        base = self.certs_dir if self.certs_dir is not None else self.folder / "certs.d"
        return base / self.address

    @property
    def ca_file(self) -> Path:
        return self.trust_dir / "ca.crt"

    # ---- files ------------------------------------------------------------------------------------------
    def prepare(self) -> EmbeddedRegistry:
        """Write everything the registry reads, and the CA where podman finds it; choose the port."""
        if not installed():
            raise RegistryError(f"the embedded registry needs {BINARY} and {HTPASSWD}: {INSTALL_HINT}")
        private_dir(self.folder)
        self.port = self._choose_port()
        self.ca = tls.ensure_ca(self.folder / "ca", name="SAT embedded registry CA")
        tls.server_certificate(self.folder / "tls", self.ca, [HOST, "localhost"], name="registry")
        _write_private(self.folder / "htpasswd", htpasswd_line(USER, self.password))
        _write_private(self.config_path, config_text(self.folder, self.port, secrets.token_hex(32)))
        (self.folder / "storage").mkdir(exist_ok=True)
        self.trust_dir.mkdir(parents=True, exist_ok=True)
        data = self.ca.certificate.read_bytes()
        if not self.ca_file.exists() or self.ca_file.read_bytes() != data:
            self.ca_file.write_bytes(data)
        return self

    def _choose_port(self) -> int:
        kept_file = self.folder / "port"
        if self.port:
            chosen = self.port
        else:
            kept = kept_file.read_text().strip() if kept_file.exists() else ""
            if kept.isdigit() and _port_free(int(kept)):
                chosen = int(kept)
            else:
                chosen = _free_port()
                if kept.isdigit():
                    self.log(f"[sat] the embedded registry's port {kept} is taken: it moves to {chosen} (images "
                             f"named {HOST}:{kept}/... must be named {HOST}:{chosen}/...; set [sat] "
                             "embedded_registry_port to keep one)")
        kept_file.write_text(f"{chosen}\n")
        return chosen

    def command(self) -> list[str]:
        return [shutil.which(BINARY) or BINARY, "serve", str(self.config_path)]

    @staticmethod
    def process_env(base: dict[str, str]) -> dict[str, str]:
        """The registry process's environment: `base` without the REGISTRY_* overrides docker-registry reads."""
        return {k: v for k, v in base.items() if not k.startswith("REGISTRY_")}

    # ---- the client side ----------------------------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _request(self, path: str, *, login: bool = True, method: str = "GET") -> int:
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        if login:
            token = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        request.add_header("Accept", MANIFEST_TYPES)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.ssl_context()) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def wait_ready(self, timeout: float, alive: Callable[[], None] = lambda: None) -> float:
        """Until the registry answers over TLS that the CA verifies, and takes the login; seconds it took.

        `alive` raises when the process is gone (the stack's check). A registry that answers but refuses
        the login, or a certificate that does not verify, is an error at once.
        """
        started = time.monotonic()
        last = "no answer"
        while time.monotonic() - started < timeout:
            alive()
            try:
                status = self._request("/v2/")
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLCertVerificationError):
                    raise RegistryError(f"the embedded registry's certificate does not verify: {reason}") from None
                last = str(reason)
                time.sleep(0.2)
                continue
            if status == 200:
                return time.monotonic() - started
            raise RegistryError(f"the embedded registry answered {status} to its own login; see its log")
        raise RegistryError(f"the embedded registry did not answer on {self.url} within {timeout:.0f}s ({last})")

    def has(self, repository: str, tag: str) -> bool:
        """Whether the registry serves `repository:tag` (a manifest HEAD with the login)."""
        return self._request(f"/v2/{repository}/manifests/{tag}", method="HEAD") == 200

    def connection(self) -> dict[str, str]:
        """The Airflow connection of the login (holds the password: never printed)."""
        return {"conn_type": "generic", "host": self.address, "login": USER, "password": self.password,
                "description": "SAT's embedded registry (sat up): pull login"}

    def connection_env(self, shared: str = "", ca_file: str = "") -> dict[str, str]:
        """What the Airflow components get: the login as the connection `CONN_ID`, listed in
        `[sat] shared_registry_connections` (besides `shared`, the ones the operator listed), and the CA as
        `[sat] registry_ca_file` (with the operator's `ca_file`, when one is set, in one bundle)."""
        listed = [c.strip() for c in shared.split(",") if c.strip()]
        if CONN_ID not in listed:
            listed.append(CONN_ID)
        trusted = self.ca_file
        if ca_file:
            operator = Path(ca_file).expanduser()
            if operator.is_file() and operator.resolve() != self.ca_file.resolve():
                trusted = self.folder / "trusted-cas.crt"
                trusted.write_bytes(operator.read_bytes().rstrip(b"\n") + b"\n" + self.ca_file.read_bytes())
        return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(self.connection()),
                "AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS": ",".join(listed),
                "AIRFLOW__SAT__REGISTRY_CA_FILE": str(trusted)}

    def served_name(self, image: str) -> str:
        """`image` as this registry serves it: its repository and tag under `127.0.0.1:<port>`."""
        repository, tag = _repository_and_tag(image)
        return f"{self.address}/{repository}:{tag}"

    def push(self, image: str, podman: Callable[..., subprocess.CompletedProcess] | None = None) -> str | None:
        """Push `image` from the project's store to this registry (`served_name`); the name it is served as.

        None when the store has no such image (nothing to serve yet: `make image` builds it). Skipped when
        the registry already serves the same image id. RegistryError with podman's words (redacted) when
        the push fails.
        """
        if podman is None:
            from sat_tasks.backends.local.containers import podman
        found = podman(["image", "inspect", "--format", "{{.Id}}", image], check=False, timeout=60)
        image_id = found.stdout.strip() if found.returncode == 0 else ""
        if not image_id:
            return None
        target = self.served_name(image)
        repository, tag = _repository_and_tag(image)
        stamp_file = self.folder / "pushed.json"
        pushed = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
        if pushed.get(target) == image_id and self.has(repository, tag):
            return target
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="sat-registry-") as scratch:
            authfile = Path(scratch) / "auth.json"
            token = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
            _write_private(authfile, json.dumps({"auths": {self.address: {"auth": token}}}))
            done = podman(["push", "--quiet", "--authfile", str(authfile), "--cert-dir", str(self.trust_dir),
                           image, f"docker://{target}"], check=False, timeout=3600)
        if done.returncode != 0:
            words = [line.strip() for line in (done.stderr or done.stdout or "").splitlines() if line.strip()]
            said = (words[-1] if words else "no output")[:500].replace(self.password, "***")
            raise RegistryError(f"pushing {image} to the embedded registry as {target} failed: {said}")
        pushed[target] = image_id
        stamp_file.write_text(json.dumps(pushed, indent=1))
        self.log(f"[sat] the embedded registry serves {image} as {target} (pushed in "
                 f"{time.monotonic() - started:.0f} s)")
        return target


def _repository_and_tag(image: str) -> tuple[str, str]:
    """`registry/repo/name:tag` -> (`repo/name`, `tag`); a digest or no tag is refused (a name is pushed)."""
    if "@" in image:
        raise RegistryError(f"{image}: the embedded registry serves tagged images, not digests")
    first, _, rest = image.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        rest = image  # no registry part
    repository, _, tag = rest.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = rest, "latest"
    return repository, tag


def running(home: Path, certs_dir: Path | None = None) -> EmbeddedRegistry | None:
    """The registry the running `sat up` of `home` serves (its kept port, login and CA); None when none answers."""
    from sat_tasks.service.secrets import SECRETS_FILE

    folder, secrets_file = home / "registry", home / SECRETS_FILE
    kept = (folder / "port").read_text().strip() if (folder / "port").exists() else ""
    if not kept.isdigit() or not secrets_file.exists():
        return None
    password = json.loads(secrets_file.read_text(encoding="utf-8")).get("registry_password", "")
    if certs_dir is None:
        from sat_tasks.backends.local.containers import containers_dir

        certs_dir = containers_dir() / "certs.d"
    found = EmbeddedRegistry(folder=folder, password=password, port=int(kept), certs_dir=certs_dir)
    if not password or not found.ca_file.exists():
        return None
    try:
        found.wait_ready(5)
    except RegistryError:
        return None
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m sat_tasks.service.registry push [IMAGE ...]`: what `make image` runs after a build.

    Pushes SAT's training image (or the images named) to the embedded registry of the deployment that runs
    now (`$AIRFLOW_HOME`, else `<project>/.airflow`); without one, says so: the next `sat up` pushes it.
    """
    import argparse

    from sat_tasks.config import PROJECT_ROOT

    parser = argparse.ArgumentParser(prog="python -m sat_tasks.service.registry")
    parser.add_argument("action", choices=("push",))
    parser.add_argument("images", nargs="*")
    args = parser.parse_args(argv)
    if not args.images:
        from sat_tasks.backends.local.image_build import TRAINING_IMAGE

        args.images = [TRAINING_IMAGE]
    home = Path(os.environ.get("AIRFLOW_HOME") or PROJECT_ROOT / ".airflow")
    found = running(home)
    if found is None:
        print(f"[sat] no embedded registry runs for {home}: the next `sat up` pushes {', '.join(args.images)}")
        return 0
    found.log = lambda line: print(line, flush=True)
    for image in args.images:
        try:
            served = found.push(image)
        except RegistryError as exc:
            print(f"[sat] {exc}")
            return 1
        if served is None:
            print(f"[sat] {image} is not in the project's image store")
            return 1
        print(f"[sat] the embedded registry on {found.address} serves {image} as {served}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
