"""An elastic job's failover on Kubernetes resumes on fewer nodes when no spare is healthy (issue 32, ADR 0029).

Rendering: the attempt's pods, its rendezvous Service and the Kueue pod group for K ranks
(schema-validated as the other rendering tests). The launch path: each rank's launch
operator, the provider's own `execute` included, against the real `CoreV1Api` over the
in-memory API server (`tests.support.k8s_api`), here also listing the cluster's nodes and
pods (what the capacity check reads); the status history in Object Storage.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.sdk import DAG, TaskGroup
from airflow.sdk.exceptions import AirflowFailException

from ckpt_engine.integrations.elastic import ACCUMULATION_SCALE_ENV
from sat_tasks.backends.kubernetes import KubernetesBackend
from sat_tasks.backends.kubernetes import elastic as k8s_elastic
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import pods as k8s_pods
from sat_tasks.backends.kubernetes import records as k8s_records
from sat_tasks.backends.kubernetes.operator import make_launch_operators
from sat_tasks.backends.kubernetes.settings import KubernetesSettings
from sat_tasks.core.handoffs import Action, Decision, Plan
from sat_tasks.core.status import JobStatus
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob, parse_spec
from tests.sat_tasks.workspaces.conftest import job_spec
from tests.support.k8s_api import RecordedCluster, _Response

BUCKET = "sat-elastic-k8s"
NAMESPACE = "sat-jobs"
RUN_ID = "manual__2026-12-02T08:00:00+00:00"
SETTINGS = KubernetesSettings()
K8S_VERSION = "1.37.0"  # as test_pods.py


def _job(nodes: int = 2, min_nodes: int = 1, wait_seconds: int = 0, **overrides) -> TrainingJob:
    spec = {
        "name": f"elastic-{nodes}", "learning_type": "on-demand", "framework": "pytorch", "job_failover": True,
        "nodes": nodes, "elastic": {"min_nodes": min_nodes, "wait_seconds": wait_seconds},
        "command": "python train.py", "backend": "kubernetes",
        "resources": {"gpus_per_node": 0, "server_type": "cpu", "memory": "8Gi", "shared_memory": "1Gi", "cpu": "2"},
        "image": {"url": "registry.example.com/ml/train:1.0", "registry_conn_id": "sat_registry_main"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
    }
    spec.update(overrides)
    return parse_spec(spec)


def _failover(attempt: int = 2, exclude: tuple[str, ...] = ("node-b",), resume_step: int = 40) -> Plan:
    return Plan(attempt=attempt, exclude_nodes=list(exclude), resume_step=resume_step, failovers=attempt - 1)


def _env(pod: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def _node(name: str, ready: bool = True) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110"}}}


class Cluster(RecordedCluster):
    """The in-memory API server, also answering the cluster-wide lists the capacity check makes."""

    def request(self, method, url, fields=None, body=None, headers=None, **kwargs):
        path = url.split("?")[0].split("k8s.test", 1)[-1]
        if method == "GET" and path == "/api/v1/nodes":
            self.requests.append((method, path, {}, None))
            return _Response(200, json.dumps({"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                                              "items": self.nodes}))
        if method == "GET" and path == "/api/v1/pods":
            self.requests.append((method, path, {}, None))
            running = [p for p in self.pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            return _Response(200, json.dumps({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                                              "items": running}))
        return super().request(method, url, fields=fields, body=body, headers=headers, **kwargs)


def _validate(manifest: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


# ---- rendering ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("nodes", "ranks"), [(2, 1), (4, 2), (4, 1)])
def test_a_failover_on_fewer_nodes_renders_that_many_ranks_and_keeps_the_global_batch(nodes, ranks):
    job = _job(nodes)
    manifests = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=_failover(), namespace=NAMESPACE,
                                                  settings=SETTINGS, ranks=ranks)
    for manifest in manifests:
        _validate(manifest)
    service, policy, *pods = manifests
    assert service["kind"] == "Service" and [p["kind"] for p in pods] == ["Pod"] * ranks
    assert policy["kind"] == "NetworkPolicy"  # the ranks reach one another (ADR 0040)
    assert service["metadata"]["annotations"][k8s_names.ANNOTATION_RANKS] == str(ranks)
    assert [p["metadata"]["name"] for p in pods] == [k8s_names.pod_name(job, RUN_ID, 2, r) for r in range(ranks)]
    master = f"{service['metadata']['name']}-r0.{service['metadata']['name']}.{NAMESPACE}.svc"
    for rank, pod in enumerate(pods):
        env = _env(pod)
        assert env["NNODES"] == env["PET_NNODES"] == env["SAT_NODES"] == str(ranks)
        assert env["NODE_RANK"] == str(rank) and env["MASTER_ADDR"] == master
        assert env[ACCUMULATION_SCALE_ENV] == str(nodes // ranks)
        assert env["CKPT_LAST_STEP"] == "40"
        assert pod["metadata"]["annotations"][k8s_names.ANNOTATION_RANKS] == str(ranks)
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
        assert "--nnodes=\"$NNODES\"" in pod["spec"]["containers"][0]["command"][-1]
        hosts = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-b"]} in \
            hosts["nodeSelectorTerms"][0]["matchExpressions"]


def test_all_ranks_render_as_before_without_a_scale():
    job = _job(2)
    service, _policy, *pods = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=_failover(), settings=SETTINGS)
    assert len(pods) == 2 and service["metadata"]["annotations"][k8s_names.ANNOTATION_RANKS] == "2"
    for pod in pods:
        assert ACCUMULATION_SCALE_ENV not in _env(pod) and _env(pod)["NNODES"] == "2"
        assert k8s_names.ANNOTATION_RANKS not in pod["metadata"]["annotations"]


@pytest.mark.parametrize("ranks", [0, 3, 5])
def test_a_rank_count_that_does_not_divide_the_nodes_is_refused(ranks):
    with pytest.raises(ValueError, match=r"ranks: must divide nodes \(4\)"):
        k8s_pods.render_attempt_manifests(_job(4), run_id=RUN_ID, plan=_failover(), settings=SETTINGS, ranks=ranks)


def test_kueue_admits_the_pod_group_of_the_ranks_that_run(monkeypatch):
    job = parse_spec(job_spec(nodes=4, elastic={"min_nodes": 1, "wait_seconds": 0}, job_failover=True))
    pods = k8s_pods.attempt_pod_manifests(job, run_id=RUN_ID, plan=_failover(),
                                          settings=KubernetesSettings(kueue=True), ranks=2)
    assert [p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] for p in pods] == ["2", "2"]


# ---- the workspace pool's slots ------------------------------------------------------------------
def test_an_elastic_attempt_holds_a_slot_per_rank_it_runs(monkeypatch):
    monkeypatch.delenv("AIRFLOW__SAT__K8S_KUEUE", raising=False)
    job = parse_spec(job_spec(nodes=4, elastic={"min_nodes": 2, "wait_seconds": 0}, job_failover=True))

    def slots(attempt: int) -> list[tuple[str | None, int]]:
        with DAG(dag_id=f"ws-elastic-{attempt}", schedule=None), TaskGroup(f"attempt_{attempt}"):
            operators = KubernetesBackend().launch_operators(attempt=attempt, previous_decide_task_id=None, job=job)
        return [(op.pool if op.pool.startswith("sat-workspace-") else None, op.pool_slots) for op in operators]

    pool = "sat-workspace-team-a"
    assert slots(1) == [(pool, 4), (None, 1), (None, 1), (None, 1)]  # the first attempt never shrinks
    assert slots(2) == [(pool, 2), (None, 1), (pool, 1), (pool, 1)]  # min_nodes on rank 0, then one per rank
    # Rank 0 counts the ranks whose tasks hold their slot, in order: a queued rank ends the count.
    assert k8s_elastic.ranks_with_slots({2: "running", 3: "running"}, job) == 4
    assert k8s_elastic.ranks_with_slots({2: "running", 3: "scheduled"}, job) == 3
    assert k8s_elastic.ranks_with_slots({2: "queued", 3: "running"}, job) == 2


# ---- the launch path against the recorded API ---------------------------------------------------
class _TI:
    def __init__(self, task_id: str, xcoms: dict, states: dict | None = None):
        self.dag_id, self.task_id, self.map_index, self.try_number = "elastic-job", task_id, -1, 1
        self._xcoms, self.states, self.pushed = xcoms, states or {}, {}

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self._xcoms.get(task_ids)

    def xcom_push(self, key, value):
        self.pushed[key] = value

    def get_task_states(self, dag_id, task_ids=None, run_ids=None, **kwargs):
        return {RUN_ID: {t: self.states[t] for t in task_ids or () if t in self.states}}


@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


@pytest.fixture
def launch_env(monkeypatch, bucket):
    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "off")
    monkeypatch.setenv("AIRFLOW__SAT__KUBERNETES_NAMESPACE", NAMESPACE)
    monkeypatch.setattr(KubernetesSettings, "from_sat_config", classmethod(lambda cls: KubernetesSettings()))


def _launch(cluster: Cluster, job: TrainingJob, plan: Plan, monkeypatch) -> list[_TI]:
    """Attempt `plan.attempt`'s launch tasks, rank 0 first, with the decision that asked for it."""
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    decision = Decision(attempt=plan.attempt - 1, verdict="HARDWARE", action=Action.FAILOVER, why="test",
                        exclude_nodes=plan.exclude_nodes, failovers=plan.failovers,
                        resume_step=plan.resume_step).to_xcom()
    xcoms = {"validate_spec": job.to_dict(), f"attempt_{plan.attempt - 1}.decide": decision}
    tis = []
    for operator in make_launch_operators(attempt=plan.attempt, previous_decide_task_id=f"attempt_{plan.attempt - 1}.decide",
                                          job=job, namespace=NAMESPACE):
        ti = _TI(operator.task_id, xcoms)
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
        tis.append(ti)
    return tis


def _history(job: TrainingJob) -> list[dict]:
    return [e for e in JobRun(job, RUN_ID).history(lambda _m: None).entries() if e.get("attempt") == 2]


def test_a_failover_with_no_spare_resumes_on_the_healthy_node_and_cleanup_removes_it(launch_env, monkeypatch):
    job = _job(2, name="elastic-shrinks")
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b")], kubelet=lambda pod: (0, "trained\n"))
    tis = _launch(cluster, job, _failover(), monkeypatch)

    # Rank 0 decided: the rendezvous Service first, saying 1 rank, then rank 0's pod; rank 1 created nothing.
    created = [(kind, body) for kind, body in cluster.created if kind in ("Service", "Pod")]
    assert [kind for kind, _ in created] == ["Service", "Pod"]
    service, pod = created[0][1], created[1][1]
    assert service["metadata"]["annotations"][k8s_names.ANNOTATION_RANKS] == "1"
    assert pod["metadata"]["name"] == k8s_names.pod_name(job, RUN_ID, 2, 0)
    env = _env(pod)
    assert (env["NNODES"], env[ACCUMULATION_SCALE_ENV], env["CKPT_LAST_STEP"]) == ("1", "2", "40")
    assert "pod_name" in tis[0].pushed and "pod_name" not in tis[1].pushed

    # The status history: the wait for 2 healthy nodes, then Running "resumed on 1 of 2 nodes" in the local words.
    entries = _history(job)
    assert [e["status"] for e in entries] == [JobStatus.FAILOVER_IN_PROGRESS.value, JobStatus.RUNNING.value]
    assert "waits up to 0s (elastic.wait_seconds) for 2 healthy nodes (excluded: node-b)" in entries[0]["reason"]
    assert entries[1]["reason"] == (
        f"attempt 2 started on {pod['metadata']['name']}; resumed on 1 of 2 nodes (node-b excluded: HARDWARE); "
        "gradient accumulation x2 keeps the global batch")

    # The record lists the rank that ran, and no rank is missing; cleanup deletes the pod and the Service.
    record = k8s_records.read_attempt_record(JobRun(job, RUN_ID), 2, client=cluster.client(), namespace=NAMESPACE,
                                             log=lambda _m: None)
    assert record.nodes == ["node-1"]
    section = (JobRun(job, RUN_ID).run_dir / "attempts" / "attempt-2.log").read_text()
    assert "no pod left to read" not in section
    deleted = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE).cleanup_attempt(
        JobRun(job, RUN_ID), 2, lambda _m: None)
    assert sorted(deleted) == sorted([f"pod/{pod['metadata']['name']}", f"service/{service['metadata']['name']}",
                                      f"networkpolicy/{service['metadata']['name']}"])
    assert cluster.services == [] and cluster.pods == []


def test_a_rank_the_decision_leaves_out_reads_it_from_the_service_even_after_its_rank_0_ran_again(launch_env,
                                                                                                   monkeypatch):
    """A decision the Service holds stands: rank 0 run again (an interrupted task) does not decide anew."""
    job = _job(2, name="elastic-decided")
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b"), _node("node-c")], kubelet=lambda pod: (0, "ok\n"))
    cluster.services.append(k8s_pods.rendezvous_service(job, run_id=RUN_ID, attempt=2, namespace=NAMESPACE,
                                                        settings=SETTINGS, ranks=1))
    _launch(cluster, job, _failover(), monkeypatch)
    assert [kind for kind, _ in cluster.created if kind in ("Service", "Pod")] == ["Pod"]
    assert not any(path == "/api/v1/nodes" for _, path, _, _ in cluster.requests)  # no capacity check again


def test_a_deferred_rank_0_rebuilds_its_pod_for_the_ranks_its_service_says(launch_env, monkeypatch):
    """The provider resumes a deferred task in a freshly parsed operator (`trigger_reentry` -> `prepare`)."""
    job = _job(4, name="elastic-reentry")
    cluster = Cluster()
    cluster.services.append(k8s_pods.rendezvous_service(job, run_id=RUN_ID, attempt=2, namespace=NAMESPACE,
                                                        settings=SETTINGS, ranks=2))
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    rank1 = make_launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=job,
                                  namespace=NAMESPACE)[1]
    decision = Decision(attempt=1, verdict="HARDWARE", action=Action.FAILOVER, why="test", exclude_nodes=["node-b"],
                        failovers=1, resume_step=40).to_xcom()
    ti = _TI(rank1.task_id, {"validate_spec": job.to_dict(), "attempt_1.decide": decision})
    rank1.prepare({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
    env = {e.name: e.value for e in rank1.full_pod_spec.spec.containers[0].env}
    assert (env["NNODES"], env["NODE_RANK"], env[ACCUMULATION_SCALE_ENV]) == ("2", "1", "2")


def test_the_first_attempt_of_an_elastic_job_runs_every_rank_without_asking(launch_env, monkeypatch):
    job = _job(2, name="elastic-first")
    cluster = Cluster(nodes=[_node("node-a")], kubelet=lambda pod: (0, "ok\n"))
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    for operator in make_launch_operators(attempt=1, previous_decide_task_id=None, job=job, namespace=NAMESPACE):
        ti = _TI(operator.task_id, {"validate_spec": job.to_dict()})
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
    assert [kind for kind, _ in cluster.created if kind in ("Service", "Pod")] == ["Service", "Pod", "Pod"]
    assert not any(path == "/api/v1/nodes" for _, path, _, _ in cluster.requests)


def test_capacity_back_within_the_wait_keeps_every_rank(monkeypatch):
    job = _job(2, wait_seconds=60)
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b"), _node("node-c", ready=False)])
    clock = SimpleNamespace(now=0.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds
        cluster.nodes[2] = _node("node-c")  # a node comes back during the wait

    history = _History()
    placement = k8s_elastic.place_elastic(job, RUN_ID, _failover(), client=cluster.client(), history=history,
                                          sleep=sleep, clock=lambda: clock.now, log=lambda _m: None)
    assert placement == k8s_elastic.ElasticPlacement(2, "")
    assert [status for status, _ in history.entries] == [JobStatus.FAILOVER_IN_PROGRESS]
    assert clock.now == k8s_elastic.POLL_SECONDS


def test_no_count_that_divides_the_nodes_waits_for_all_of_them(monkeypatch):
    job = _job(4, min_nodes=3)
    cluster = Cluster(nodes=[_node(n) for n in ("node-a", "node-b", "node-c", "node-d")])
    history = _History()
    placement = k8s_elastic.place_elastic(job, RUN_ID, _failover(), client=cluster.client(), history=history,
                                          log=lambda _m: None)
    assert placement == k8s_elastic.ElasticPlacement(4, "")
    assert history.entries[-1][1] == (
        "elastic: refused to resume on 3 of 4 nodes: no count from 3 to 3 divides 4, so the gradient accumulation "
        "could not keep the global batch; waiting for 4 node(s) as a job without elastic would")


def test_a_quarantined_node_is_left_out_and_named(monkeypatch):
    job = _job(4, min_nodes=1)
    cluster = Cluster(nodes=[_node(n) for n in ("node-a", "node-b", "node-c", "node-d")])
    placement = k8s_elastic.place_elastic(job, RUN_ID, _failover(), client=cluster.client(), history=_History(),
                                          quarantined=["node-d"], log=lambda _m: None)
    assert placement == (2, ("resumed on 2 of 4 nodes (node-b excluded: HARDWARE, node-d excluded: quarantined by "
                             "the node health ledger); gradient accumulation x2 keeps the global batch"))


def test_rank_0_counts_only_the_ranks_holding_their_pool_slots(monkeypatch):
    """Both nodes fit, but rank 1 is still queued in the workspace pool: the attempt runs on rank 0 alone."""
    job = _job(2)
    cluster = Cluster(nodes=[_node("node-a"), _node("node-c")])
    placement = k8s_elastic.place_elastic(job, RUN_ID, _failover(), client=cluster.client(), history=_History(),
                                          slots=lambda: 1, log=lambda _m: None)
    assert placement.ranks == 1 and re.match(r"resumed on 1 of 2 nodes", placement.note)


def test_a_rank_gives_up_when_rank_0_ended_without_deciding():
    job = _job(2)
    cluster = Cluster()
    with pytest.raises(k8s_elastic.RanksUndecided, match=r"rank 0's task ended \(failed\) without deciding"):
        k8s_elastic.await_attempt_ranks(cluster.client(), NAMESPACE, job, RUN_ID, 2, node_rank=1, deadline_seconds=60,
                                        rank0_ended=lambda: "failed", sleep=lambda _s: None, clock=lambda: 0.0,
                                        log=lambda _m: None)


def test_a_rank_fails_its_task_when_rank_0_never_decides(launch_env, monkeypatch):
    job = _job(2, name="elastic-undecided")
    cluster = Cluster(nodes=[_node("node-a")])
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "0")
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    (_, rank1) = make_launch_operators(attempt=2, previous_decide_task_id="attempt_1.decide", job=job,
                                       namespace=NAMESPACE)
    decision = Decision(attempt=1, verdict="HARDWARE", action=Action.FAILOVER, why="test", exclude_nodes=["node-b"],
                        failovers=1).to_xcom()
    ti = _TI(rank1.task_id, {"validate_spec": job.to_dict(), "attempt_1.decide": decision})
    with pytest.raises(AirflowFailException, match="rank 1 gave up after 0s"):
        rank1.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
    assert cluster.created == []


class _History:
    """A StatusHistory stand-in that keeps (status, reason)."""

    def __init__(self):
        self.entries: list[tuple[JobStatus, str]] = []

    def record(self, status, reason, **kwargs):
        self.entries.append((status, reason))


# ---- growing back ------------------------------------------------------------------------------
def test_only_an_attempt_on_fewer_ranks_watches_its_annotations(tmp_path):
    """The downward API file its PID 1 reads (schema-valid); an attempt on every node has neither."""
    job = _job(2)
    _, _, shrunk = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=_failover(), namespace=NAMESPACE,
                                                  settings=SETTINGS, ranks=1)
    _validate(shrunk)
    assert _env(shrunk)["SAT_POD_ANNOTATIONS"] == "/etc/sat-pod/annotations"
    assert {"name": "sat-pod-info", "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}} in shrunk["spec"]["volumes"]
    assert {"mountPath": "/etc/sat-pod", "name": "sat-pod-info", "readOnly": True} in \
        shrunk["spec"]["containers"][0]["volumeMounts"]
    _, _, *full = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=_failover(), settings=SETTINGS)
    for pod in full:
        assert "SAT_POD_ANNOTATIONS" not in _env(pod)
        assert not [v for v in pod["spec"]["volumes"] if v["name"] == "sat-pod-info"]


def test_pid_1_stops_the_command_for_its_final_checkpoint_when_the_annotation_comes(tmp_path):
    """The supervisor as rendered for a shrunk attempt, run here with bash: the annotation file as the kubelet writes
    it (`key="value"` lines); the command gets SIGTERM, saves, and the pod ends 143 (never a success)."""
    import os
    import subprocess
    import sys
    import time

    job = _job(2)
    _, _, pod = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=_failover(), namespace=NAMESPACE,
                                               settings=SETTINGS, ranks=1)
    script = pod["spec"]["containers"][0]["command"][2]
    annotations = tmp_path / "annotations"
    annotations.write_text('sat.ai/ranks="1"\nsat.ai/planned-restart-not="x"\n')  # a near miss: not the key
    trainer = tmp_path / "train.py"
    trainer.write_text("import signal, sys, time\n"
                       "def stop(*_):\n    print('final checkpoint saved', flush=True); sys.exit(0)\n"
                       "signal.signal(signal.SIGTERM, stop)\nprint('training', flush=True)\ntime.sleep(120)\n")
    env = {**os.environ, "SAT_CODE_DIR": str(tmp_path), "SAT_ATTEMPT": "2", "SAT_JOB_NAME": job.name,
           "SAT_NODE": "node-a", "SAT_POD_ANNOTATIONS": str(annotations), "NODE_RANK": "0",
           "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.Popen(["bash", "-c", script, "sat-launch", f"{sys.executable} {trainer}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout.readline() and "training" in proc.stdout.readline()
        time.sleep(7)  # more than one look of PID 1's watch: the near miss does not stop it
        assert proc.poll() is None
        annotations.write_text('sat.ai/planned-restart="planned restart to grow back from 1 to 2 of 2 nodes"\n'
                               'sat.ai/ranks="1"\n')
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "[sat] elastic: this pod's sat.ai/planned-restart annotation is set" in out
    assert "final checkpoint saved" in out and proc.returncode == 143


def _running_shrunk_attempt(cluster: Cluster, job: TrainingJob, plan: Plan, node: str = "node-a") -> dict:
    """Attempt `plan.attempt` on 1 of 2 ranks, its pod training on `node` (its start recorded as the launch does)."""
    service, _policy, pod = k8s_pods.render_attempt_manifests(job, run_id=RUN_ID, plan=plan, namespace=NAMESPACE,
                                                     settings=SETTINGS, ranks=1)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "startTime": "2026-12-02T08:00:00Z", "containerStatuses": [
        {"name": "base", "ready": True, "started": True, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"running": {"startedAt": "2026-12-02T08:00:00Z"}}}]}
    cluster.services.append(service)
    cluster.pods.append(pod)
    JobRun(job, RUN_ID).record_attempt_start(plan, lambda _m: None, where=pod["metadata"]["name"], nodes_held=1)
    return pod


def test_a_shrunk_attempt_grows_back_once_the_excluded_node_is_released(launch_env, monkeypatch):
    """Issue 32 on Kubernetes: the watch asks while the attempt trains on 1 of 2 nodes; nothing while node-b stays
    excluded; once a person releases it in the ledger the pods are asked to stop, and classify and decide
    take over as on the local backend (a planned restart: no failover spent, node-b placed again)."""
    from sat_tasks.io.node_ledger import NodeLedger
    from sat_tasks.pipeline import steps

    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", f"s3://{BUCKET}/_node-health/")
    job = _job(2, name="elastic-grows")
    plan = _failover()
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b")])
    pod = _running_shrunk_attempt(cluster, job, plan)
    run = JobRun(job, RUN_ID)
    backend = KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)
    said: list[str] = []

    assert backend.watch_growth(run, plan, said.append) is False  # node-a is the attempt's, node-b excluded
    assert not [r for r in cluster.requests if r[0] == "PATCH"]

    NodeLedger.for_job(job, run.hook()).release("node-b", by="ops", note="GPU replaced")
    assert backend.watch_growth(run, plan, said.append) is True
    why = "planned restart to grow back from 1 to 2 of 2 nodes: capacity is back (node-b released)"
    assert pod["metadata"]["annotations"][k8s_names.ANNOTATION_PLANNED_RESTART] == why
    assert pod["metadata"]["annotations"][k8s_names.ANNOTATION_READMITTED] == "node-b"
    assert any("asked the 1 pod(s) of attempt 2 to stop at their final checkpoint" in line for line in said)
    patches = len([r for r in cluster.requests if r[0] == "PATCH"])
    assert backend.watch_growth(run, plan, said.append) is True  # asked once
    assert len([r for r in cluster.requests if r[0] == "PATCH"]) == patches

    # PID 1 stopped the command at its final checkpoint: the pod ended 143, kept for classify.
    pod["status"] = {"phase": "Failed", "startTime": "2026-12-02T08:00:00Z", "containerStatuses": [
        {"name": "base", "ready": False, "started": False, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": "2026-12-02T08:00:00Z",
                                  "finishedAt": "2026-12-02T08:10:00Z"}}}]}
    cluster.logs[pod["metadata"]["name"]] = ("[sat] elastic: this pod's sat.ai/planned-restart annotation is set\n"
                                             "[Concurrent Checkpoint] SIGTERM received: finishing the in-flight "
                                             "checkpoint\n")
    monkeypatch.setattr("sat_tasks.backends.kubernetes.client.core_v1_client", lambda *a, **k: cluster.client())
    verdict = steps.classify_attempt(job, RUN_ID, 2, log=lambda _m: None)
    assert verdict["kind"] == "PLANNED_RESTART" and verdict["reason"] == why
    record = run.load_record(2)
    assert record.planned_restart == why and record.readmitted_nodes == ["node-b"]
    from sat_tasks.core.handoffs import Verdict

    decision = Decision.from_xcom(steps.decide(job, RUN_ID, plan, Verdict.from_xcom(verdict), log=lambda _m: None))
    assert decision.action is Action.FAILOVER and decision.exclude_nodes == [] and decision.failovers == 1
    assert "not a failover: 1 of 3 used" in decision.why


@pytest.mark.parametrize(("case", "expected"), [
    ("all-ranks", (True, "runs on all 2 nodes")),
    ("not-started", (False, "training has not started")),
    ("ended", (True, "has ended")),
    ("last-attempt", (True, "is the last one")),
    ("workspace-pool", (True, "whose waiting tasks this watch cannot see, so it does not grow back")),
    ("undecided", (False, "rank 0 has not decided")),
    ("quarantined", (False, "no room to grow")),
])
def test_the_watch_leaves_alone_what_it_must_not_grow(case, expected, launch_env):
    """Near misses: each of these must not ask the pods to stop (and most end the watch)."""
    job = _job(2, name=f"elastic-{case}")
    plan = _failover()
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b"), _node("node-c")])
    quarantined: list[str] = []
    if case == "last-attempt":
        plan = _failover(attempt=job.max_attempts())
    if case == "workspace-pool":  # Kueue off: the Airflow pool queues the workspace
        job = parse_spec(job_spec(nodes=2, elastic={"min_nodes": 1, "wait_seconds": 0}, job_failover=True))
    if case == "all-ranks":
        cluster.services.append(k8s_pods.rendezvous_service(job, run_id=RUN_ID, attempt=2, namespace=NAMESPACE,
                                                            settings=SETTINGS, ranks=2))
    elif case not in ("undecided", "workspace-pool"):  # a pool-queued workspace job: left before anything is read
        pod = _running_shrunk_attempt(cluster, job, plan)
        if case == "not-started":
            pod["status"]["containerStatuses"][0]["started"] = False
        if case == "ended":
            pod["status"]["phase"] = "Succeeded"
        if case == "quarantined":  # node-c would fit, but the ledger quarantined it; node-b stays excluded
            quarantined = ["node-c"]
    growth = k8s_elastic.check_growth(job, RUN_ID, plan, client=cluster.client(), namespace=NAMESPACE,
                                      quarantined=quarantined, log=lambda _m: None)
    assert (growth.done, growth.grow) == (expected[0], None) and expected[1] in growth.why, growth
    assert not [r for r in cluster.requests if r[0] == "PATCH"]


def test_a_spare_node_that_fits_grows_the_attempt_back_without_a_release(launch_env):
    """Capacity, not only a release: a third healthy node with room is enough (node-b stays excluded)."""
    job = _job(2, name="elastic-spare-back")
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b"), _node("node-c")])
    _running_shrunk_attempt(cluster, job, _failover())
    growth = k8s_elastic.check_growth(job, RUN_ID, _failover(), client=cluster.client(), namespace=NAMESPACE,
                                      log=lambda _m: None)
    assert growth.done and growth.grow is not None and growth.grow.nodes == 2 and growth.grow.readmitted == ()
    assert growth.why == "planned restart to grow back from 1 to 2 of 2 nodes: capacity is back"


def _workspace_node(name: str, workspace: str = "team-a") -> dict:
    node = _node(name)
    node["metadata"]["labels"][SETTINGS.workspace_label] = workspace
    node["spec"]["taints"] = [{"key": SETTINGS.workspace_label, "value": workspace, "effect": "NoSchedule"}]
    return node


def _local_queue(workspace: str, pending: int) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": workspace, "namespace": NAMESPACE},
            "spec": {"clusterQueue": f"sat-workspace-{workspace}"},
            "status": {"pendingWorkloads": pending, "reservingWorkloads": 1, "admittedWorkloads": 1}}


def test_a_kueue_workspace_job_grows_back_only_when_no_other_workload_waits_in_its_queue(launch_env):
    """Issue 32 in a workspace (Kueue): node-c of the workspace is free, but another job's workload waits in the
    workspace's LocalQueue, so the room is that job's first: no stop. Once nobody waits, the pods are asked to
    stop (a planned restart). A node outside the workspace never counts: the rank pod selects the workspace."""
    job = _job(2, name="elastic-ws-grows", workspace="team-a")
    cluster = Cluster(nodes=[_workspace_node("node-a"), _workspace_node("node-b"), _workspace_node("node-c"),
                             _node("node-elsewhere")])
    queue = _local_queue("team-a", pending=1)
    cluster.local_queues.append(queue)
    pod = _running_shrunk_attempt(cluster, job, _failover())

    def look():
        return k8s_elastic.check_growth(job, RUN_ID, _failover(), client=cluster.client(), namespace=NAMESPACE,
                                        kueue=True, log=lambda _m: None)

    growth = look()
    assert (growth.done, growth.grow) == (False, None)
    assert growth.why == ("1 workload(s) wait in workspace team-a's queue (LocalQueue sat-jobs/team-a): "
                          "the room that frees is theirs first")
    reads = [r for r in cluster.requests if r[1].endswith("/localqueues/team-a")]
    assert [(m, p) for m, p, *_ in reads] == [("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/sat-jobs/localqueues/team-a")]

    queue["status"]["pendingWorkloads"] = 0
    growth = look()
    assert growth.done and growth.grow is not None and growth.grow.nodes == 2, growth
    assert growth.pods == (pod["metadata"]["name"],)

    # Nothing free inside the workspace (node-c runs another job's pod): no growth, whatever is free elsewhere.
    cluster.pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": NAMESPACE},
                         "spec": {"nodeName": "node-c", "containers": [{"name": "x", "image": "x", "resources": {
                             "requests": {"cpu": "8"}}}]}, "status": {"phase": "Running"}})
    growth = look()
    assert (growth.done, growth.grow) == (False, None) and "no room to grow" in growth.why, growth


class _FailingQueue(Cluster):
    def request(self, method, url, *args, **kwargs):
        if "/localqueues/" in url:
            return _Response(500, json.dumps({"kind": "Status", "code": 500, "message": "etcd timeout"}))
        return super().request(method, url, *args, **kwargs)


@pytest.mark.parametrize("queue", ["missing", "api-error", "unknown-count"])
def test_a_kueue_workspace_queue_that_cannot_be_read_or_says_nothing(queue, launch_env):
    """Near misses: no LocalQueue (404) ends the watch, said why; an API error is asked again, never grown on;
    a status without `pendingWorkloads` (Kueue has not counted yet) is nobody waiting."""
    job = _job(2, name=f"elastic-ws-{queue}", workspace="team-a")
    nodes = [_workspace_node("node-a"), _workspace_node("node-b"), _workspace_node("node-c")]
    cluster = _FailingQueue(nodes=nodes) if queue == "api-error" else Cluster(nodes=nodes)
    if queue == "unknown-count":
        cluster.local_queues.append({**_local_queue("team-a", 0), "status": {}})
    _running_shrunk_attempt(cluster, job, _failover())
    growth = k8s_elastic.check_growth(job, RUN_ID, _failover(), client=cluster.client(), namespace=NAMESPACE,
                                      kueue=True, log=lambda _m: None)
    if queue == "missing":
        assert growth.done and growth.grow is None
        assert growth.why.startswith("cannot read workspace team-a's Kueue LocalQueue sat-jobs/team-a (404")
        assert not [r for r in cluster.requests if r[0] == "PATCH"]
    elif queue == "api-error":
        assert (growth.done, growth.grow) == (False, None)
        assert growth.why == "the Kubernetes API did not answer for LocalQueue sat-jobs/team-a (500)"
    else:
        assert growth.done and growth.grow is not None and growth.grow.nodes == 2


def test_the_dag_watches_only_the_failover_attempts_of_an_elastic_kubernetes_job():
    from sat_tasks.airflow.dag_factory import build_job_dag

    job = _job(2, name="elastic-dag")
    dag = build_job_dag(job, dag_id="elastic-dag")
    watches = sorted(t for t in dag.task_dict if t.endswith(".watch_growth"))
    assert watches == [f"attempt_{k}.watch_growth" for k in range(2, job.max_attempts())]
    sensor = dag.task_dict["attempt_2.watch_growth"]
    assert sensor.mode == "reschedule" and sensor.soft_fail
    launch = dag.task_dict["attempt_2.launch"]
    assert launch.upstream_task_ids and launch.upstream_task_ids <= sensor.upstream_task_ids  # after attempt 1
    assert "attempt_2.watch_growth" in dag.task_dict["attempt_3.launch"].upstream_task_ids  # ends before attempt 3
    plain = build_job_dag(_job(2, name="plain-dag", elastic=None), dag_id="plain-dag")
    assert not [t for t in plain.task_dict if t.endswith(".watch_growth")]
    local = build_job_dag(_job(2, name="local-dag", backend="local"), dag_id="local-dag")
    assert not [t for t in local.task_dict if t.endswith(".watch_growth")]


def test_the_watch_task_asks_the_backend_and_ends_with_the_launch(launch_env, monkeypatch):
    """The sensor's own body, with the task context it gets: it plans the attempt from attempt 1's decision, asks
    the Kubernetes backend (here a third node fits: the pod is asked to stop), and ends without asking once
    the attempt's launch task has ended."""
    from sat_tasks.airflow import dag_factory

    job = _job(2, name="elastic-sensor")
    sensor = dag_factory.build_job_dag(job, dag_id="elastic-sensor").task_dict["attempt_2.watch_growth"]
    cluster = Cluster(nodes=[_node("node-a"), _node("node-b"), _node("node-c")])
    pod = _running_shrunk_attempt(cluster, job, _failover())
    monkeypatch.setattr("sat_tasks.backends.kubernetes.client.core_v1_client", lambda *a, **k: cluster.client())
    decision = Decision(attempt=1, verdict="HARDWARE", action=Action.FAILOVER, why="test", exclude_nodes=["node-b"],
                        failovers=1, resume_step=40).to_xcom()
    ti = _TI("attempt_2.watch_growth", {"attempt_1.decide": decision})
    monkeypatch.setattr(dag_factory, "get_current_context", lambda: {"ti": ti, "run_id": RUN_ID})

    ti.states = {"attempt_2.launch": "success"}  # the attempt ended: nothing to ask
    assert sensor.python_callable(job.to_dict()) is True
    assert not [r for r in cluster.requests if r[0] == "PATCH"]

    ti.states = {"attempt_2.launch": "deferred"}  # its pods run
    assert sensor.python_callable(job.to_dict()) is True
    assert pod["metadata"]["annotations"][k8s_names.ANNOTATION_PLANNED_RESTART] == (
        "planned restart to grow back from 1 to 2 of 2 nodes: capacity is back")

    # It is upstream of attempt 3: it ends in success, not skipped or failed, where attempt 2 runs anyway.
    resumed = Decision(attempt=1, verdict="PREEMPTED", action=Action.RESUME, why="test", resumes=1).to_xcom()
    ti._xcoms["attempt_1.decide"] = resumed  # not a failover: every node
    assert sensor.python_callable(job.to_dict()) is True
    ti._xcoms["attempt_1.decide"] = {"garbage": True}  # cannot be planned: done, never a failure
    assert sensor.python_callable(job.to_dict()) is True
