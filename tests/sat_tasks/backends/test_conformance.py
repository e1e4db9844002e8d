"""The Backend contract, one suite for every installed backend (ADR 0010): a new backend passes or fails these same tests.

Each test runs once per `sat.backends` entry point (and built-in subpackage). A backend
that needs a stand-in for what it talks to gets it from `_DOUBLES` (Kubernetes: the
in-memory API server of `tests.support.k8s_api`, with a kubelet for the one launch); any
other runs as installed. Nothing here trains: the checks are the protocol's shape, what the
declared capabilities promise, what each method returns for a run that has not launched
yet, and the record of one attempt of `python -c 'print(1)'` launched by the backend's own
operators and read back.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG, BaseOperator, TaskGroup

from sat_tasks.backends import Backend, BackendCapabilities, Capacity, get_backend
from sat_tasks.backends.base import (
    OPTIONAL_INTERFACES,
    KeepsWarm,
    LiveLogSource,
    ProbesNodes,
    ReleasesNodes,
    WatchesGrowth,
    live_log_of,
    node_probe_of,
    release_node_on,
    release_warm_on,
    watch_growth_of,
    workspace_pool_name,
)
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.handoffs import Action, Decision
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import SpecError, TrainingJob, parse_spec
from sat_tasks.spec.model import (
    FAULT_INJECTING_BACKENDS,
    BackendKind,
    installed_backends,
)
from tests.support.task_instance import spec_ti

BACKENDS = installed_backends()
BUCKET = "sat-conformance"
NAMESPACE = "sat-conformance"
RUN_ID = "manual__2026-12-02T05:00:00+00:00"
WORKSPACE = "team-a"
# The contract's methods (the shorthand properties aside), in the order the module doc calls them.
METHODS = [name for name, member in vars(Backend).items() if inspect.isfunction(member) and not name.startswith("_")]
# Each optional interface's methods, by the capability flag that declares it.
OPTIONAL = {flag: [name for name, member in vars(interface).items() if inspect.isfunction(member)]
            for flag, interface in OPTIONAL_INTERFACES.items()}


def _kubernetes() -> Backend:
    from sat_tasks.backends.kubernetes import KubernetesBackend
    from tests.support.k8s_api import RecordedCluster, run_pod_here

    return KubernetesBackend(client=RecordedCluster(kubelet=run_pod_here).client(), namespace=NAMESPACE)


# Backends that reach outside this process, each on a double of what it talks to.
_DOUBLES: dict[str, Callable[[], Backend]] = {"kubernetes": _kubernetes}


@pytest.fixture(params=[pytest.param(name, id=name) for name in BACKENDS])
def backend(request, monkeypatch, tmp_path) -> Backend:
    monkeypatch.setenv("AIRFLOW__SAT__BACKEND", request.param)
    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path / "workspaces"))
    monkeypatch.delenv("AIRFLOW__SAT__K8S_KUEUE", raising=False)
    double = _DOUBLES.get(request.param)
    return double() if double else get_backend(request.param)


def _spec(backend: Backend, **overrides) -> dict:
    spec = {
        "name": "conformance-job",
        "nodes": 1,
        "resources": {"gpus_per_node": 8, "server_type": "g2", "memory": "512Gi", "shared_memory": "64Gi"},
        "image": {"url": "registry.example.com/team/train:1.0"},
        "data": {"source": f"s3://{BUCKET}/datasets/corpus/"},
        "results": {"destination": f"s3://{BUCKET}/results/"},
        "command": "python train.py",
        "backend": backend.kind,
    }
    spec.update(overrides)
    return spec


def _job(backend: Backend, **overrides) -> TrainingJob:
    return parse_spec(_spec(backend, **overrides))


@pytest.fixture
def bucket(s3_hook):
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET)
    return BUCKET


def _quiet(_line: str) -> None:
    pass


# ---- the contract's shape -------------------------------------------------------------------------
def test_the_contract_has_the_methods_the_module_doc_lists():
    assert METHODS == ["stage", "check_staged_data", "launch_operators", "read_attempt_record", "cleanup_attempt",
                       "capacity", "upload_outputs", "job_log", "cleanup_run", "workspace_queue_problem"]
    assert OPTIONAL == {"grow_watch": ["watch_growth"], "warm_pool": ["keep_warm", "release_warm"],
                        "live_log": ["live_log"], "node_release": ["release_node"], "node_probe": ["probe_node"],
                        "slot_board": ["slot_waits", "concurrent_attempts"]}
    assert sorted(Backend.__abstractmethods__) == sorted(METHODS)  # every one of them must be implemented


def test_a_backend_missing_a_method_cannot_be_instantiated():
    """A subclass that implements nothing (or all but one method) fails loudly, not with a None later on."""
    class Empty(Backend):
        kind = "empty"
        capabilities = BackendCapabilities(pulls_images=False, watches_stop_request=False)

    with pytest.raises(TypeError, match="abstract method"):
        Empty()
    for missing in METHODS:
        body = {name: (lambda self, *a, **k: None) for name in METHODS if name != missing}
        partial = type("Partial", (Backend,), {"kind": "partial", "capabilities": Empty.capabilities, **body})
        with pytest.raises(TypeError, match=missing):
            partial()
    whole = type("Whole", (Backend,), {"kind": "whole", "capabilities": Empty.capabilities,
                                       **{name: (lambda self, *a, **k: None) for name in METHODS}})
    assert isinstance(whole(), Backend)


@pytest.mark.parametrize("flag", list(OPTIONAL_INTERFACES))
def test_a_capability_and_its_interface_go_together(flag):
    """Declaring a feature without its methods, or the methods without the flag, is refused when it is made."""
    methods = {name: (lambda self, *a, **k: None) for name in METHODS}
    interface = OPTIONAL_INTERFACES[flag]
    claims = type("Claims", (Backend,), {"kind": "claims", **methods, "capabilities": BackendCapabilities(
        pulls_images=False, watches_stop_request=False, **{flag: True})})
    with pytest.raises(TypeError, match=f"capabilities.{flag}=True but it does not subclass {interface.__name__}"):
        claims()
    hides = type("Hides", (Backend, interface), {"kind": "hides", **methods, **{
        name: (lambda self, *a, **k: None) for name in OPTIONAL[flag]}, "capabilities": BackendCapabilities(
        pulls_images=False, watches_stop_request=False)})
    with pytest.raises(TypeError, match=f"capabilities.{flag}=False but it subclasses {interface.__name__}"):
        hides()
    # neither class, nor any refused one, makes an installed backend look like it offers the feature
    for name in BACKENDS:
        installed = get_backend(name)
        assert isinstance(installed, interface) == getattr(installed.capabilities, flag)


def test_it_is_installed_under_its_name_and_declares_its_capabilities(backend):
    installed = get_backend(backend.kind)
    assert type(installed) is type(backend)  # the double is the installed class, only wired to a stand-in
    assert isinstance(backend, Backend)
    assert BackendKind(backend.kind).value == backend.kind
    assert type(backend.capabilities) is BackendCapabilities
    assert (backend.pulls_images, backend.watches_stop_request) == (
        backend.capabilities.pulls_images, backend.capabilities.watches_stop_request)
    for flag, interface in OPTIONAL_INTERFACES.items():
        assert getattr(backend.capabilities, flag) == isinstance(backend, interface), flag


def _declared(backend: Backend) -> list[tuple[type, str]]:
    """(the class that declares it, name) for every method the backend must or does offer."""
    found = [(Backend, name) for name in METHODS]
    for flag, interface in OPTIONAL_INTERFACES.items():
        if getattr(backend.capabilities, flag):
            found += [(interface, name) for name in OPTIONAL[flag]]
    return found


def test_each_method_has_the_contracts_signature_and_types(backend):
    """Parameters, their kinds, defaults and annotations as the contract writes them (no `Any` in their place)."""
    shape = lambda signature: ([(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()],
                               signature.return_annotation)
    for declaring, method in _declared(backend):
        wanted, found = inspect.signature(getattr(declaring, method)), inspect.signature(getattr(type(backend), method))
        assert shape(found) == shape(wanted), method
        assert getattr(type(backend), method) is not getattr(declaring, method), f"{method} is the abstract stub"


# ---- what the capabilities promise ---------------------------------------------------------------
def test_the_spec_accepts_faults_exactly_where_the_backend_injects_them(backend):
    spec = _spec(backend, faults=[{"kind": "hardware", "at_step": 3}])
    assert (backend.kind in FAULT_INJECTING_BACKENDS) == backend.capabilities.injects_faults
    if backend.capabilities.injects_faults:
        assert parse_spec(spec).faults[0].at_step == 3
    else:
        with pytest.raises(SpecError) as refused:
            parse_spec(spec)
        assert [p.field for p in refused.value.problems] == ["faults"]


@pytest.mark.parametrize("job_in_dag", [pytest.param(True, id="job-dag"), pytest.param(False, id="generic-dag")])
def test_launch_operators_are_airflow_tasks_and_use_the_workspace_pool_as_declared(backend, job_in_dag):
    job = _job(backend, workspace=WORKSPACE, nodes=2)
    with DAG(dag_id=f"conformance_{backend.kind}", schedule=None), TaskGroup("attempt_1"):
        operators = backend.launch_operators(attempt=1, previous_decide_task_id=None, job=job if job_in_dag else None)
    assert operators and all(isinstance(op, BaseOperator) for op in operators)
    assert operators[0].task_id == "attempt_1.launch"  # what the DAG factory and the UI look for
    pools = [op.pool for op in operators]
    assert (workspace_pool_name(WORKSPACE) in pools) == (backend.capabilities.workspace_pool and job_in_dag)


def test_a_job_without_a_workspace_has_no_queue_problem(backend):
    job = _job(backend)
    assert backend.workspace_queue_problem(job, spec_with_run=False, log=_quiet) is None
    assert backend.workspace_queue_problem(job, spec_with_run=True, log=_quiet) is None


# ---- a run that has not launched -----------------------------------------------------------------
def test_an_attempt_that_never_launched_has_no_record_and_nothing_to_clean(backend, bucket):
    run = JobRun(_job(backend), RUN_ID)
    assert backend.read_attempt_record(run, 1, _quiet) is None
    assert backend.cleanup_attempt(run, 1, _quiet) == []


def test_a_run_that_never_launched_has_no_job_log_and_cleans_up_to_a_list_of_names(backend, bucket):
    run = JobRun(_job(backend), RUN_ID)
    assert backend.job_log(run, _quiet) is None
    deleted = backend.cleanup_run(run, _quiet)
    assert isinstance(deleted, list) and all(isinstance(name, str) and "/" in name for name in deleted)


def test_releasing_a_node_it_did_nothing_to_changes_nothing(backend):
    """With `[sat] quarantine_cordon` off (the default) no backend has touched a node: a release is a no-op."""
    lines: list[str] = []
    assert release_node_on(backend, "node-never-cordoned", lines.append) is False
    if isinstance(backend, ReleasesNodes):
        assert backend.release_node("node-never-cordoned", lines.append) is False


def test_a_node_probe_answers_with_a_result_for_that_node(backend, bucket):
    """The health check of a suspect node (ADR 0004) reads the node and says what it found; never a None."""
    from sat_tasks.core.health_check import ProbeResult

    run = JobRun(_job(backend), RUN_ID)
    probe = node_probe_of(backend, run, _quiet)
    assert (probe is not None) == isinstance(backend, ProbesNodes) == backend.capabilities.node_probe
    if probe is not None:
        result = probe("node-probed")
        assert type(result) is ProbeResult and result.node == "node-probed" and result.checks


def test_a_slot_board_says_who_waits_and_how_many_attempts_run_at_once(backend, tmp_path, monkeypatch):
    """Issue 45.5: an empty board has nobody waiting; the attempts at once follow the settings it is handed
    (what `sat up` sizes Airflow from); a backend without boards answers nothing and sizes nothing."""
    from sat_tasks.backends.base import QueuesOnSlots, concurrent_attempts_of, slot_waits_of

    monkeypatch.setenv("AIRFLOW__SAT__WORK_DIR", str(tmp_path / "work"))
    assert isinstance(backend, QueuesOnSlots) == backend.capabilities.slot_board
    assert slot_waits_of(backend, None) == {} and slot_waits_of(backend, WORKSPACE) == {}
    settings = {"local_nodes": "n0,n1,n2", "local_node_slots": "2", "workspaces_dir": str(tmp_path / "none")}
    attempts = concurrent_attempts_of(backend, settings.__getitem__)
    if isinstance(backend, QueuesOnSlots):
        assert attempts == backend.concurrent_attempts(settings.__getitem__) == 6
        assert backend.concurrent_attempts({**settings, "local_node_slots": "x"}.__getitem__) == 3  # refused later
    else:
        assert attempts is None


def test_a_run_that_never_launched_has_no_live_lines(backend, bucket):
    run = JobRun(_job(backend), RUN_ID)
    assert live_log_of(backend, run, stored=(), cursor=None, limit=4096, lines=10) is None
    if isinstance(backend, LiveLogSource):
        assert backend.live_log(run, stored=(), cursor=None, limit=4096, lines=10) is None


def test_a_job_that_is_not_elastic_has_no_growth_to_watch(backend, bucket):
    """Growth is watched only for an elastic job's attempt on fewer nodes: any other is done watching at once."""
    from sat_tasks.core.policy import plan_attempt

    job = _job(backend, nodes=2, job_failover=True)
    run = JobRun(job, RUN_ID)
    plan = plan_attempt(job, 1, None)
    assert watch_growth_of(backend, run, plan, _quiet) is True
    if isinstance(backend, WatchesGrowth):
        assert backend.watch_growth(run, plan, _quiet) is True


def test_a_warm_state_is_kept_and_released_through_the_backend(backend, bucket):
    """keep_warm hands back the state it holds; release_warm lets it go and names what it deleted."""
    from sat_tasks.core.warm_pool import WarmState

    job = _job(backend, warm_pool={"keep_alive_seconds": 60})
    run = JobRun(job, RUN_ID)
    run.data_dir.mkdir(parents=True, exist_ok=True)
    state = WarmState(job=job.name, workspace=None, backend=backend.kind, run_id=RUN_ID, kept_at=0.0,
                      expires_at=60.0, spec_hash="h", data_source=job.data.source)
    if not isinstance(backend, KeepsWarm):
        assert release_warm_on(backend, state, _quiet) == []
        return
    kept = backend.keep_warm(run, state, _quiet)
    assert type(kept) is WarmState and kept.run_id == RUN_ID
    released = release_warm_on(backend, kept, _quiet)
    assert isinstance(released, list) and all(isinstance(name, str) for name in released)


def test_capacity_answers_with_a_reason(backend):
    run = JobRun(_job(backend, learning_type="spot", job_failover=False), RUN_ID)
    decision = Decision(attempt=1, verdict="PREEMPTED", action=Action.RESUME, why="resume (conformance)")
    capacity = backend.capacity(run, decision, _quiet)
    assert type(capacity) is Capacity and isinstance(capacity.available, bool) and capacity.summary


# ---- one attempt, launched by the backend's own operators ----------------------------------------
def _kubernetes_launch(monkeypatch) -> Backend:
    """The API server in memory with a kubelet that runs each pod at once, behind the backend and the provider's hook."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    from sat_tasks.backends.kubernetes import KubernetesBackend
    from tests.support.k8s_api import RecordedCluster

    cluster = RecordedCluster(kubelet=lambda pod: (0, "trained\n"))
    monkeypatch.setattr(KubernetesHook, "get_conn", lambda self: cluster.api_client())
    monkeypatch.setattr(KubernetesHook, "core_v1_client", property(lambda self: cluster.client()))
    monkeypatch.setenv("AIRFLOW__SAT__KUBERNETES_NAMESPACE", NAMESPACE)
    return KubernetesBackend(client=cluster.client(), namespace=NAMESPACE)


_LAUNCH_DOUBLES: dict[str, Callable] = {"kubernetes": _kubernetes_launch}


def test_a_launched_attempt_leaves_a_record_read_back_in_the_same_shape(backend, bucket, monkeypatch):
    launching = _LAUNCH_DOUBLES.get(backend.kind)
    backend = launching(monkeypatch) if launching else backend
    job = _job(backend, name=f"conformance-{backend.kind}", command="python -c 'print(1)'", startup_timeout_seconds=0)
    run = JobRun(job, RUN_ID)
    run.code_dir.mkdir(parents=True, exist_ok=True)
    with DAG(dag_id=f"conformance_launch_{backend.kind}", schedule=None), TaskGroup("attempt_1"):
        operators = backend.launch_operators(attempt=1, previous_decide_task_id=None, job=job)
    for operator in operators:
        ti = spec_ti(operator.task_id, job.to_dict(), dag_id="conformance-job")
        operator.execute({"ti": ti, "run_id": RUN_ID, "dag": SimpleNamespace(), "task_instance": ti})
    record = backend.read_attempt_record(run, 1, _quiet)
    assert type(record) is AttemptRecord
    assert (record.job, record.attempt, record.backend, record.exit_code) == (job.name, 1, backend.kind, 0)
    assert record.node and record.finished_at is not None
