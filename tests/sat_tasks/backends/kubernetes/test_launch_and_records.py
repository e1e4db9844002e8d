"""Tests of the kubernetes backend's launch task, attempt record and cleanup (operator, records, cleanup).

No cluster: the operator is tested up to the pod it would submit (the provider's own
`execute` is replaced by a capture), and the record/cleanup through the real CoreV1Api
whose HTTP layer answers from recorded API responses (fixtures/k8s_launch/<case>/).
"""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pytest
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from kubernetes.client import ApiClient

from sat_tasks.backends.kubernetes import cleanup as k8s_cleanup
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import operator as k8s_operator
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import records as k8s_records
from sat_tasks.backends.kubernetes import settings as k8s_settings
from sat_tasks.backends.kubernetes.operator import (
    SatTrainingPodOperator,
    make_launch_operators,
)
from sat_tasks.classify import VerdictKind, classify, combine_rank_records
from sat_tasks.classify.multirank import PEER_SYMPTOM_REASONS
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.clock import parse_time
from sat_tasks.core.handoffs import Action, Decision, Plan
from sat_tasks.core.joblog import job_log_footer, job_log_header
from sat_tasks.io import object_storage
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import steps
from sat_tasks.spec import TrainingJob, parse_spec
from tests.support.k8s_api import RecordedCluster
from tests.support.paths import SAT_FIXTURES
from tests.support.task_instance import TaskInstanceStub

FIXTURES = SAT_FIXTURES / "k8s_launch"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "case.json").exists())
BUCKET = "sat-k8s-tests"
RUN_ID = "manual__2026-11-29T18:00:00+00:00"
NAMESPACE = "sat-jobs"


def _case(name: str) -> dict:
    return json.loads((FIXTURES / name / "case.json").read_text())


def _mirror_progress(case: str, job: TrainingJob, run_id: str) -> dict | None:
    """Put the case's progress.json where the engine's mirror keeps it (what the record reads)."""
    from sat_tasks.spec import split_s3_uri

    run, path = JobRun(job, run_id), FIXTURES / case / "progress.json"
    if not path.exists():  # the engine never ran (or never wrote): nothing mirrored, whatever another case left
        bucket, key = split_s3_uri(run.progress_uri)
        run.hook().delete_objects(bucket=bucket, keys=[key])
        return None
    progress = json.loads(path.read_text())
    object_storage.write_json(run.hook(), run.progress_uri, progress)
    return progress


def _read_record(job: TrainingJob, run_id: str, attempt: int, *, client, namespace: str = NAMESPACE,
                 log=lambda _m: None, case: str | None = None) -> AttemptRecord | None:
    if case is not None:
        _mirror_progress(case, job, run_id)
    return k8s_records.read_attempt_record(JobRun(job, run_id), attempt, client=client, namespace=namespace, log=log)


def _decision(action: str, attempt: int = 1, **fields) -> dict:
    verdict = {"upload": "SUCCEEDED", "stop": "INTERNAL"}.get(action, "HARDWARE")
    return Decision(attempt=attempt, verdict=verdict, action=Action(action), why=f"{action} (test)",
                    **fields).to_xcom()


def _spec(**overrides) -> dict:
    spec = {
        "name": "llama-ft",
        "learning_type": "on-demand",
        "framework": "pytorch",
        "job_failover": True,
        "nodes": 1,
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "480Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/ml/llama-train:1.4.2", "registry_conn_id": "sat_registry_main"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": 'python train.py --data_dir "$SAT_DATA_DIR" --output_dir "$SAT_OUTPUT_DIR"',
        "backend": "kubernetes",
    }
    spec.update(overrides)
    return parse_spec(spec).to_dict()


@pytest.fixture(scope="module")
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


# ---- the launch operator ----------------------------------------------------------------------
def _context(operator, xcoms: dict) -> dict:
    return {"ti": TaskInstanceStub(operator.task_id, xcoms, dag_id="llama-ft"), "run_id": RUN_ID, "dag": SimpleNamespace()}


@pytest.fixture
def cluster(monkeypatch) -> RecordedCluster:
    """An empty recorded cluster behind the provider's hook (what the operator creates lands here)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    recorded = RecordedCluster()
    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(lambda self: recorded.client()))
    return recorded


@pytest.fixture
def captured(monkeypatch, cluster):
    """Replace the provider's execute: keep the pod it would create, and the operator."""
    seen: list[tuple[dict, KubernetesPodOperator]] = []

    def fake_execute(self, context):
        pod = self.build_pod_request_obj(context, dry_run=True)
        seen.append((ApiClient().sanitize_for_serialization(pod), self))

    monkeypatch.setattr(KubernetesPodOperator, "execute", fake_execute)
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "kubernetes")
    return seen


def _env(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def _excluded(pod: dict) -> list[str]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return [v for t in terms for e in t.get("matchExpressions", []) if e["key"] == "kubernetes.io/hostname"
            for v in e["values"]]


def _history(job: TrainingJob) -> list[dict]:
    return JobRun(job, RUN_ID).history(lambda _m: None).entries()


def test_first_attempt_launches_the_rendered_pod_and_records_running(captured, bucket):
    spec = _spec(name="first-attempt")
    (operator,) = make_launch_operators(attempt=1, previous_decide_task_id=None, job=TrainingJob.model_validate(spec))
    assert operator.task_id == "launch" and operator.on_finish_action.value == "keep_pod"
    operator.execute(_context(operator, {"validate_spec": spec}))

    ((pod, op),) = captured
    job = TrainingJob.model_validate(spec)
    assert pod["metadata"]["name"] == f"{k8s_names.attempt_name(job, RUN_ID, 1)}-r0"
    assert pod["metadata"]["namespace"] == NAMESPACE
    labels = pod["metadata"]["labels"]
    assert labels[k8s_names.LABEL_ATTEMPT] == "1" and labels[k8s_names.LABEL_JOB] == "first-attempt"
    assert labels["task_id"] == "launch" and labels["dag_id"] == "llama-ft"
    assert _excluded(pod) == []
    assert "CKPT_LAST_STEP" not in _env(pod)
    assert _env(pod)["SAT_ATTEMPT"] == "1"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert op.on_finish_action.value == "keep_pod" and op.get_logs and op.random_name_suffix is False
    assert op.kubernetes_conn_id == "kubernetes_default"
    (entry,) = _history(job)
    assert (entry["status"], entry["reason"], entry["attempt"]) == ("Running", "attempt 1 started", 1)


def test_failover_attempt_avoids_failed_nodes_and_resumes(captured, bucket):
    spec = _spec(name="failover-attempt")
    previous = _decision("failover", attempt=2, exclude_nodes=["gpu-node-12", "gpu-node-03"], resume_step=500,
                         failovers=2)
    (operator,) = make_launch_operators(attempt=3, previous_decide_task_id="attempt_2.decide",
                                        job=TrainingJob.model_validate(spec))
    operator.execute(_context(operator, {"validate_spec": spec, "attempt_2.decide": previous}))

    ((pod, _op),) = captured
    job = TrainingJob.model_validate(spec)
    assert pod["metadata"]["name"] == f"{k8s_names.attempt_name(job, RUN_ID, 3)}-r0"
    assert sorted(_excluded(pod)) == ["gpu-node-03", "gpu-node-12"]
    assert _env(pod)["CKPT_LAST_STEP"] == "500"
    assert _env(pod)["SAT_ATTEMPT"] == "3"
    assert [e["status"] for e in _history(job)] == ["Running"]


@pytest.mark.parametrize("previous", [
    pytest.param(None, id="previous-skipped"),
    pytest.param(_decision("stop", status="Pending - internalerror"), id="previous-stopped"),
    pytest.param(_decision("upload"), id="previous-succeeded"),
])
def test_an_attempt_that_is_not_needed_is_skipped(captured, previous):
    spec = _spec(name="not-needed")
    (operator,) = make_launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=None)
    with pytest.raises(AirflowSkipException, match="not needed"):
        operator.execute(_context(operator, {"validate_spec": spec, "attempt_1.decide": previous}))
    assert captured == []


def test_no_validated_spec_skips(captured):
    (operator,) = make_launch_operators(attempt=1, previous_decide_task_id=None, job=None)
    with pytest.raises(AirflowSkipException, match="no validated spec"):
        operator.execute(_context(operator, {}))
    assert captured == []


def test_pod_gets_no_secret(captured, bucket, monkeypatch):
    password = "s3cr3t-registry-password"
    monkeypatch.setenv("AIRFLOW_CONN_SAT_REGISTRY_MAIN", json.dumps(
        {"conn_type": "generic", "host": "registry.example.com", "login": "robot", "password": password}))
    spec = _spec(name="no-secrets")
    (operator,) = make_launch_operators(attempt=1, previous_decide_task_id=None, job=None)
    operator.execute(_context(operator, {"validate_spec": spec}))
    ((pod, op),) = captured
    assert password not in json.dumps(pod) and password not in repr(op.full_pod_spec)
    # the run's pull Secret, made from the registry login before the pod (ADR 0032), by name only
    assert pod["spec"]["imagePullSecrets"] == [
        {"name": k8s_names.registry_secret_name(TrainingJob.model_validate(spec), RUN_ID)}]
    container = pod["spec"]["containers"][0]
    assert not container.get("envFrom")
    # The only Secret references: the attempt's own Object Storage credentials for the checkpoint mirror
    # (ADR 0009), scoped to its run (ADR 0020).
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
                   if "secretKeyRef" in (e.get("valueFrom") or {})}
    own = k8s_names.attempt_credentials_name(TrainingJob.model_validate(spec), RUN_ID, 1)
    assert secret_refs == {"AWS_ACCESS_KEY_ID": {"name": own, "key": "access_key_id"},
                           "AWS_SECRET_ACCESS_KEY": {"name": own, "key": "secret_access_key"},
                           "AWS_SESSION_TOKEN": {"name": own, "key": "session_token"}}
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_multi_node_job_gets_one_operator_per_rank(captured, cluster, bucket):
    spec = _spec(name="two-nodes", nodes=2, command="python train.py")
    job = TrainingJob.model_validate(spec)
    operators = make_launch_operators(attempt=1, previous_decide_task_id=None, job=job)
    assert [op.task_id for op in operators] == ["launch", "launch_rank_1"]
    assert [op.node_rank for op in operators] == [0, 1]

    operators[1].execute(_context(operators[1], {"validate_spec": spec}))
    ((pod, op),) = captured
    assert pod["metadata"]["name"] == f"{k8s_names.attempt_name(job, RUN_ID, 1)}-r1"
    assert pod["metadata"]["labels"][k8s_names.LABEL_NODE_RANK] == "1"
    assert pod["spec"]["hostname"] == pod["metadata"]["name"]
    assert pod["spec"]["subdomain"] == k8s_names.attempt_name(job, RUN_ID, 1)
    assert _env(pod)["NODE_RANK"] == "1" and _env(pod)["NNODES"] == "2"
    assert op.callbacks == [k8s_operator.gang_teardown_callback()]
    assert _history(job) == []  # only rank 0 records the attempt's start
    # The rank's task created the headless rendezvous Service `sat render` prints, with its body.
    rendered = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=Plan(attempt=1), namespace=NAMESPACE)
    assert rendered[0]["kind"] == "Service" and cluster.services == [rendered[0]]
    operators[0].execute(_context(operators[0], {"validate_spec": spec}))  # the other rank finds it (409)
    assert len(cluster.services) == 1 and len(captured) == 2


def test_generic_dag_rank_tasks_follow_the_spec(captured, bucket):
    operators = make_launch_operators(attempt=1, previous_decide_task_id=None, job=None, max_nodes=2)
    single = _spec(name="generic-single")
    with pytest.raises(AirflowSkipException, match="rank 1 is not used"):
        operators[1].execute(_context(operators[1], {"validate_spec": single}))
    too_big = _spec(name="generic-big", nodes=3, command="python train.py")
    with pytest.raises(AirflowFailException, match="at most 2"):
        operators[0].execute(_context(operators[0], {"validate_spec": too_big}))
    operators[0].execute(_context(operators[0], {"validate_spec": single}))
    assert len(captured) == 1


def test_applied_kwargs_match_what_the_provider_would_set():
    job = TrainingJob.model_validate(_spec(name="equivalence", nodes=2, command="python train.py"))
    kwargs = k8s_operator.build_pod_operator_kwargs(job, run_id=RUN_ID,
                                                    plan=Plan(attempt=2, exclude_nodes=["gpu-a"], resume_step=-1),
                                           namespace="team-a", kubernetes_conn_id="k8s_prod", node_rank=1,
                                           deferrable=False, settings=k8s_settings.KubernetesSettings())
    reference = KubernetesPodOperator(task_id="reference", **kwargs)
    operator = SatTrainingPodOperator(attempt=2, previous_decide_task_id="attempt_1.decide", node_rank=1)
    operator.apply_pod_kwargs(kwargs)
    for key in [*kwargs, "schedule_timeout_seconds", "_is_delete_operator_pod"]:
        assert getattr(operator, key) == getattr(reference, key), key
    built = ApiClient().sanitize_for_serialization(operator.build_pod_request_obj(dry_run=True))
    expected = ApiClient().sanitize_for_serialization(reference.build_pod_request_obj(dry_run=True))
    assert built == expected
    with pytest.raises(TypeError, match="image"):
        operator.apply_pod_kwargs({"image": "x"})


def test_deferred_reentry_rebuilds_the_pod(monkeypatch, bucket):
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "kubernetes")
    seen = []
    monkeypatch.setattr(KubernetesPodOperator, "trigger_reentry",
                        lambda self, context, event: seen.append((self.name, self.full_pod_spec, event)))
    spec = _spec(name="deferred")
    operator = SatTrainingPodOperator(attempt=1, previous_decide_task_id=None, deferrable=True)
    assert operator.deferrable is True
    operator.trigger_reentry(_context(operator, {"validate_spec": spec}), {"status": "success"})
    ((name, pod, event),) = seen
    job = TrainingJob.model_validate(spec)
    assert name == f"{k8s_names.attempt_name(job, RUN_ID, 1)}-r0" and pod.metadata.name == name
    assert event == {"status": "success"}
    assert _history(job) == []  # the start was recorded when the pod was created, not again


def test_operators_serialize_in_a_dag():
    from airflow.sdk import DAG, TaskGroup
    from airflow.serialization.serialized_objects import DagSerialization

    job = TrainingJob.model_validate(_spec(name="serialize", nodes=2, command="python train.py"))
    with DAG(dag_id="serialize", schedule=None) as dag:
        with TaskGroup(group_id="attempt_1"):
            make_launch_operators(attempt=1, previous_decide_task_id=None, job=job)
        with TaskGroup(group_id="attempt_2"):
            make_launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=job)
    assert sorted(dag.task_ids) == ["attempt_1.launch", "attempt_1.launch_rank_1", "attempt_2.launch",
                                    "attempt_2.launch_rank_1"]
    data = DagSerialization.to_dict(dag)
    tasks = {t["__var"]["task_id"]: t["__var"] for t in data["dag"]["tasks"]}
    assert tasks["attempt_2.launch_rank_1"]["task_type"] == "SatTrainingPodOperator"
    assert tasks["attempt_2.launch_rank_1"]["_task_module"] == "sat_tasks.backends.kubernetes.operator"


# ---- the attempt record -----------------------------------------------------------------------
@pytest.mark.parametrize("case", [pytest.param(c, id=c) for c in CASES])
def test_recorded_attempt(case, bucket, monkeypatch):
    data = _case(case)
    job = TrainingJob.model_validate({**data["spec"], "backend": "kubernetes"})
    cluster = RecordedCluster.from_case(FIXTURES / case)
    record = _read_record(job, data["run_id"], data["attempt"], client=cluster.client(),
                          namespace=data["namespace"], case=case)
    expected = data["expected"]
    verdict = classify(record)
    assert verdict.kind.value == expected["kind"], verdict
    joined = "\n".join(verdict.evidence)
    for needle in expected["evidence_contains"]:
        assert needle in joined, (needle, verdict)
    for needle in expected.get("evidence_excludes", []):
        assert needle not in joined, (needle, verdict)
    assert record.node == expected["node"]
    assert record.last_committed_step == expected["last_committed_step"]
    assert record.backend == "kubernetes" and record.attempt == data["attempt"] and record.job == job.name

    # Stored where the report looks for it; the classify task reads and classifies the same.
    stored = JobRun(job, data["run_id"]).load_record(data["attempt"])
    assert stored == record
    monkeypatch.setattr("sat_tasks.backends.kubernetes.client.core_v1_client", lambda *a, **k: cluster.client())
    result = steps.classify_attempt(job, data["run_id"], data["attempt"], log=lambda _m: None)
    assert result["kind"] == expected["kind"] and result["node"] == expected["node"]
    assert result["last_committed_step"] == expected["last_committed_step"]


def test_fixture_set_covers_every_verdict():
    kinds = {_case(c)["expected"]["kind"] for c in CASES}
    # SUSPECT_NODE is derived after the classifier, from the node health ledger (tests/sat_tasks/core/test_node_health.py);
    # STOPPED is a person's stop; PLANNED_RESTART is SAT's own decision to grow back (grow_verdict), never read from pods
    derived = {VerdictKind.SUSPECT_NODE.value, VerdictKind.STOPPED.value, VerdictKind.PLANNED_RESTART.value}
    assert len(CASES) >= 6 and kinds == {k.value for k in VerdictKind} - derived
    assert any(_case(c)["spec"]["nodes"] > 1 for c in CASES)


def test_record_reads_pod_events_node_and_log_through_the_api(bucket):
    data = _case("xid79-node-event")
    job = TrainingJob.model_validate(data["spec"])
    cluster = RecordedCluster.from_case(FIXTURES / "xid79-node-event")
    record = _read_record(job, data["run_id"], 1, client=cluster.client(), case="xid79-node-event")
    pod = f"{k8s_names.attempt_name(job, data['run_id'], 1)}-r0"
    gets = [(path, query) for method, path, query, _body in cluster.requests if method == "GET"]
    assert (f"/api/v1/namespaces/{NAMESPACE}/pods",
            {"labelSelector": k8s_names.attempt_label_selector(job, data["run_id"], 1)}) in gets
    assert (f"/api/v1/namespaces/{NAMESPACE}/events", {"fieldSelector": f"involvedObject.name={pod}"}) in gets
    assert ("/api/v1/namespaces/default/events",
            {"fieldSelector": "involvedObject.kind=Node,involvedObject.name=gpu-node-03"}) in gets
    assert ("/api/v1/nodes/gpu-node-03", {}) in gets
    assert (f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/log",
            {"container": "base", "tailLines": str(k8s_records.LOG_READ_LINES + 1)}) in gets
    # The stale Xid 48 event of the day before is left out; the record carries the rest.
    assert [e["reason"] for e in record.events].count("XidError") == 1
    assert record.node_conditions and record.log_tail[-1].startswith("RuntimeError: CUDA error")
    assert record.exit_code == 1 and record.image == "registry.example.com/ml/llama-train:1.4.2"
    # The Node object's labels (Spot capacity is read from them), and only its own taints.
    node = next(n for n in cluster.nodes if n["metadata"]["name"] == "gpu-node-03")
    assert record.node_labels == node["metadata"]["labels"]
    assert record.node_taints == (node.get("spec") or {}).get("taints", [])
    # The progress is the engine's own (its mirrored progress.json), never read from the log text.
    assert record.progress == json.loads((FIXTURES / "xid79-node-event" / "progress.json").read_text())
    assert record.last_committed_step == 700


def test_record_without_permission_for_node_events_or_a_node(bucket):
    data = _case("node-notready")
    job = TrainingJob.model_validate(data["spec"])
    cluster = RecordedCluster.from_case(FIXTURES / "node-notready")
    cluster.forbidden_namespaces.add("default")
    cluster.nodes.clear()
    said = []
    record = _read_record(job, data["run_id"], 2, client=cluster.client(), log=said.append)
    assert record.node == "gpu-node-12" and record.node_conditions == [] and record.node_labels == {}
    assert any("403" in line for line in said) and any("no longer exists" in line for line in said)
    assert classify(record).kind is VerdictKind.HARDWARE  # the pod's NodeNotReady event and no exit status


def test_a_lost_node_with_spot_labels_is_a_preemption(bucket):
    data = _case("node-notready")
    job = TrainingJob.model_validate(data["spec"])
    cluster = RecordedCluster.from_case(FIXTURES / "node-notready")
    node = next(n for n in cluster.nodes if n["metadata"]["name"] == "gpu-node-12")
    node["metadata"]["labels"]["karpenter.sh/capacity-type"] = "spot"
    record = _read_record(job, data["run_id"], 2, client=cluster.client(), case="node-notready")
    assert record.node_labels["karpenter.sh/capacity-type"] == "spot"
    assert not any("source" in taint for taint in record.node_taints)
    verdict = classify(record)
    assert verdict.kind is VerdictKind.PREEMPTED, verdict
    assert verdict.evidence[0] == "node label karpenter.sh/capacity-type=spot"
    # Stored and read back for the classify task with the labels.
    assert JobRun(job, data["run_id"]).load_record(2).node_labels == record.node_labels


def test_no_pod_means_the_attempt_never_launched(bucket):
    job = TrainingJob.model_validate(_spec(name="never-launched"))
    said = []
    assert _read_record(job, RUN_ID, 1, client=RecordedCluster().client(), log=said.append) is None
    assert JobRun(job, RUN_ID).load_record(1) is None
    assert "never launched" in said[0]


# ---- the job log ----------------------------------------------------------------------------------
def _isolated_job(spec: dict, test: str, **overrides) -> TrainingJob:
    """The case's job with a results prefix of its own (other tests store the same job and run)."""
    return TrainingJob.model_validate({**spec, "backend": "kubernetes", **overrides,
                                       "results": {"destination": f"s3://{BUCKET}/results-{test}/"}})


def _read_text(uri: str) -> str:
    from sat_tasks.spec import split_s3_uri

    bucket, key = split_s3_uri(uri)
    return object_storage.object_storage_hook().read_key(key, bucket_name=bucket)


def test_job_log_section_holds_every_rank_log_between_header_and_footer(bucket):
    name = "multinode-traceback-and-peer-nccl"
    data = _case(name)
    job = _isolated_job(data["spec"], "job-log-section")
    cluster = RecordedCluster.from_case(FIXTURES / name)
    _read_record(job, data["run_id"], 1, client=cluster.client())
    run = JobRun(job, data["run_id"])
    section = _read_text(run.attempt_log_uri(1)).splitlines()
    expected = []
    for rank in (0, 1):
        pod = f"{k8s_names.attempt_name(job, data['run_id'], 1)}-r{rank}"
        recorded = next(p for p in cluster.pods if p["metadata"]["name"] == pod)
        state = recorded["status"]["containerStatuses"][0]["state"]["terminated"]
        header = job_log_header(
            job=job.name, attempt=1, node=recorded["spec"]["nodeName"],
            at=parse_time(state["startedAt"]), note=f"log of pod {pod} (rank {rank}) follows")
        footer = job_log_footer(
            attempt=1, at=parse_time(state["finishedAt"]), exit_code=state["exitCode"],
            note=f"rank {rank}, pod {pod}, {recorded['status'].get('reason') or state['reason']}")
        expected += [header, *cluster.logs[pod].splitlines(), footer]
    assert section == expected
    # One start marker per pod (its own first line): the header does not repeat it.
    assert sum("Starting dataset initialization" in line for line in section) == 2
    # The run's job.log is assembled from the stored sections, uploaded with the results.
    steps.upload_job_log(run)
    assert _read_text(run.results_uri + "job.log").splitlines() == expected


def test_unreadable_pod_logs_write_a_line_and_classify_still_runs(bucket):
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import ProtocolError

    name = "multinode-xid79-rank1-and-peer-nccl"
    data = _case(name)
    job = _isolated_job(data["spec"], "unreadable")
    run_id = data["run_id"]
    client = RecordedCluster.from_case(FIXTURES / name).client()
    failures = iter([ApiException(status=404, reason="Not Found"), ProtocolError("Connection aborted.")])

    def read_log(*args, **kwargs):  # rank 0's pod was deleted, rank 1's read broke off
        raise next(failures)

    client.read_namespaced_pod_log = read_log
    said = []
    record = _read_record(job, run_id, data["attempt"], client=client, log=said.append)
    assert record is not None and record.log_tail == []
    section = _read_text(JobRun(job, run_id).attempt_log_uri(data["attempt"]))
    assert "container log not readable (404 Not Found: the pod no longer exists)" in section
    assert "container log not readable (ProtocolError: the API server did not answer)" in section
    assert section.count("] attempt 2 ended: exit status") == 2
    assert any("no container log (404 Not Found" in line for line in said)
    assert classify(record).kind


def test_a_pod_that_never_started_and_a_rank_without_pod(bucket):
    data = _case("image-pull-backoff")
    job = _isolated_job(data["spec"], "never-started", nodes=2)
    cluster = RecordedCluster.from_case(FIXTURES / "image-pull-backoff")  # rank 0 only: rank 1's pod is gone
    _read_record(job, data["run_id"], data["attempt"], client=cluster.client())
    section = _read_text(JobRun(job, data["run_id"]).attempt_log_uri(data["attempt"]))
    assert "container log not readable (400 Bad Request: the container never started)" in section
    assert f"] attempt {data['attempt']} ended: exit status unknown" in section
    assert f"[sat] attempt {data['attempt']} rank 1: no pod left to read" in section


def test_log_bounds_say_which_one_cut_the_log(bucket, monkeypatch):
    import io

    from urllib3 import HTTPResponse

    lines = [f"line {i}" for i in range(50)]
    cluster = RecordedCluster(logs={"p": "\n".join(lines)})
    said = []
    monkeypatch.setattr(k8s_records, "LOG_READ_LINES", 10)
    got = k8s_records._read_log(cluster.client(), "p", NAMESPACE, said.append)
    assert got.lines == lines[-10:] and "last 10 lines (LOG_READ_LINES)" in got.note
    assert cluster.requests[-1][2]["tailLines"] == "11"  # one more than kept: tells a cut log from a full one
    monkeypatch.setattr(k8s_records, "LOG_READ_LINES", 50)
    assert k8s_records._read_log(cluster.client(), "p", NAMESPACE, said.append) == k8s_records.PodLog(lines)

    # The byte bound keeps the newest bytes of a streamed (not preloaded) response, whole lines only.
    monkeypatch.setattr(k8s_records, "LOG_READ_BYTES", 40)
    monkeypatch.setattr(k8s_records, "_LOG_CHUNK", 16)
    body = ("\n".join(lines) + "\n").encode()
    client = SimpleNamespace(read_namespaced_pod_log=lambda *a, **k: HTTPResponse(
        body=io.BytesIO(body), preload_content=False, status=200))
    got = k8s_records._read_log(client, "p", NAMESPACE, said.append)
    assert got.lines == lines[-4:] and "last 40 bytes (LOG_READ_BYTES)" in got.note
    assert said[-1] == f"pod p: {got.note}"


def test_a_retried_classify_replaces_its_section(bucket):
    data = _case("completed")
    job = _isolated_job(data["spec"], "retried")
    run_id = data["run_id"]
    for _ in range(2):
        _read_record(job, run_id, data["attempt"], client=RecordedCluster.from_case(FIXTURES / "completed").client())
    job_log = k8s_records.assemble_job_log(JobRun(job, run_id))
    assert job_log.read_text().count("log of pod") == 1


def test_multi_node_peer_symptoms_are_what_classify_reports():
    """The peer-only reasons track classify's wording: rank 1 of case 7 is such a rank."""
    data = _case("multinode-traceback-and-peer-nccl")
    job = TrainingJob.model_validate(data["spec"])
    cluster = RecordedCluster.from_case(FIXTURES / "multinode-traceback-and-peer-nccl")
    client = cluster.client()
    pods = [ApiClient().sanitize_for_serialization(p) for p in client.list_namespaced_pod(NAMESPACE).items]
    ranks = [k8s_records._read_rank(client, p, job, 1, NAMESPACE, None, lambda _m: None)[0] for p in pods]
    verdicts = [classify(r) for r in sorted(ranks, key=lambda r: r.node)]
    assert [v.kind for v in verdicts] == [VerdictKind.INTERNAL, VerdictKind.HARDWARE]
    assert PEER_SYMPTOM_REASONS.search(verdicts[1].reason)


def _rank(node: str, exit_code: int | None, log: list[str], **fields) -> AttemptRecord:
    return AttemptRecord(job="ddp", attempt=1, backend="kubernetes", node=node, exit_code=exit_code, log_tail=log,
                         **fields)


_TRACEBACK = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "KeyError: 'labels'"]
_PEER = ["NCCL WARN NET/IB : Got completion from peer 10.0.3.23<44321> with status=12",
         "ncclRemoteError: remote process exited or there was a network error"]
_XID = ["NVRM: Xid (PCI:0000:9a:00): 79, pid=55121, name=python, GPU has fallen off the bus."]
_PREEMPTED = {"pod_conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}
_IMAGE = {"container_states": [{"name": "base", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
_TORCHRUN_SIGTERMED = ["torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15"]
_STOPPED_FOR_PEER = ["[Concurrent Checkpoint] another rank received SIGTERM: finishing the in-flight checkpoint",
                     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                     "  exitcode  : 143 (pid: 9)"]


@pytest.mark.parametrize(("ranks", "chosen", "kind"), [
    pytest.param([("n0", 1, _TRACEBACK, {}), ("n1", 1, _PEER, {})], "n0", "INTERNAL", id="own-error-beats-peer"),
    pytest.param([("n0", 1, _PEER + _TRACEBACK, {}), ("n1", 1, _XID, {})], "n1", "HARDWARE", id="hardware-rank"),
    pytest.param([("n0", 1, _TRACEBACK, {}), ("n1", 1, _XID, {})], "n1", "HARDWARE", id="hardware-beats-internal"),
    pytest.param([("n0", 1, _XID, {}), ("n1", 143, [], _PREEMPTED)], "n1", "PREEMPTED", id="preemption-first"),
    pytest.param([("n0", 1, _PEER, {}), ("n1", None, [], _IMAGE)], "n1", "IMAGE_PULL", id="image-beats-peer"),
    pytest.param([("n0", 1, _PEER, {}), ("n1", 137, [], {})], "n0", "HARDWARE", id="only-peer-symptoms"),
    # an outside SIGTERM with no fault evidence is an interruption, resumed without blame (issue 43, ADR 0004)
    pytest.param([("n0", 1, _STOPPED_FOR_PEER, {}), ("n1", 1, _TORCHRUN_SIGTERMED, {})], "n1", "PREEMPTED",
                 id="the-rank-that-got-sigterm-before-its-peer"),
    pytest.param([("n0", 0, [], {}), ("n1", 0, [], {})], "n0", "SUCCEEDED", id="all-succeeded"),
    pytest.param([("n0", 0, [], {}), ("n1", 1, _TRACEBACK, {})], "n1", "INTERNAL", id="one-rank-failed"),
])
def test_combined_record_of_a_multi_node_attempt(ranks, chosen, kind):
    records = [_rank(node, code, log, **fields) for node, code, log, fields in ranks]
    record = combine_rank_records(records, log=lambda _m: None)
    assert record.node == chosen and classify(record).kind.value == kind


def test_combined_progress_is_the_step_every_rank_committed():
    records = [_rank("n0", 1, _TRACEBACK, progress={"last_committed_step": 300, "resumed_from_step": 100}),
               _rank("n1", 1, _PEER, progress={"last_committed_step": 200}),
               _rank("n2", 1, _PEER)]
    record = combine_rank_records(records, log=lambda _m: None)
    assert record.node == "n0" and record.progress == {"last_committed_step": 200, "resumed_from_step": 100}


@pytest.mark.parametrize(("progress", "expected"), [
    pytest.param(None, None, id="none-yet"),
    pytest.param({"step": 80, "last_committed_step": 60, "resumed_from_step": 40, "attempt": 2},
                 {"step": 80, "last_committed_step": 60, "resumed_from_step": 40, "attempt": 2}, id="this-attempt"),
    pytest.param({"step": 80, "last_committed_step": 60, "committed_steps": [60, 40], "resumed_from_step": 40,
                  "in_flight_step": 80, "attempt": 1},
                 {"last_committed_step": 60, "committed_steps": [60, 40]}, id="an-earlier-attempt-keeps-its-commits"),
    pytest.param({"step": 80, "last_committed_step": 60}, {"step": 80, "last_committed_step": 60}, id="no-stamp"),
])
def test_progress_of_an_attempt(progress, expected):
    from sat_tasks.core.attempt import progress_of_attempt

    assert progress_of_attempt(progress, 2) == expected


def test_record_of_an_attempt_that_wrote_no_progress_keeps_the_earlier_commits(bucket):
    data = _case("oomkilled")
    job = _isolated_job(data["spec"], "stale-progress")
    earlier = {"step": 90, "last_committed_step": 60, "resumed_from_step": 20, "attempt": data["attempt"] - 1
               if data["attempt"] > 1 else 0}
    object_storage.write_json(JobRun(job, data["run_id"]).hook(), JobRun(job, data["run_id"]).progress_uri, earlier)
    record = _read_record(job, data["run_id"], data["attempt"], client=RecordedCluster.from_case(FIXTURES / "oomkilled").client())
    assert record.progress == {"last_committed_step": 60} and record.last_committed_step == 60


# ---- cleanup ----------------------------------------------------------------------------------
def test_cleanup_deletes_only_the_attempts_pods_and_service():
    data = _case("multinode-traceback-and-peer-nccl")
    job = TrainingJob.model_validate(data["spec"])
    attempt_1 = k8s_pods.render_attempt_manifests(job, run_id=data["run_id"], plan=Plan(attempt=1), namespace=NAMESPACE,
                                             settings=k8s_settings.KubernetesSettings())
    attempt_2 = k8s_pods.render_attempt_manifests(job, run_id=data["run_id"], plan=Plan(attempt=2), namespace=NAMESPACE,
                                             settings=k8s_settings.KubernetesSettings())
    # [Service, NetworkPolicy, Pod...] each (the ranks' own policy, ADR 0040)
    cluster = RecordedCluster(pods=attempt_1[2:] + attempt_2[2:], services=[attempt_1[0], attempt_2[0]])
    cluster.network_policies += [attempt_1[1], attempt_2[1]]
    deleted = k8s_cleanup.cleanup_attempt(cluster.client(), job, run_id=data["run_id"], attempt=1, namespace=NAMESPACE)
    assert deleted == [f"pod/{p['metadata']['name']}" for p in attempt_1[2:]] + [
        f"service/{attempt_1[0]['metadata']['name']}", f"networkpolicy/{attempt_1[1]['metadata']['name']}"]
    assert [p["metadata"]["name"] for p in cluster.pods] == [p["metadata"]["name"] for p in attempt_2[2:]]
    assert [s["metadata"]["name"] for s in cluster.services] == [attempt_2[0]["metadata"]["name"]]
    assert cluster.network_policies == [attempt_2[1]]
    # Idempotent: a second cleanup finds nothing.
    assert k8s_cleanup.cleanup_attempt(cluster.client(), job, run_id=data["run_id"], attempt=1,
                                       namespace=NAMESPACE) == []


# ---- a live cluster ---------------------------------------------------------------------------
@pytest.mark.k8s
def test_record_and_cleanup_of_a_live_pod(bucket):  # pragma: no cover - needs KUBECONFIG
    """Run a tiny pod as attempt 1 (busybox, exit 3), read its record, classify, clean up."""
    import time

    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    kconfig.load_kube_config(os.environ["KUBECONFIG"])
    api = kclient.CoreV1Api()
    namespace = os.environ.get("SAT_TEST_NAMESPACE", "default")
    job = TrainingJob.model_validate(_spec(name="live-record", resources={
        "gpus_per_node": 0, "server_type": "cpu", "memory": "64Mi", "shared_memory": "16Mi", "cpu": "100m"},
        image={"url": "busybox:1.36"}, command="echo Traceback; echo 'ValueError: bad' ; exit 3"))
    pod = ApiClient().sanitize_for_serialization(k8s_pods.build_attempt_pods(job, run_id=RUN_ID, plan=Plan(attempt=1),
                                                                        namespace=namespace)[0])
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if v["name"] != "run"]
    container = pod["spec"]["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "run"]
    container["command"] = ["sh", "-c", job.command]
    api.create_namespaced_pod(namespace, pod)
    try:
        for _ in range(120):
            phase = api.read_namespaced_pod(pod["metadata"]["name"], namespace).status.phase
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        record = _read_record(job, RUN_ID, 1, client=api, namespace=namespace)
        assert record.exit_code == 3 and classify(record).kind is VerdictKind.INTERNAL
    finally:
        assert k8s_cleanup.cleanup_attempt(api, job, run_id=RUN_ID, attempt=1, namespace=namespace)


# ---- the wiring, end to end with dag.test() ---------------------------------------------------
class _ClusterRun:
    """Stands in for the provider's execute: the pod "runs" as a recorded case, left in the cluster."""

    def __init__(self, cluster: RecordedCluster, cases: dict[int, str]):
        self.cluster, self.cases, self.pods = cluster, cases, {}

    def execute(self, operator, context):
        from airflow.sdk.exceptions import AirflowException

        pod = ApiClient().sanitize_for_serialization(operator.build_pod_request_obj(context, dry_run=True))
        self.pods[operator.attempt] = pod
        case = RecordedCluster.from_case(FIXTURES / self.cases[operator.attempt])
        (recorded,) = case.pods
        name = pod["metadata"]["name"]
        pod["spec"]["nodeName"] = recorded["spec"]["nodeName"]
        self.cluster.pods.append({**pod, "status": recorded["status"]})
        for event in case.events:
            if event["involvedObject"]["kind"] == "Pod":
                event = {**event, "involvedObject": {**event["involvedObject"], "name": name}}
            self.cluster.events.append(event)
        self.cluster.nodes += [n for n in case.nodes if n not in self.cluster.nodes]
        self.cluster.logs[name] = next(iter(case.logs.values()), "")
        spec = context["ti"].xcom_pull(task_ids="validate_spec")
        _mirror_progress(self.cases[operator.attempt], TrainingJob.model_validate(spec), context["run_id"])
        if recorded["status"]["phase"] != "Succeeded":
            raise AirflowException(f"Pod {name} returned a failure.")


def test_dag_with_kubernetes_attempts_fails_over_and_completes(airflow_db, bucket, monkeypatch):
    """The wiring of fixtures/k8s_launch/dags: launch -> classify (reads the record) -> decide, cleanup."""
    import importlib.util

    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    folder = FIXTURES / "dags"
    # The DAG lives in its own bundle next to the project's dags-folder (dag.test() runs bundled DAGs).
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": local, "kwargs": {}},
        {"name": "sat-k8s-launch-tests", "classpath": local, "kwargs": {"path": str(folder)}},
    ]))
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "kubernetes")
    cluster = RecordedCluster()
    run = _ClusterRun(cluster, {1: "xid79-node-event", 2: "completed"})
    monkeypatch.setattr(KubernetesPodOperator, "execute", lambda self, context: run.execute(self, context))
    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(lambda self: cluster.client()))
    module_spec = importlib.util.spec_from_file_location("wired_k8s_job", folder / "wired_k8s_job.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)

    dag_run = module.dag.test()
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["attempt_1.launch"] == "failed" and states["attempt_1.classify"] == "success"
    assert states["attempt_2.launch"] == "success" and states["attempt_2.decide"] == "success"
    assert states["attempt_1.cleanup"] == "success" and states["attempt_2.cleanup"] == "success"

    job = TrainingJob.model_validate(module.SPEC)
    assert _excluded(run.pods[2]) == ["gpu-node-03"]
    assert _env(run.pods[2])["CKPT_LAST_STEP"] == "700"
    job_run = JobRun(job, dag_run.run_id)
    history = job_run.history(lambda _m: None).entries()
    assert [e["status"] for e in history] == ["Running", "Pending - failoverinprogress", "Running"]
    verdicts = [object_storage.read_json(job_run.hook(), job_run.verdict_uri(k)) for k in (1, 2)]
    assert [v["kind"] for v in verdicts] == ["HARDWARE", "SUCCEEDED"]
    assert cluster.pods == []  # both attempts cleaned up
    # The job log: both attempts' sections, in order, uploaded with the results.
    steps.upload_job_log(job_run)
    job_log = _read_text(job_run.results_uri + "job.log")
    sections = [line for line in job_log.splitlines() if "[sat] attempt" in line and ("follows" in line or "ended" in line)]
    # The attempt number from the marker itself: a pod name's run hash may hold "a1" by chance.
    marks = [(re.search(r"\[sat\] attempt (\d+)", line).group(1), "ended" in line) for line in sections]
    assert marks == [("1", False), ("1", True), ("2", False), ("2", True)]
    assert all(f"-a{n}-r0" in line for (n, _), line in zip(marks, sections, strict=True))
    # SAT's verdict on each attempt follows its end line (issue 45.6).
    lines = job_log.splitlines()
    ends = [i for i, line in enumerate(lines) if "[sat] attempt" in line and "ended" in line]
    assert [lines[i + 1].split(" [sat] ", 1)[1].split(":")[:2] for i in ends] == [
        ["verdict on attempt 1", " HARDWARE"], ["verdict on attempt 2", " SUCCEEDED"]]
    assert lines[ends[0] + 1].endswith("(exit status 1)")
    assert "RuntimeError: CUDA error" in job_log
