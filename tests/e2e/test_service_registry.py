"""`sat up`'s embedded registry (ADR 0042): started with the service, serving an image of the project's store
over TLS with the generated login, which the image check and the container runtime's pull use.

A `ServiceStack` as `sat up` makes it with the registry on (SQLite: the metadata DB is not what is tested
here), serving a one-file image imported into the project's store for the test (the training image is
pushed the same way, 1.8 GB). Then, with the deployment's own connection and CA:
- the image check finds the image; without the login it is refused, without the CA it is untrusted;
- the container runtime pulls it with the project's podman configuration; without the login the pull is
  refused with the registry's words;
- the password is in no log line: the service's, the registry's, the pull's;
- a killed registry is restarted by the supervision, and a stop stops it;
- `make image`'s push finds the running registry (and none once it stopped).
Needs docker-registry, htpasswd and podman (`make system-deps`). About 1 min here.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import tarfile
import time

import pytest

from sat_tasks.backends.local.containers import podman, podman_installed
from sat_tasks.io.local_s3 import free_port
from sat_tasks.service import registry as embedded
from sat_tasks.service.secrets import SECRETS_FILE
from sat_tasks.service.stack import REGISTRY, ServiceStack

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not (podman_installed() and embedded.installed()),
                                 reason="podman, docker-registry or htpasswd not installed: `make system-deps`")]


def _until(what: str, condition, deadline_s: float):
    deadline = time.monotonic() + deadline_s
    while True:
        found = condition()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {deadline_s}s: {what}"
        time.sleep(0.2)


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def tiny_image(tmp_path):
    """A one-file image in the project's store (podman import: no network), removed afterwards."""
    tag = os.urandom(4).hex()
    name = f"localhost/sat-test/registry-tiny:{tag}"
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = f"registry test {tag}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "layer.tar").write_bytes(layer.getvalue())
    podman(["import", str(tmp_path / "layer.tar"), name], timeout=300)
    yield name
    podman(["rmi", "--force", name], check=False, timeout=300)


def test_sat_up_serves_an_image_over_tls_with_its_generated_login(tmp_path, tiny_image, monkeypatch):
    from sat_tasks.backends.local.container_run import ImagePullError, PullLogin, job_pull_login, prepare_image
    from sat_tasks.io.registry import ImageCheckOutcome, check_image
    from sat_tasks.spec.loading import parse_spec

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    lines: list[str] = []
    stack = ServiceStack(home=tmp_path / "home", port=free_port(), storage_port=free_port(),
                         storage_dir=tmp_path / "object-storage", jobs_dir=jobs, work_dir=tmp_path / "work",
                         registry=True, registry_images=(tiny_image,), certs_dir=tmp_path / "containers" / "certs.d",
                         restart_backoff_s=0.1, log=lines.append)
    pulled: list[str] = []
    try:
        stack.start(timeout=300)
        registry = stack.embedded_registry
        password = json.loads((stack.home / SECRETS_FILE).read_text())["registry_password"]
        assert registry is not None and registry.password == password
        assert stack.registry_push is not None
        stack.registry_push.join(timeout=300)
        served = stack.registry_served.get(tiny_image)
        assert served == f"127.0.0.1:{registry.port}/sat-test/registry-tiny:{tiny_image.rsplit(':', 1)[1]}", lines

        # what `make image` finds to push to: the running deployment's registry, its login and CA
        found = embedded.running(stack.home, certs_dir=tmp_path / "containers" / "certs.d")
        assert found is not None and found.address == registry.address and found.password == password

        # what the components get: the login as a shared connection, the CA as [sat] registry_ca_file
        env = stack.environment()
        connection = json.loads(env[f"AIRFLOW_CONN_{embedded.CONN_ID.upper()}"])
        assert connection["host"] == registry.address and connection["login"] == embedded.USER
        assert embedded.CONN_ID in env["AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS"].split(",")
        ca_file = env["AIRFLOW__SAT__REGISTRY_CA_FILE"]
        assert ca_file == str(tmp_path / "containers" / "certs.d" / registry.address / "ca.crt")

        # the image check: the login and the CA find it; without either it is refused
        checked = check_image(served, username=connection["login"], password=connection["password"], ca_file=ca_file)
        assert checked.outcome is ImageCheckOutcome.OK, checked.message
        anonymous = check_image(served, ca_file=ca_file, retries=0)
        assert anonymous.outcome is ImageCheckOutcome.UNAUTHORIZED, anonymous.message
        untrusted = check_image(served, username=connection["login"], password=connection["password"], retries=0)
        assert untrusted.outcome is ImageCheckOutcome.UNTRUSTED, untrusted.message

        # the container runtime's pull, with the job naming the deployment's connection (read as Airflow reads it)
        for key in (f"AIRFLOW_CONN_{embedded.CONN_ID.upper()}", "AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS",
                    "AIRFLOW__SAT__REGISTRY_CA_FILE"):
            monkeypatch.setenv(key, env[key])
        job = parse_spec({"name": "registry-pull", "image": {"url": served, "registry_conn_id": embedded.CONN_ID},
                          "command": "true", "data": {"source": "s3://sat-demo/datasets/tiny-corpus/"},
                          "storage": {"script_url": "s3://sat-demo/scripts/train.py"},
                          "results": {"destination": "s3://sat-demo/results/"}})
        login = job_pull_login(job)
        assert login.username == embedded.USER and login.registry == registry.address
        digest = prepare_image(served, pulled.append, login)
        assert digest.startswith("sha256:"), pulled
        podman(["rmi", served], timeout=120)
        with pytest.raises(ImagePullError) as refused:
            prepare_image(served, pulled.append, PullLogin(registry=registry.address, cert_dir=login.cert_dir), tries=1)
        assert "unauthorized" in str(refused.value) or "authentication required" in str(refused.value), refused.value

        # supervision: a killed registry is restarted and serves again
        first = stack.processes[REGISTRY]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)

        def restarted():
            stack.supervise()
            return stack.processes[REGISTRY] is not first and stack.processes[REGISTRY].poll() is None

        _until("the registry's restart", restarted, 120)
        registry.wait_ready(120)
        assert registry.has("sat-test/registry-tiny", tiny_image.rsplit(":", 1)[1])
        assert any(f"[sat] restarted the {REGISTRY}" in line for line in lines), lines
    finally:
        stack.stop(grace=30)
        podman(["rmi", "--force", *([served] if (served := stack.registry_served.get(tiny_image)) else [])],
               check=False, timeout=120)
    assert stack.processes[REGISTRY].poll() is not None
    assert not _answers(registry.port)
    assert embedded.running(stack.home, certs_dir=tmp_path / "containers" / "certs.d") is None
    said = "\n".join([*lines, *pulled, (stack.logs_dir / f"{REGISTRY}.log").read_text(errors="replace")])
    assert password not in said
    assert password not in (stack.home / "registry" / "config.yml").read_text()
