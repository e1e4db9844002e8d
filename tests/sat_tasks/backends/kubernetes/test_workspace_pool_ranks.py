"""Without Kueue, a workspace job's ranks > 0 create their pods only once rank 0 has its pool slots (issue 19).

Rank 0's `launch` queues in the Airflow pool `sat-workspace-<name>` (a slot per node); the
other ranks take no slot, so they wait until rank 0's pod of the same attempt exists before
they create the rendezvous Service and their own pod. The client is a recording fake
CoreV1Api; the provider's own `execute` (which creates the pod) is replaced by a recorder.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, TaskGroup
from airflow.sdk.exceptions import AirflowFailException
from kubernetes.client.exceptions import ApiException

from sat_tasks.backends.kubernetes import KubernetesBackend
from sat_tasks.backends.kubernetes import names as k8s_names
from sat_tasks.backends.kubernetes import operator as k8s_operator
from sat_tasks.spec import parse_spec
from tests.sat_tasks.workspaces.conftest import job_spec
from tests.support.k8s_api import RecordedCluster

RUN_ID = "manual__2026-12-01T20:00:00+00:00"
NAMESPACE = "sat-jobs"
POOL = "sat-workspace-team-a"


class FakeCoreV1:
    """The calls the launch path makes, in order; rank 0's pod appears when `rank0_after` reads have missed it."""

    def __init__(self, calls: list, rank0_pod: str, rank0_after: int | None = 0, error: ApiException | None = None):
        self.calls, self.rank0_pod, self.rank0_after, self.error = calls, rank0_pod, rank0_after, error
        self.misses = 0
        # the HTTP layer the ranks' NetworkPolicy is created through (NetworkingV1Api; ADR 0040)
        self.cluster = RecordedCluster()
        self.api_client = self.cluster.api_client()

    def read_namespaced_pod(self, name, namespace, **kwargs):
        self.calls.append(("read_pod", name))
        if self.error is not None:
            raise self.error
        if name == self.rank0_pod and self.rank0_after is not None and self.misses >= self.rank0_after:
            return SimpleNamespace(metadata=SimpleNamespace(name=name))
        self.misses += 1
        raise ApiException(status=404, reason="Not Found")

    def create_namespaced_service(self, namespace, body, **kwargs):
        self.calls.append(("create_service", body["metadata"]["name"]))


class FakeClock:
    """time.monotonic / time.sleep: sleeping moves the clock (recorded as a call)."""

    def __init__(self, calls: list):
        self.now, self.calls = 1000.0, calls

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.calls.append(("sleep", seconds))
        self.now += seconds


class _TI:
    def __init__(self, task_id: str, spec: dict, rank0_state: str | None = None):
        self.dag_id, self.task_id, self.map_index, self.try_number = "ws-job", task_id, -1, 1
        self._spec, self.rank0_state, self.asked = spec, rank0_state, []

    def xcom_pull(self, task_ids=None, key="return_value"):
        return self._spec if task_ids == "validate_spec" else None

    def xcom_push(self, key, value):  # pragma: no cover - the provider's execute is recorded
        pass

    def get_task_states(self, dag_id, task_ids=None, run_ids=None, **kwargs):
        self.asked.append(tuple(task_ids or ()))
        if self.rank0_state is None:
            return {RUN_ID: {}}
        return {RUN_ID: {task_id: self.rank0_state for task_id in task_ids}}


@pytest.fixture
def calls(monkeypatch) -> list:
    """Recorded calls; the provider's execute records `create_pod`, and sleeping moves a fake clock."""
    recorded: list = []
    monkeypatch.setenv("AIRFLOW__SAT__SCOPED_CREDENTIALS", "off")  # no per-attempt Secret here (tests/security)

    def fake_execute(self, context):
        recorded.append(("create_pod", self.name))

    monkeypatch.setattr(KubernetesPodOperator, "execute", fake_execute)
    monkeypatch.setattr(k8s_operator.JobRun, "record_attempt_start",
                        lambda self, plan, log=None, where="": recorded.append(("record_start", plan.attempt)))
    clock = FakeClock(recorded)
    monkeypatch.setattr(k8s_operator, "time", SimpleNamespace(sleep=clock.sleep, monotonic=clock.monotonic))
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", "kubernetes")
    monkeypatch.setenv("AIRFLOW__SAT__KUBERNETES_NAMESPACE", NAMESPACE)
    monkeypatch.delenv("AIRFLOW__SAT__K8S_KUEUE", raising=False)
    return recorded


def _use_client(monkeypatch, client) -> None:
    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(lambda self: client))


def _operators(job, dag_id: str):
    with DAG(dag_id=dag_id, schedule=None), TaskGroup("attempt_1"):
        return KubernetesBackend().launch_operators(attempt=1, previous_decide_task_id=None, job=job)


def _pods(job) -> tuple[str, str]:
    return k8s_names.pod_name(job, RUN_ID, 1, 0), k8s_names.pod_name(job, RUN_ID, 1, 1)


def _context(operator, spec: dict, **ti) -> dict:
    task_instance = _TI(operator.task_id, spec, **ti)
    return {"ti": task_instance, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": task_instance}


def test_rank_1_creates_its_pod_only_after_rank_0s_exists(calls, monkeypatch, capsys):
    spec = job_spec(backend="kubernetes")
    job = parse_spec(spec)
    ops = _operators(job, "ws_pool_wait")
    assert [(op.task_id, op.pool, op.pool_slots) for op in ops] == [
        ("attempt_1.launch", POOL, 2), ("attempt_1.launch_rank_1", "default_pool", 1)]
    assert [op.rank0_pool(job) for op in ops] == [None, POOL]
    rank0, rank1 = _pods(job)
    _use_client(monkeypatch, FakeCoreV1(calls, rank0, rank0_after=2))
    context = _context(ops[1], job.to_dict())

    ops[1].execute(context)

    poll = k8s_operator.RANK0_POLL_SECONDS
    assert calls == [
        ("read_pod", rank0), ("sleep", poll), ("read_pod", rank0), ("sleep", poll), ("read_pod", rank0),
        ("create_service", k8s_names.attempt_name(job, RUN_ID, 1)), ("create_pod", rank1)]
    assert context["ti"].asked == [("attempt_1.launch",)] * 2  # rank 0's task, in the same task group
    said = capsys.readouterr().out  # the task log
    assert f"rank 1 waits for rank 0 to get its 2 slots of workspace pool {POOL}" in said
    assert f"rank 0's pod {rank0} exists: rank 1 creates its pod (waited 20s)" in said


def test_rank_1_gives_up_at_the_deadline_without_creating_anything(calls, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "45")
    spec = job_spec(backend="kubernetes")
    job = parse_spec(spec)
    ops = _operators(job, "ws_pool_deadline")
    rank0, _rank1 = _pods(job)
    _use_client(monkeypatch, FakeCoreV1(calls, rank0, rank0_after=None))
    with pytest.raises(AirflowFailException) as failure:
        ops[1].execute(_context(ops[1], job.to_dict()))
    assert str(failure.value) == (
        f"rank 1 gave up after 45s ([sat] workspace_wait_seconds): rank 0 did not get its 2 slots of "
        f"workspace pool {POOL} (its pod {NAMESPACE}/{rank0} was never created)")
    assert [c for c in calls if c[0] == "sleep"] == [("sleep", 10.0)] * 4 + [("sleep", 5.0)]
    assert {c[0] for c in calls} == {"read_pod", "sleep"}  # no Service, no pod


def test_rank_1_stops_early_when_rank_0s_task_ended_without_a_pod(calls, monkeypatch):
    spec = job_spec(backend="kubernetes")
    job = parse_spec(spec)
    ops = _operators(job, "ws_pool_rank0_failed")
    rank0, _rank1 = _pods(job)
    _use_client(monkeypatch, FakeCoreV1(calls, rank0, rank0_after=None))
    with pytest.raises(AirflowFailException, match=rf"rank 0's task ended \(failed\) without creating its pod "
                                                   rf"{NAMESPACE}/{rank0}: rank 1 does not start"):
        ops[1].execute(_context(ops[1], job.to_dict(), rank0_state="failed"))
    assert calls == [("read_pod", rank0), ("read_pod", rank0)]  # looked once more after the state said ended


@pytest.mark.parametrize("case", ["kueue", "no-workspace", "one-node"])
def test_with_kueue_without_a_workspace_or_single_node_nobody_waits(case, calls, monkeypatch):
    spec = {"kueue": job_spec(backend="kubernetes"), "no-workspace": job_spec(backend="kubernetes", workspace=None),
            "one-node": job_spec(backend="kubernetes", nodes=1)}[case]
    if case == "kueue":
        monkeypatch.setenv("AIRFLOW__SAT__K8S_KUEUE", "true")
    job = parse_spec(spec)
    ops = _operators(job, f"ws_no_wait_{case.replace('-', '_')}")
    assert all(op.rank0_pool(job) is None for op in ops)
    rank0 = k8s_names.pod_name(job, RUN_ID, 1, 0)
    _use_client(monkeypatch, FakeCoreV1(calls, rank0, rank0_after=None))
    ops[-1].execute(_context(ops[-1], job.to_dict()))
    if job.distributed:  # rank 1
        expected = [("create_service", k8s_names.attempt_name(job, RUN_ID, 1)),
                    ("create_pod", k8s_names.pod_name(job, RUN_ID, 1, 1))]
    else:
        expected = [("record_start", 1), ("create_pod", rank0)]
    assert calls == expected  # rank 0's pod was never read: no wait


def test_a_rank_0_built_without_the_pool_does_not_queue_so_rank_1_does_not_wait(calls, monkeypatch):
    """A DAG built without the spec (rank tasks for up to `max_nodes`): its rank 0 has no pool, nothing to wait for."""
    job = parse_spec(job_spec(backend="kubernetes"))
    with DAG(dag_id="ws_generic", schedule=None), TaskGroup("attempt_1"):
        ops = k8s_operator.make_launch_operators(attempt=1, previous_decide_task_id=None, job=None, max_nodes=2)
    assert ops[0].pool == "default_pool" and ops[1].rank0_pool(job) is None
    _use_client(monkeypatch, FakeCoreV1(calls, k8s_names.pod_name(job, RUN_ID, 1, 0), rank0_after=None))
    ops[1].execute(_context(ops[1], job.to_dict()))
    assert calls == [("create_service", k8s_names.attempt_name(job, RUN_ID, 1)),
                     ("create_pod", k8s_names.pod_name(job, RUN_ID, 1, 1))]


# ---- await_rank0_pod alone ----------------------------------------------------------------------
def _await(client, clock: FakeClock, said: list, **kwargs) -> float:
    return k8s_operator.await_rank0_pod(
        client=client, namespace=NAMESPACE, rank0_pod="sat-x-a1-r0", node_rank=1, pool="sat-workspace-x", slots=2,
        deadline_seconds=kwargs.pop("deadline_seconds", 60), log=said.append, sleep=clock.sleep,
        clock=clock.monotonic, **kwargs)


def test_a_pod_already_there_means_no_wait_and_no_line():
    calls, said = [], []
    assert _await(FakeCoreV1(calls, "sat-x-a1-r0"), FakeClock(calls), said) == 0.0
    assert calls == [("read_pod", "sat-x-a1-r0")] and said == []


def test_an_api_error_is_said_once_and_asked_again_but_forbidden_fails_at_once():
    calls, said = [], []
    client = FakeCoreV1(calls, "sat-x-a1-r0", error=ApiException(status=500, reason="Internal Server Error"))
    with pytest.raises(AirflowFailException, match="gave up after 30s"):
        _await(client, FakeClock(calls), said, deadline_seconds=30)
    assert sum("could not read rank 0's pod sat-jobs/sat-x-a1-r0 (500 Internal Server Error)" in s for s in said) == 1
    assert said[1] == ("[sat] rank 1 waits for rank 0 to get its 2 slots of workspace pool sat-workspace-x "
                       "(rank 0's pod sat-x-a1-r0 does not exist yet; at most 30s, [sat] workspace_wait_seconds)")
    calls = []
    client = FakeCoreV1(calls, "sat-x-a1-r0", error=ApiException(status=403, reason="Forbidden"))
    with pytest.raises(AirflowFailException, match="rank 1 cannot read rank 0's pod sat-jobs/sat-x-a1-r0 .*403"):
        _await(client, FakeClock(calls), [])
    assert calls == [("read_pod", "sat-x-a1-r0")]


def test_a_pod_created_just_before_rank_0s_task_ended_counts():
    calls, said = [], []
    client = FakeCoreV1(calls, "sat-x-a1-r0", rank0_after=1)
    assert _await(client, FakeClock(calls), said, rank0_ended=lambda: "success") == 0.0
    assert calls == [("read_pod", "sat-x-a1-r0")] * 2
