"""The embedded Object Storage: moto's S3 server on 127.0.0.1, and the demo bucket's contents."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sat_tasks.config import include_dir
from sat_tasks.errors import SatError

LOCAL_ACCESS_KEY = "sat-local"
LOCAL_SECRET_KEY = "sat-local-secret"  # a throwaway key for a loopback-only test server
LOCAL_REGION = "us-east-1"
DEMO_BUCKET = "sat-demo"


class EmbeddedStorageError(SatError):
    """The embedded Object Storage server did not start; the message says where it tried."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalS3Server:
    """moto's S3 server on 127.0.0.1: in a thread, or (`process=True`) in its own process.

    A separate process keeps the server off the client's GIL (benchmarks, long demos).
    Call order: `start()` -> `connection_env()` (export it) -> ... -> `stop()`.
    """

    port: int = 0
    process: bool = False
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

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request is noise
        self.port = self.port or free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def _start_process(self) -> LocalS3Server:
        import subprocess
        import sys
        import time
        import urllib.request

        self.port = self.port or free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self._server = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1)
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise EmbeddedStorageError(f"moto_server did not start on {self.endpoint_url} within 30 s; "
                                   "is the port taken, or moto[server] missing from the environment?")

    def stop(self) -> None:
        """Stop the server; its buckets are gone."""
        if self._server is None:
            return
        if self.process:
            self._server.terminate()
            self._server.wait(timeout=10)
        else:
            self._server.stop()
        self._server = None

    def __enter__(self) -> LocalS3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connection(self) -> dict[str, Any]:
        """The Airflow connection (JSON form) for this server."""
        return object_storage_connection(self.endpoint_url)

    def connection_env(self, conn_id: str = "sat_object_storage") -> dict[str, str]:
        """Environment variables that define the Airflow connection for this server."""
        return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(self.connection())}


def object_storage_connection(endpoint_url: str) -> dict[str, Any]:
    """An `aws` Airflow connection pointing at an S3-compatible endpoint."""
    return {
        "conn_type": "aws",
        "login": LOCAL_ACCESS_KEY,
        "password": LOCAL_SECRET_KEY,
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
