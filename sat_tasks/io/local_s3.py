"""The embedded Object Storage: moto's S3 and STS server on 127.0.0.1 behind SAT's access check, and the demo bucket."""

from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sat_tasks.config import include_dir
from sat_tasks.errors import SatError

LOCAL_ACCESS_KEY = "sat-local"  # the service key's id: no secret; its secret is generated (`generate_secret`)
LOCAL_REGION = "us-east-1"
DEMO_BUCKET = "sat-demo"


class EmbeddedStorageError(SatError):
    """The embedded Object Storage server did not start; the message says where it tried."""


def generate_secret() -> str:
    """A new service secret (240 random bits, URL-safe; never logged): one per server or deployment (ADR 0037)."""
    return secrets.token_urlsafe(30)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalS3Server:
    """moto's S3 server on 127.0.0.1: in a thread, or (`process=True`) in its own process.

    A separate process keeps the server off the client's GIL (benchmarks, long demos). Either
    way every request passes `io.s3_gate.PolicyGate` first: it must be signed (SigV4) with a
    secret the gate knows; the service key (`access_key`, `secret_key`: generated for this
    server unless the deployment hands its kept one) may do everything, temporary credentials
    from its STS `AssumeRole` only what their session policy allows, anything else nothing
    (ADRs 0020, 0037). `connection()` carries the secret: never print it.
    Call order: `start()` -> `connection_env()` (export it) -> ... -> `stop()`.
    """

    port: int = 0
    process: bool = False
    access_key: str = LOCAL_ACCESS_KEY
    secret_key: str = field(default_factory=generate_secret, repr=False)
    _server: Any = field(default=None, repr=False)

    @property
    def endpoint_url(self) -> str:
        """The HTTP endpoint of the server."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalS3Server:
        """Start the server on a free port (or the given one)."""
        if self.process:
            return self._start_process()
        import logging
        import threading

        from moto.moto_server.werkzeug_app import MotoRequestHandler
        from werkzeug.serving import make_server

        from sat_tasks.io.s3_gate import gated_moto_app

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise
        self.port = self.port or free_port()
        self._server = make_server("127.0.0.1", self.port, gated_moto_app(self.service_keys()), threaded=True,
                                   request_handler=MotoRequestHandler)
        threading.Thread(target=self._server.serve_forever, name="sat-object-storage", daemon=True).start()
        return self

    def _start_process(self) -> LocalS3Server:
        import subprocess
        import sys
        import time
        import urllib.error
        import urllib.request

        self.port = self.port or free_port()
        self._server = subprocess.Popen(
            [sys.executable, "-m", "sat_tasks.io.s3_gate", "--host", "127.0.0.1", "--port", str(self.port)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        with self._server.stdin as keys:  # the secret goes on a pipe, never on the command line
            keys.write((json.dumps(self.service_keys()) + "\n").encode())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.endpoint_url + "/", timeout=1)
                return self
            except urllib.error.HTTPError:  # the gate refuses an anonymous request: the server is up
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise EmbeddedStorageError(f"the embedded Object Storage did not start on {self.endpoint_url} within 30 s; "
                                   "is the port taken, or moto[server] missing from the environment?")

    def service_keys(self) -> dict[str, str]:
        """The gate's service keys: {key id: secret}."""
        return {self.access_key: self.secret_key}

    def stop(self) -> None:
        """Stop the server; its buckets are gone."""
        if self._server is None:
            return
        if self.process:
            self._server.terminate()
            self._server.wait(timeout=10)
        else:
            self._server.shutdown()
            self._server.server_close()
        self._server = None

    def __enter__(self) -> LocalS3Server:  # noqa: PYI034 - start() returns the server it started
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection(self) -> dict[str, Any]:
        """The Airflow connection (JSON form) for this server: the service key, secret included."""
        return object_storage_connection(self.endpoint_url, self.access_key, self.secret_key)

    def connection_env(self, conn_id: str = "sat_object_storage") -> dict[str, str]:
        """Environment variables that define the Airflow connection for this server."""
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(self.connection())}


def object_storage_connection(endpoint_url: str, access_key: str, secret_key: str) -> dict[str, Any]:
    """An `aws` Airflow connection pointing at an S3-compatible endpoint with these keys."""
    return {
        "conn_type": "aws",
        "login": access_key,
        "password": secret_key,
        "extra": {"endpoint_url": endpoint_url, "region_name": LOCAL_REGION},
    }


def seed_demo_bucket(hook: Any, bucket: str = DEMO_BUCKET) -> list[str]:
    """Create the demo bucket and upload the shipped corpus and example scripts to it.

    Layout: `s3://<bucket>/datasets/tiny-corpus/...` and `s3://<bucket>/scripts/...`.
    """
    if not hook.check_for_bucket(bucket):
        hook.create_bucket(bucket_name=bucket, region_name=LOCAL_REGION)
    uploaded = []
    root = include_dir()
    for local_dir, prefix in ((root / "corpus", "datasets/tiny-corpus/"), (root / "scripts", "scripts/")):
        for path in sorted(local_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                key = prefix + path.relative_to(local_dir).as_posix()
                hook.load_file(filename=path, key=key, bucket_name=bucket, replace=True)
                uploaded.append(f"s3://{bucket}/{key}")
    return uploaded


@dataclass
class PersistentS3Server(LocalS3Server):
    """The embedded Object Storage for `make up`: moto's server, with its objects kept in a directory.

    moto's server keeps everything in memory, so on its own a `make down` loses every
    result. This one restores the objects of `state_dir` when it starts, copies what
    changed back every `sync_seconds` (in a thread, by listing ETags), and once more when
    it stops: a `make down` / `make up` keeps every object, and a crash loses at most the
    last `sync_seconds`. Layout: `<state_dir>/<bucket>/<key, percent-encoded>` (dots too:
    `state_file_name`), so any key maps to one file, none of them `.`, `..` or a temp
    `<file>.part`. `state_dir` is made private to its user (0700): it holds every result.
    One object that cannot be copied is reported and the round goes on with the others.

    Call order: `start()` -> ... -> `stop()` (final sync).
    """

    state_dir: Path = field(default_factory=lambda: Path(".sat/object-storage"))
    sync_seconds: float = 5.0
    process: bool = True
    _stop_sync: Any = field(default=None, repr=False)
    _thread: Any = field(default=None, repr=False)
    _etags: dict = field(default_factory=dict, repr=False)

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=LOCAL_REGION,
                            config=Config(retries={"max_attempts": 3}))

    def start(self) -> PersistentS3Server:
        import threading

        super().start()
        restored = self.restore()
        self._stop_sync = threading.Event()
        self._thread = threading.Thread(target=self._sync_loop, name="sat-storage-sync", daemon=True)
        self._thread.start()
        if restored:
            print(f"[sat] Object Storage: restored {restored} objects from {self.state_dir}", flush=True)
        return self

    def stop(self) -> None:
        if self._stop_sync is not None:
            self._stop_sync.set()
            self._thread.join(timeout=60)
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - say it; stopping must go on
                print(f"[sat] Object Storage: the last copy to {self.state_dir} failed: {exc}", flush=True)
            self._stop_sync = None
        super().stop()

    def restore(self) -> int:
        """Create the buckets and put the objects kept in `state_dir`; returns how many."""
        from urllib.parse import unquote

        if not self.state_dir.is_dir():
            return 0
        self.state_dir.chmod(0o700)
        client, count = self.client(), 0
        for bucket_dir in sorted(p for p in self.state_dir.iterdir() if p.is_dir()):
            client.create_bucket(Bucket=bucket_dir.name)
            for path in sorted(p for p in bucket_dir.iterdir() if p.is_file() and not p.name.endswith(".part")):
                key = unquote(path.name)
                if path.name != state_file_name(key):  # written before dots were encoded: move it to its name
                    path = path.replace(path.with_name(state_file_name(key)))
                with open(path, "rb") as handle:
                    etag = client.put_object(Bucket=bucket_dir.name, Key=key, Body=handle)["ETag"]
                self._etags[(bucket_dir.name, key)] = etag
                count += 1
        return count

    def sync(self) -> int:
        """Copy new and changed objects to `state_dir` and drop deleted ones; returns how many changed."""
        import os

        client, seen, changed = self.client(), set(), 0
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.state_dir.chmod(0o700)
        for bucket in client.list_buckets().get("Buckets", []):
            name = bucket["Name"]
            folder = self.state_dir / name
            folder.mkdir(parents=True, exist_ok=True)
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
                for obj in page.get("Contents", []):
                    key, etag = obj["Key"], obj["ETag"]
                    seen.add((name, key))
                    target = folder / state_file_name(key)
                    if self._etags.get((name, key)) == etag and target.exists():
                        continue
                    part = target.with_name(target.name + ".part")
                    try:
                        client.download_file(name, key, str(part))
                        os.replace(part, target)
                    except Exception as exc:  # noqa: BLE001 - this object only: the round copies the others
                        part.unlink(missing_ok=True)
                        print(f"[sat] Object Storage: could not keep s3://{name}/{key} in {folder}: {exc}",
                              flush=True)
                        continue
                    self._etags[(name, key)] = etag
                    changed += 1
        for name, key in set(self._etags) - seen:
            (self.state_dir / name / state_file_name(key)).unlink(missing_ok=True)
            del self._etags[(name, key)]
            changed += 1
        return changed

    def _sync_loop(self) -> None:
        while not self._stop_sync.wait(self.sync_seconds):
            try:
                self.sync()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                print(f"[sat] Object Storage: copying to {self.state_dir} failed, trying again: {exc}", flush=True)


def state_file_name(key: str) -> str:
    """The file name that keeps object `key`: percent-encoded, `/` and `.` included.

    No key becomes `.`, `..` or a name ending in `.part` (the temp files of a copy).
    """
    from urllib.parse import quote

    return quote(key, safe="").replace(".", "%2E")
