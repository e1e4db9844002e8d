"""A real container registry (Debian's docker-registry) on 127.0.0.1 for tests.

Call order: ``start_registry(tmp_path)`` (skips the test when the binary is missing),
``push_test_image(server, ...)`` as often as needed, then ``server.stop()`` or leave the
``with`` block. The registry writes its log to ``tmp_path / "registry.log"``.

Install the server with ``apt-get install -y docker-registry apache2-utils``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

import pytest
import requests

from sat_tasks.io.local_s3 import (
    free_port,  # one helper for a free loopback port (re-exported for the tests)
)
from sat_tasks.service.registry import htpasswd_line, registry_config  # the service's own config and login hash

REGISTRY_BINARY = "docker-registry"
INSTALL_HINT = "apt-get install -y docker-registry apache2-utils"

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


class RegistryStartError(RuntimeError):
    """The registry process exited or never answered on its port."""


@dataclass
class RegistryServer:
    """A running ``docker-registry serve`` process; a context manager that stops it.

    Attributes:
        host: ``127.0.0.1:<port>``, the registry part of an image reference.
        url: ``http://127.0.0.1:<port>`` (TLS is off).
        users: the htpasswd users, name to password.
        log_path: the registry's stdout and stderr.
    """

    host: str
    url: str
    users: Mapping[str, str]
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def __enter__(self) -> RegistryServer:  # noqa: PYI034
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def registry_binary() -> str | None:
    return shutil.which(REGISTRY_BINARY)


def start_registry(
    tmp_path: Path, users: Mapping[str, str] | None = None, *, startup_timeout: float = 15,
    tls: tuple[Path, Path] | None = None,
) -> RegistryServer:
    """Start a registry with filesystem storage under ``tmp_path`` and htpasswd auth.

    ``users`` defaults to ``{"user": "pass"}``; an empty mapping turns auth off. ``tls``
    (certificate, key) serves HTTPS with that certificate (``sat_tasks.service.tls`` makes one).
    Skips the calling test when ``docker-registry`` is not installed.
    """
    binary = registry_binary()
    if binary is None:
        pytest.skip(f"{REGISTRY_BINARY} not installed (install with: {INSTALL_HINT})")
    users = {"user": "pass"} if users is None else dict(users)
    if users and shutil.which("htpasswd") is None:
        pytest.skip(f"htpasswd not installed (install with: {INSTALL_HINT})")
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    htpasswd_path = tmp_path / "htpasswd"
    if users:
        htpasswd_path.write_text("".join(htpasswd_line(u, p) for u, p in users.items()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
    last_error: Exception | None = None
    for _ in range(3):  # a free port can be taken between probe and bind: try again
        port = free_port()
        config_path = tmp_path / "registry.yml"
        config_path.write_text(registry_config(tmp_path / "storage", port, secrets.token_hex(16), tls=tls,
                                                htpasswd=htpasswd_path if users else None,
                                                realm="sat-test-registry", purge_uploads=False))
        log_path = tmp_path / "registry.log"
        log_file = log_path.open("ab")
        process = subprocess.Popen(
            [binary, "serve", str(config_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log_file.close()
        server = RegistryServer(
            host=f"127.0.0.1:{port}",
            url=f"{'https' if tls else 'http'}://127.0.0.1:{port}",
            users=users,
            log_path=log_path,
            process=process,
        )
        try:
            _wait_ready(server, startup_timeout)
            return server
        except RegistryStartError as exc:
            server.stop()
            last_error = exc
    raise RegistryStartError(
        f"registry did not start: {last_error}; see {tmp_path / 'registry.log'}"
    )


def push_test_image(
    server: RegistryServer,
    repo: str,
    tag: str,
    username: str | None = "user",
    password: str | None = "pass",
    *,
    index: bool = False,
) -> str:
    """Push a one-layer OCI image to ``repo:tag`` through the HTTP API; return its digest.

    With ``index=True`` the image manifest is pushed by digest and ``tag`` names an OCI
    image index that lists it; the index digest is returned.
    """
    session = requests.Session()
    if username is not None:
        session.auth = (username, password or "")
    try:
        layer = _layer_tar_gz(f"hello from {repo}:{tag}\n".encode())
        diff_id = "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
        config = _canonical_json(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Cmd": ["/bin/true"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            }
        )
        config_digest = _upload_blob(session, server, repo, config)
        layer_digest = _upload_blob(session, server, repo, layer)
        manifest = _canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": OCI_LAYER, "digest": layer_digest, "size": len(layer)}],
            }
        )
        manifest_digest = _sha256(manifest)
        if not index:
            return _put_manifest(session, server, repo, tag, manifest, OCI_MANIFEST)
        _put_manifest(session, server, repo, manifest_digest, manifest, OCI_MANIFEST)
        index_body = _canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [
                    {
                        "mediaType": OCI_MANIFEST,
                        "digest": manifest_digest,
                        "size": len(manifest),
                        "platform": {"architecture": "amd64", "os": "linux"},
                    }
                ],
            }
        )
        return _put_manifest(session, server, repo, tag, index_body, OCI_INDEX)
    finally:
        session.close()


def _upload_blob(session: requests.Session, server: RegistryServer, repo: str, data: bytes) -> str:
    digest = _sha256(data)
    start = session.post(f"{server.url}/v2/{repo}/blobs/uploads/", timeout=10)
    if start.status_code != 202:
        raise RuntimeError(f"blob upload start: {start.status_code} {start.text[:200]}")
    location = urljoin(f"{server.url}/", start.headers["Location"])
    separator = "&" if "?" in location else "?"
    done = session.put(
        f"{location}{separator}digest={digest}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        timeout=10,
    )
    if done.status_code != 201:
        raise RuntimeError(f"blob upload: {done.status_code} {done.text[:200]}")
    return digest


def _put_manifest(
    session: requests.Session,
    server: RegistryServer,
    repo: str,
    reference: str,
    body: bytes,
    media_type: str,
) -> str:
    response = session.put(
        f"{server.url}/v2/{repo}/manifests/{reference}",
        data=body,
        headers={"Content-Type": media_type},
        timeout=10,
    )
    if response.status_code != 201:
        raise RuntimeError(f"manifest put: {response.status_code} {response.text[:200]}")
    digest = response.headers.get("Docker-Content-Digest") or _sha256(body)
    assert digest == _sha256(body), (digest, _sha256(body))
    return digest


def _layer_tar_gz(content: bytes) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(content)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(content))
    return gzip.compress(raw.getvalue(), mtime=0)


def _canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _wait_ready(server: RegistryServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RegistryStartError(f"process exited with {server.process.returncode}")
        try:
            # readiness only (the tests check the certificate themselves): TLS is not verified here
            response = requests.get(f"{server.url}/v2/", timeout=1, verify=False)
            if response.status_code in (200, 401):
                return
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise RegistryStartError(f"no answer on {server.url} within {timeout:g}s")
