"""Tests of staging into the Kubernetes run volume: the claim, the staging pod, and stage_cli against local S3."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import settings as k8s_settings
from sat_tasks.backends.kubernetes import staging as k8s_staging
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.runtime_env import POD_CODE_DIR, POD_DATA_DIR
from sat_tasks.errors import JobStopped
from sat_tasks.io import staging as stage_cli
from sat_tasks.pipeline import steps
from sat_tasks.spec import parse_spec
from tests.support.paths import REPO

RUN_ID = "manual__2026-11-29T18:00:00+00:00"
NAMESPACE = "sat-jobs"
BUCKET = "sat-staging-tests"
K8S_VERSION = "1.37.0"
SETTINGS = k8s_settings.KubernetesSettings(object_storage_endpoint="https://storage.example.com",
                                  object_storage_secret="team-a-keys",
                                  staging_image="registry.example.com/sat/airflow:9")
MARKER_ID, MARKER_SECRET = "AKIAMARKERc0ffee", "s3cr3t-MARKER-staging"


def _job(**overrides):
    spec = {
        "name": "llama-ft",
        "learning_type": "on-demand",
        "framework": "pytorch",
        "nodes": 1,
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/ml/llama-train:1.4.2"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "storage": {"script_url": f"s3://{BUCKET}/scripts/train.py"},
        "command": "python train.py",
        "backend": "kubernetes",
    }
    spec.update(overrides)
    return parse_spec(spec)


def _api_error(status: int):
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=status, reason={404: "Not Found", 409: "Conflict", 403: "Forbidden"}[status])


class FakeCoreV1:
    """Records the CoreV1Api calls staging makes; the pod walks through scripted statuses."""

    def __init__(self, statuses=({"phase": "Succeeded"},), log: str = "", existing_pod: bool = False):
        self.claims: list[dict] = []
        self.created_pods: list[dict] = []
        self.deleted: list[str] = []
        self.reads = 0
        self.statuses = list(statuses)
        self.log = log
        self.pod_exists = existing_pod
        self.log_requests: list[tuple[str, str, str]] = []

    def create_namespaced_persistent_volume_claim(self, namespace, body):
        if any(c["metadata"]["name"] == body["metadata"]["name"] for c in self.claims):
            raise _api_error(409)
        self.claims.append(body)

    def create_namespaced_pod(self, namespace, body):
        if self.pod_exists:
            raise _api_error(409)
        self.pod_exists = True
        self.created_pods.append(body)

    def read_namespaced_pod(self, name, namespace):
        from kubernetes.client import ApiClient

        if not self.pod_exists:
            raise _api_error(404)
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return ApiClient()._ApiClient__deserialize({"metadata": {"name": name}, "status": status}, "V1Pod")

    def read_namespaced_pod_log(self, name, namespace, container, _preload_content=True):
        self.log_requests.append((name, namespace, container))
        return SimpleNamespace(data=self.log.encode()) if not _preload_content else self.log

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds=None):
        if not self.pod_exists:
            raise _api_error(404)
        self.pod_exists = False
        self.deleted.append(name)


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def _stage(client, job=None, *, lines=None, **kwargs):
    clock = FakeClock()
    kwargs.setdefault("timeout_seconds", 60)
    kwargs.setdefault("poll_seconds", 5)
    return k8s_staging.stage_into_volume(job or _job(), RUN_ID, client=client, namespace=NAMESPACE,
                                         log=(lines.append if lines is not None else lambda _line: None),
                                         settings=SETTINGS, sleep=clock.sleep, clock=clock, **kwargs), clock


REPORT = {"code": {"files": 1, "destination": POD_CODE_DIR}, "data": {"files": 3, "transferred": 3}}
GOOD_LOG = f"staging 3 objects\nstaged 3 files\n{stage_cli.REPORT_PREFIX}{json.dumps(REPORT)}\n"


# ---- the run volume ----------------------------------------------------------------------------
def test_run_volume_is_created_once():
    client = FakeCoreV1()
    job = _job()
    assert k8s_staging.ensure_run_volume(job, RUN_ID, client=client, namespace=NAMESPACE, settings=SETTINGS)
    assert not k8s_staging.ensure_run_volume(job, RUN_ID, client=client, namespace=NAMESPACE, settings=SETTINGS)
    (claim,) = client.claims
    assert claim == k8s_pods.render_run_volume_claim(job, run_id=RUN_ID, namespace=NAMESPACE, settings=SETTINGS)
    _validate(claim)


def test_run_volume_errors_other_than_exists_are_raised():
    from kubernetes.client.exceptions import ApiException

    class Forbidden(FakeCoreV1):
        def create_namespaced_persistent_volume_claim(self, namespace, body):
            raise _api_error(403)

    with pytest.raises(ApiException):
        k8s_staging.ensure_run_volume(_job(), RUN_ID, client=Forbidden(), namespace=NAMESPACE, settings=SETTINGS)


# ---- the staging pod ---------------------------------------------------------------------------
@pytest.mark.parametrize("script_url", [pytest.param(f"s3://{BUCKET}/scripts/train.py", id="script"),
                                        pytest.param(None, id="no-script")])
def test_staging_pod_is_schema_valid_and_mounts_the_attempts_subpaths(script_url):
    job = _job(storage={"script_url": script_url} if script_url else {})
    pod = k8s_staging.build_staging_pod(job, RUN_ID, namespace=NAMESPACE, settings=SETTINGS)
    _validate(pod)
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.example.com/sat/airflow:9"
    command = container["command"]
    assert command[:4] == ["python", "-m", "sat_tasks.io.staging", "stage"]
    args = dict(zip(command[4::2], command[5::2]))
    assert args["--source"] == job.data.source
    assert (args["--dest"], args["--code-dest"]) == (POD_DATA_DIR, POD_CODE_DIR)
    assert args.get("--script-url") == script_url
    assert command[-1] == "--validate"
    # The same claim and sub-paths the training pods mount at the same paths.
    subpaths = k8s_names.run_volume_subpaths(job, RUN_ID)
    assert pod["spec"]["volumes"] == [{"name": "run", "persistentVolumeClaim": {
        "claimName": k8s_names.run_volume_claim_name(job, RUN_ID)}}]
    assert container["volumeMounts"] == [
        {"name": "run", "mountPath": POD_DATA_DIR, "subPath": subpaths["data"]},
        {"name": "run", "mountPath": POD_CODE_DIR, "subPath": subpaths["code"]},
    ]
    (training_pod,) = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), settings=SETTINGS)
    training_mounts = {m["mountPath"]: m["subPath"] for m in training_pod["spec"]["containers"][0]["volumeMounts"]
                       if m["name"] == "run"}
    assert {m["mountPath"]: m["subPath"] for m in container["volumeMounts"]}.items() <= training_mounts.items()
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_staging_pod_reads_keys_from_the_secret_and_renders_none(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SAT_OBJECT_STORAGE", json.dumps(
        {"conn_type": "aws", "login": MARKER_ID, "password": MARKER_SECRET}))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MARKER_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MARKER_SECRET)
    pod = k8s_staging.build_staging_pod(_job(), RUN_ID, namespace=NAMESPACE, settings=SETTINGS)
    rendered = yaml.safe_dump(pod)
    assert MARKER_ID not in rendered and MARKER_SECRET not in rendered
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "team-a-keys", "key": "access_key_id"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "team-a-keys", "key": "secret_access_key"}}
    assert env["AWS_ENDPOINT_URL_S3"] == "https://storage.example.com"


def test_staging_pod_without_an_endpoint_uses_aws():
    pod = k8s_staging.build_staging_pod(_job(), RUN_ID, namespace=NAMESPACE, settings=k8s_settings.KubernetesSettings())
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert "AWS_ENDPOINT_URL_S3" not in names
    assert pod["spec"]["containers"][0]["image"] == "registry.example.com/sat/airflow:0.1.0"


# ---- running it --------------------------------------------------------------------------------
def test_staging_succeeds_passes_the_log_on_and_returns_the_report():
    client = FakeCoreV1(statuses=[{"phase": "Pending"}, {"phase": "Running"}, {"phase": "Succeeded"}], log=GOOD_LOG)
    lines: list[str] = []
    report, clock = _stage(client, lines=lines)
    assert report == REPORT
    (pod,) = client.created_pods
    assert pod == k8s_staging.build_staging_pod(_job(), RUN_ID, namespace=NAMESPACE, settings=SETTINGS)
    assert "staging 3 objects" in lines and "staged 3 files" in lines
    assert not any(stage_cli.REPORT_PREFIX in line for line in lines)
    assert client.log_requests == [(pod["metadata"]["name"], NAMESPACE, k8s_staging.HELPER_CONTAINER)]
    assert client.deleted == [pod["metadata"]["name"]]  # a finished staging pod is removed
    assert clock.sleeps == [5, 5]


def test_staging_failure_raises_with_the_exit_status_and_log_tail_and_keeps_the_pod():
    failed = {"phase": "Failed", "containerStatuses": [{
        "name": "stage", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    client = FakeCoreV1(statuses=[{"phase": "Running"}, failed],
                        log="staging 3 objects\nstaging failed: SourceNotFoundError: no objects under s3://x/\n")
    with pytest.raises(k8s_staging.HelperPodFailed, match=r"(?s)failed \(exit status 1, Error\):\n.*SourceNotFoundError"):
        _stage(client)
    assert client.deleted == []  # kept for kubectl logs / describe


def test_staging_timeout_deletes_the_pod_and_says_so():
    client = FakeCoreV1(statuses=[{"phase": "Running"}], log="staging 3 objects\n")
    with pytest.raises(k8s_staging.HelperPodFailed, match=r"did not finish within 60s \(phase Running\); deleted"):
        _stage(client, timeout_seconds=60, poll_seconds=5)
    assert client.deleted == [k8s_staging.staging_pod_name(_job(), RUN_ID)]
    assert client.reads == 13  # bounded: 0, 5, ..., 60 s


def test_a_pod_that_cannot_start_fails_fast_and_names_the_secret():
    waiting = {"phase": "Pending", "containerStatuses": [{
        "name": "stage", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "CreateContainerConfigError",
                              "message": 'secret "team-a-keys" not found'}}}]}
    client = FakeCoreV1(statuses=[waiting])
    with pytest.raises(k8s_staging.HelperPodFailed, match="cannot start: CreateContainerConfigError.*team-a-keys"):
        _stage(client, timeout_seconds=3600)
    assert client.reads == 1
    assert client.log_requests == []


def test_a_leftover_staging_pod_is_replaced():
    client = FakeCoreV1(log=GOOD_LOG, existing_pod=True)
    report, _ = _stage(client)
    name = k8s_staging.staging_pod_name(_job(), RUN_ID)
    assert report == REPORT
    assert client.deleted == [name, name]  # the leftover, then the finished pod
    assert len(client.created_pods) == 1


def test_a_report_less_success_is_an_error():
    with pytest.raises(k8s_staging.HelperPodFailed, match="printed no report"):
        _stage(FakeCoreV1(log="hello\n"))


def test_stage_data_on_kubernetes_uses_the_cluster(monkeypatch):
    from sat_tasks.backends.kubernetes import client as k8s_client

    client = FakeCoreV1(log=GOOD_LOG)
    monkeypatch.setattr(k8s_client, "core_v1_client", lambda kubernetes_conn_id=None: client)
    monkeypatch.setattr(k8s_settings.KubernetesSettings, "from_sat_config", classmethod(lambda cls: SETTINGS))
    monkeypatch.setattr(k8s_staging.time, "sleep", lambda _s: None)
    lines: list[str] = []
    report = steps.stage_data(_job(), RUN_ID, log=lines.append)
    assert report == REPORT
    assert [c["metadata"]["name"] for c in client.claims] == [k8s_names.run_volume_claim_name(_job(), RUN_ID)]
    assert len(client.created_pods) == 1
    assert "staged 3 files" in lines


def test_module_imports_no_kubernetes_or_airflow():
    import subprocess
    import sys

    code = "import sys, sat_tasks.backends.kubernetes.staging; print(sorted(m for m in ('kubernetes', 'airflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- stage_cli, the staging pod's program, against the local S3 server -------------------------
@pytest.fixture
def staged_bucket(s3_server, s3_hook, monkeypatch):
    """The bucket with a corpus and a script; the process env as the staging pod has it (no connection)."""
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    files = {"datasets/corpus/a.txt": b"hello\n", "datasets/corpus/sub/b.txt": b"world\n" * 100,
             "datasets/corpus/c.jsonl": b'{"text": "x"}\n', "scripts/train.py": b"print('train')\n"}
    for key, data in files.items():
        s3_hook.load_bytes(data, key=key, bucket_name=BUCKET, replace=True)
    conn = s3_server.connection()
    monkeypatch.delenv("AIRFLOW_CONN_SAT_OBJECT_STORAGE", raising=False)  # the pod has no Airflow connection
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", conn["login"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", conn["password"])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return files


def _report(out: str) -> dict:
    (line,) = [x for x in out.splitlines() if x.startswith(stage_cli.REPORT_PREFIX)]
    return json.loads(line[len(stage_cli.REPORT_PREFIX):])


def test_stage_cli_stages_data_and_script_idempotently(staged_bucket, tmp_path, capsys):
    argv = ["stage", "--source", f"s3://{BUCKET}/datasets/corpus/", "--dest", str(tmp_path / "data"),
            "--script-url", f"s3://{BUCKET}/scripts/train.py", "--code-dest", str(tmp_path / "code")]
    assert stage_cli.main(argv) == 0
    report = _report(capsys.readouterr().out)
    assert (tmp_path / "code" / "train.py").read_bytes() == staged_bucket["scripts/train.py"]
    assert (tmp_path / "data" / "sub" / "b.txt").read_bytes() == staged_bucket["datasets/corpus/sub/b.txt"]
    assert report["data"]["files"] == 3 and report["data"]["transferred"] == 3
    assert report["code"] == {"files": 1, "destination": str(tmp_path / "code")}

    assert stage_cli.main(argv) == 0  # a retried task copies nothing again
    again = _report(capsys.readouterr().out)
    assert again["data"]["skipped"] == 3 and again["data"]["transferred"] == 0


def test_stage_cli_without_a_script_creates_the_code_dir(staged_bucket, tmp_path, capsys):
    argv = ["stage", "--source", f"s3://{BUCKET}/datasets/corpus/", "--dest", str(tmp_path / "data"),
            "--code-dest", str(tmp_path / "code")]
    assert stage_cli.main(argv) == 0
    assert (tmp_path / "code").is_dir() and not list((tmp_path / "code").iterdir())
    assert "code" not in _report(capsys.readouterr().out)


def test_stage_cli_fails_clearly_on_a_missing_prefix(staged_bucket, tmp_path, capsys):
    argv = ["stage", "--source", f"s3://{BUCKET}/datasets/nothing-here/", "--dest", str(tmp_path / "data"),
            "--code-dest", str(tmp_path / "code")]
    assert stage_cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "stage failed: SourceNotFoundError: no objects under" in captured.err
    assert stage_cli.REPORT_PREFIX not in captured.out


def test_stage_cli_validates_where_the_data_is(staged_bucket, tmp_path, capsys):
    argv = ["stage", "--source", f"s3://{BUCKET}/datasets/corpus/", "--dest", str(tmp_path / "data"),
            "--code-dest", str(tmp_path / "code"), "--validate"]
    assert stage_cli.main(argv) == 0
    report = _report(capsys.readouterr().out)
    assert report["validation"]["success"] is True and report["validation"]["summary_lines"] == []


def test_validate_data_on_kubernetes_uses_the_staging_pods_result(s3_hook, tmp_path):
    job = _job()
    ok = {"validation": {"success": True, "suite_name": "text_corpus", "summary_lines": []}}
    assert steps.validate_data(job, RUN_ID, ok, log=lambda _: None)["success"] is True
    if not s3_hook.check_for_bucket(BUCKET):  # the failure is recorded in the run's status history
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    bad = {"validation": {"success": False, "summary_lines": ["expect_table_row_count_to_be_between: 0 files"]}}
    with pytest.raises(JobStopped, match="0 files"):
        steps.validate_data(job, RUN_ID, bad, log=lambda _: None)
    with pytest.raises(JobStopped, match="no data validation result"):
        steps.validate_data(job, RUN_ID, {}, log=lambda _: None)
