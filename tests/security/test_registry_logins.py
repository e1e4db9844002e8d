"""Registry logins (issue 29.3): a job names only its own `sat_registry_<job>` connection or one the deployment
shares, a connection without a host is refused, and credentials go only to the registry host the connection names.

Against the real registry on loopback (tests/support/registry_server.py) and a stand-in registry that records
every Authorization header it is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from sat_tasks.errors import JobStopped
from sat_tasks.io.registry import RegistryAccess, RegistryLoginRefused, registry_access_from_connection
from sat_tasks.pipeline import steps
from sat_tasks.spec import load_spec
from sat_tasks.spec.model import registry_conn_id_problem
from tests.conftest import ROOT
from tests.support.registry_server import push_test_image, start_registry

DEMO = load_spec(ROOT / "include" / "jobs" / "tiny-llama-demo.yaml")
OWN = f"sat_registry_{DEMO.name}"
KEY_PAIR = SimpleNamespace(login="AKIA-object-storage", password="object-storage-secret")  # another connection's


def _job(url: str, conn_id: str | None, insecure: bool = True):
    return DEMO.model_copy(update={"image": DEMO.image.model_copy(
        update={"url": url, "registry_conn_id": conn_id, "insecure": insecure})})


def _conn(host: str, login: str = KEY_PAIR.login, password: str = KEY_PAIR.password) -> SimpleNamespace:
    return SimpleNamespace(host=host, login=login, password=password, schema="", extra_dejson={"insecure": True})


class RecordingRegistry:
    """A loopback registry stand-in: a Basic challenge on /v2/, every Authorization header kept."""

    def __init__(self) -> None:
        self.authorizations: list[str] = []
        self.requests = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                stand_in.requests += 1
                if "Authorization" in self.headers:
                    stand_in.authorizations.append(self.headers["Authorization"])
                self.send_response(401)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                self.send_header("WWW-Authenticate", 'Basic realm="stand-in"')
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[RecordingRegistry]:
    server = RecordingRegistry()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def real_registry(tmp_path_factory):
    with start_registry(tmp_path_factory.mktemp("registry"), users={"robot": "robot-pass"}) as server:
        push_test_image(server, "team/model", "v1", "robot", "robot-pass")
        yield server


@pytest.mark.parametrize(("conn_id", "shared", "allowed"), [
    pytest.param(None, frozenset(), True, id="no-login"),
    pytest.param(OWN, frozenset(), True, id="its-own"),
    pytest.param("team_robot", frozenset({"team_robot"}), True, id="shared-by-the-operator"),
    pytest.param("sat_object_storage", frozenset(), False, id="the-service-object-storage-keys"),
    pytest.param("sat_registry_other-team-job", frozenset({"team_robot"}), False, id="another-jobs-login"),
])
def test_a_job_names_only_its_own_or_a_shared_registry_login(conn_id, shared, allowed):
    problem = registry_conn_id_problem(_job("r.example.com/team/model:v1", conn_id), shared)
    assert (problem is None) is allowed
    if not allowed:
        assert problem.startswith(f"image.registry_conn_id: must be the job's own {OWN!r}")
        assert "[sat] shared_registry_connections" in problem


def test_a_connection_without_a_host_is_refused_naming_the_field():
    with pytest.raises(RegistryLoginRefused) as caught:
        registry_access_from_connection(_conn(""), "r.example.com/team/model:v1", conn_id=OWN)
    assert f"registry connection {OWN!r} (image.registry_conn_id) has no host" in str(caught.value)
    assert KEY_PAIR.password not in str(caught.value)


def test_a_connection_for_another_host_gives_no_credentials():
    assert registry_access_from_connection(_conn("r.example.com"), "other.example.com/team/model:v1") == (
        RegistryAccess())


def test_another_connection_is_refused_before_it_is_read(demo_bucket, stand_in):
    read: list[str] = []
    job = _job(f"{stand_in.host}/team/model:v1", "sat_object_storage")
    with pytest.raises(JobStopped, match="image.registry_conn_id: must be the job's own"):
        steps.check_image(job, "manual__login_other", get_connection=lambda cid: read.append(cid) or _conn(""),
                          log=lambda line: None)
    assert read == [] and stand_in.requests == 0


def test_a_hostless_login_sends_nothing_anywhere(demo_bucket, stand_in):
    """Before: the key pair of a host-less connection reached whatever registry the image named."""
    job = _job(f"{stand_in.host}/team/model:v1", OWN)
    with pytest.raises(JobStopped, match="has no host"):
        steps.check_image(job, "manual__login_hostless", get_connection=lambda cid: _conn(""), log=lambda line: None)
    assert stand_in.requests == 0 and stand_in.authorizations == []


def test_a_login_for_another_host_is_not_sent_to_the_images_registry(demo_bucket, stand_in):
    job = _job(f"{stand_in.host}/team/model:v1", OWN)
    with pytest.raises(JobStopped, match="requires credentials and none were given"):
        steps.check_image(job, "manual__login_elsewhere", get_connection=lambda cid: _conn("registry.example.com"),
                          log=lambda line: None)
    assert stand_in.requests >= 1 and stand_in.authorizations == []


def test_a_shared_login_for_the_images_registry_is_used(demo_bucket, real_registry, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS", "ci_robot, team_robot")
    job = _job(f"{real_registry.host}/team/model:v1", "team_robot")
    result = steps.check_image(job, "manual__login_shared", log=lambda line: None,
                               get_connection=lambda cid: _conn(real_registry.host, "robot", "robot-pass"))
    assert result["outcome"] == "ok"


def test_the_jobs_own_login_for_the_images_registry_is_used(demo_bucket, real_registry):
    job = _job(f"{real_registry.host}/team/model:v1", OWN)
    result = steps.check_image(job, "manual__login_own", log=lambda line: None,
                               get_connection=lambda cid: _conn(real_registry.host, "robot", "robot-pass"))
    assert result["outcome"] == "ok"


def test_every_launch_and_so_every_pull_secret_comes_after_the_login_check():
    """On Kubernetes the pull Secret's name comes from the same id: pods start only downstream of check_image."""
    from sat_tasks.airflow.dag_factory import build_job_dag

    job = DEMO.model_copy(update={"faults": []}).with_backend("kubernetes")
    dag = build_job_dag(job, dag_id=job.name)
    after_check = dag.get_task("check_image").get_flat_relative_ids(upstream=False)
    launches = {t for t in dag.task_ids if t.endswith(".launch")}
    assert launches and launches <= after_check
    assert dag.get_task("attempt_1.launch").upstream_task_ids == {"validate_data"}
    assert {"check_image"} <= dag.get_task("stage_data").upstream_task_ids
