"""The `launch` task of the Kubernetes backend: the provider's KubernetesPodOperator, building the rendered pod.

Call order for attempt k (the DAG factory wires it, inside the `attempt_<k>` group):
``make_launch_operators(attempt=k, previous_decide_task_id=..., job=...)`` gives one
``SatTrainingPodOperator`` per node rank (`launch`, `launch_rank_1`, ...). Each, at
`execute`: plans the attempt (skipped when not needed), applies the kwargs of
``build_pod_operator_kwargs`` (the pod of ``pods.build_attempt_pods``), creates the
attempt's rendezvous Service (multi-node; an existing one is kept), records Running
(rank 0), then the provider creates the pod, follows its log and keeps the pod for
classify. A failover of an elastic job may resume on fewer ranks (`elastic`, ADR 0029):
rank 0 decides how many and says so in the Service, which it creates before any pod; the
other ranks read it there, and a rank the attempt does not use ends without a pod. A
failed rank tears the others down (``gang_teardown_callback``). Where rank 0
queues in its workspace's Airflow pool (no Kueue, `workspace.launch_pool`), the other ranks
first wait until rank 0's pod exists (``await_rank0_pod``): rank 0 has its slots then.

Importing this module imports the provider (and with it the kubernetes client): only
`KubernetesBackend.launch_operators` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.pod_manager import (
    OnFinishAction,
    OnKillAction,
)
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from sat_tasks.backends.kubernetes.cleanup import teardown_peers
from sat_tasks.backends.kubernetes.names import pod_name
from sat_tasks.backends.kubernetes.pods import (
    attempt_ranks,
    build_attempt_pods,
    rendezvous_network_policy,
    rendezvous_service,
)
from sat_tasks.backends.kubernetes.settings import DEFAULT_NAMESPACE, KubernetesSettings
from sat_tasks.backends.launch import AttemptLaunch, ended_task_state, state_name
from sat_tasks.config import sat_setting
from sat_tasks.core.attempt import MAIN_CONTAINER_NAME
from sat_tasks.core.handoffs import Log, Plan
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk.definitions.context import Context

# How often a rank > 0 looks for rank 0's pod while rank 0 queues in its workspace's pool.
RANK0_POLL_SECONDS = 10.0


def rank_task_id(node_rank: int) -> str:
    """`launch` for rank 0, `launch_rank_<r>` for the other ranks of a multi-node attempt."""
    return "launch" if node_rank == 0 else f"launch_rank_{node_rank}"


def build_pod_operator_kwargs(
    job: TrainingJob,
    *,
    run_id: str,
    plan: Plan,
    namespace: str = DEFAULT_NAMESPACE,
    kubernetes_conn_id: str = "kubernetes_default",
    node_rank: int = 0,
    pvc_name: str | None = None,
    deferrable: bool = True,
    settings: KubernetesSettings | None = None,
    quarantined_nodes: Sequence[str] = (),
    ranks: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments (all but `task_id`) for `KubernetesPodOperator`, for one node rank.

    `ranks`: how many node ranks the attempt runs (an elastic failover's count; default `job.nodes`).

    The pod goes in as `full_pod_spec`: the operator builds exactly the rendered pod (plus
    its own Airflow labels), and no part of the user's command or env passes through Jinja
    (a `{#` in a shell command would otherwise break rendering). The pod has a fixed name
    (no random suffix): an attempt's pods are addressable, and ranks find each other by
    hostname. The pod is kept when it finishes (`classify` reads it; `cleanup` deletes it).
    """
    settings = settings or KubernetesSettings.from_sat_config()
    count = attempt_ranks(job, ranks)
    if not 0 <= node_rank < count:
        raise ValueError(f"node_rank must be in [0, {count})")
    pod = build_attempt_pods(job, run_id=run_id, plan=plan, namespace=namespace, pvc_name=pvc_name,
                             settings=settings, quarantined_nodes=quarantined_nodes, ranks=count)[node_rank]
    return {
        "kubernetes_conn_id": kubernetes_conn_id,
        "namespace": namespace,
        "name": pod.metadata.name,
        "random_name_suffix": False,
        "full_pod_spec": pod,
        "base_container_name": MAIN_CONTAINER_NAME,
        "termination_message_policy": "FallbackToLogsOnError",
        "termination_grace_period": pod.spec.termination_grace_period_seconds,
        "get_logs": True,
        "log_events_on_failure": True,
        "on_finish_action": "keep_pod",
        "on_kill_action": "delete_pod",
        "startup_timeout_seconds": settings.startup_timeout_seconds,
        "deferrable": deferrable,
        "do_xcom_push": False,
        "callbacks": [gang_teardown_callback()] if job.distributed else [],
    }


_GANG_TEARDOWN: type | None = None


def gang_teardown_callback() -> type:
    """A `KubernetesPodOperatorCallback` that runs `teardown_peers` when a rank's pod completes."""
    global _GANG_TEARDOWN
    if _GANG_TEARDOWN is None:
        from airflow.providers.cncf.kubernetes.callbacks import (
            KubernetesPodOperatorCallback,
        )

        class GangTeardown(KubernetesPodOperatorCallback):
            """If one rank of a multi-node attempt fails, stop the others (they checkpoint on SIGTERM)."""

            @staticmethod
            def on_pod_completion(*, pod: Any, client: Any, mode: str, **kwargs: Any) -> None:
                if pod is not None and client is not None:
                    teardown_peers(pod, client)

        _GANG_TEARDOWN = GangTeardown
    return _GANG_TEARDOWN


def await_rank0_pod(
    *,
    client: Any,
    namespace: str,
    rank0_pod: str,
    node_rank: int,
    pool: str,
    slots: int,
    deadline_seconds: float,
    rank0_ended: Callable[[], str | None] = lambda: None,
    poll_seconds: float = RANK0_POLL_SECONDS,
    log: Log = print,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> float:
    """Wait until rank 0's pod `rank0_pod` exists (rank 0 got its `slots` slots of `pool`); the seconds waited.

    Without Kueue only rank 0's `launch` queues in the workspace's Airflow pool (a slot per
    node of the job): a rank > 0 that created its pod at once would hold a workspace node the
    pool does not count while rank 0 waits. So it reads rank 0's pod (the names are fixed:
    `names.pod_name`) every `poll_seconds` until it is there. Raises AirflowFailException
    when rank 0's task has ended without it (`rank0_ended()`: its state, or None while it has
    not ended or cannot be read), past `deadline_seconds`, or when pods may not be read.
    """
    from kubernetes.client.exceptions import ApiException

    sleep, clock = sleep or time.sleep, clock or time.monotonic
    start = clock()
    deadline = start + deadline_seconds
    said_error = False

    def exists() -> bool:
        nonlocal said_error
        try:
            client.read_namespaced_pod(rank0_pod, namespace)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status in (401, 403):
                raise AirflowFailException(
                    f"rank {node_rank} cannot read rank 0's pod {namespace}/{rank0_pod} to wait for it "
                    f"({exc.status} {exc.reason})") from None
            error = f"{exc.status} {exc.reason}"
        except Exception as exc:  # noqa: BLE001 - the API may not answer for a moment: ask again
            error = f"{type(exc).__name__}: {exc}"
        if not said_error:
            said_error = True
            log(f"[sat] could not read rank 0's pod {namespace}/{rank0_pod} ({error}); asking again")
        return False

    if exists():
        return 0.0
    log(f"[sat] rank {node_rank} waits for rank 0 to get its {slots} slots of workspace pool {pool} "
        f"(rank 0's pod {rank0_pod} does not exist yet; at most {deadline_seconds:.0f}s, "
        "[sat] workspace_wait_seconds)")
    while True:
        ended = rank0_ended()
        if ended is not None:
            if exists():  # created just before its task ended
                break
            raise AirflowFailException(
                f"rank 0's task ended ({ended}) without creating its pod {namespace}/{rank0_pod}: "
                f"rank {node_rank} does not start (workspace pool {pool})")
        if clock() >= deadline:
            raise AirflowFailException(
                f"rank {node_rank} gave up after {deadline_seconds:.0f}s ([sat] workspace_wait_seconds): "
                f"rank 0 did not get its {slots} slots of workspace pool {pool} "
                f"(its pod {namespace}/{rank0_pod} was never created)")
        sleep(max(0.0, min(poll_seconds, deadline - clock())))
        if exists():
            break
    waited = clock() - start
    log(f"[sat] rank 0's pod {rank0_pod} exists: rank {node_rank} creates its pod (waited {waited:.0f}s)")
    return waited


class SatTrainingPodOperator(AttemptLaunch, KubernetesPodOperator):
    """The `launch` task of one attempt (one node rank) on the kubernetes backend.

    Call order (`execute`): read the validated spec and the previous `decide` from XCom,
    `plan_attempt` (not needed -> skipped), build the operator kwargs for this rank, apply
    them, create the rendezvous Service (multi-node), record `Running` (rank 0), then the provider's `execute`
    creates the pod, follows its log and keeps the pod when it ends (a failed pod fails the
    task; `classify` runs anyway and reads the kept pod). A failover of a workspace job first
    waits for healthy room in its workspace (`await_workspace`, before the Service and pods),
    and a rank > 0 whose rank 0 queues in the workspace's Airflow pool (`rank0_pool`) waits
    for rank 0's pod (`await_rank0`, before the Service and its pod).

    Everything that depends on the run (the pod, its name, node exclusions, `CKPT_LAST_STEP`)
    is built at `execute`, never at parse time, and never through Jinja. The pod gets no
    secret in its spec: the run's image pull Secret (`ensure_pull_secret`) and the attempt's
    Object Storage credentials (`create_attempt_credentials`), both made before the pod, are
    referenced by name only.

    Args:
        attempt: 1-based attempt number.
        previous_decide_task_id: task id of the previous attempt's `decide` (None for attempt 1).
        node_rank: the node rank this task launches (0 = rendezvous host).
        max_nodes: the number of rank tasks the DAG has for this attempt; a job asking for
            more nodes fails rank 0, ranks beyond the job's `nodes` are skipped. None: no check.
        spec_task_id: task id whose XCom is the validated spec (`TrainingJob.to_dict()`).
        pvc_name: an existing claim instead of the run's own (`names.run_volume_claim_name`).
        namespace / kubernetes_conn_id: default `[sat] kubernetes_namespace` / `kubernetes_conn_id`.
        deferrable: wait for the pod in the triggerer (the pod is rebuilt on re-entry).
    """

    def __init__(
        self,
        *,
        attempt: int,
        previous_decide_task_id: str | None,
        node_rank: int = 0,
        max_nodes: int | None = None,
        spec_task_id: str = "validate_spec",
        pvc_name: str | None = None,
        namespace: str | None = None,
        kubernetes_conn_id: str | None = None,
        deferrable: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("task_id", rank_task_id(node_rank))
        kwargs["retries"] = 0  # a failed attempt is classified, not run again (default_args say 2)
        super().__init__(namespace=namespace, kubernetes_conn_id=kubernetes_conn_id, deferrable=deferrable,
                         on_finish_action="keep_pod", **kwargs)
        self.attempt = attempt
        self.previous_decide_task_id = previous_decide_task_id
        self.node_rank = node_rank
        self.max_nodes = max_nodes
        self.spec_task_id = spec_task_id
        self.pvc_name = pvc_name

    # -- steps ---------------------------------------------------------------------------------
    def build_plan(self, context: Context) -> tuple[TrainingJob, Plan]:
        """The job and this attempt's plan; AirflowSkipException when this task has nothing to do."""
        job, plan = self.resolve_attempt(context)
        if self.max_nodes is not None and job.nodes > self.max_nodes:
            if self.node_rank == 0:
                raise AirflowFailException(
                    f"job {job.name} asks for {job.nodes} nodes; this DAG launches at most {self.max_nodes}")
            raise AirflowSkipException(f"job {job.name} cannot run on this DAG ({job.nodes} nodes)")
        if self.node_rank >= job.nodes:
            raise AirflowSkipException(f"rank {self.node_rank} is not used by a {job.nodes}-node job")
        return job, plan

    def target_namespace(self) -> str:
        return self.namespace or sat_setting("kubernetes_namespace")

    def build_pod_kwargs(self, job: TrainingJob, run_id: str, plan: Plan, ranks: int | None = None,
                         quarantined: Sequence[str] | None = None) -> dict[str, Any]:
        """`build_pod_operator_kwargs` for this rank and plan (`ranks`: the attempt's rank count, default all)."""
        return build_pod_operator_kwargs(
            job,
            run_id=run_id,
            plan=plan,
            namespace=self.target_namespace(),
            kubernetes_conn_id=self.kubernetes_conn_id or sat_setting("kubernetes_conn_id"),
            node_rank=self.node_rank,
            pvc_name=self.pvc_name,
            deferrable=self.deferrable,
            quarantined_nodes=self.quarantined_nodes(job) if quarantined is None else quarantined,
            ranks=ranks,
        )

    def quarantined_nodes(self, job: TrainingJob) -> list[str]:
        """The nodes the node health ledger quarantined (cordoned first with `[sat] quarantine_cordon`)."""
        from sat_tasks.backends.kubernetes.quarantine import quarantined_for_launch
        from sat_tasks.io.object_storage import object_storage_hook

        return quarantined_for_launch(job, object_storage_hook(sat_setting("object_storage_conn_id")), self.log.info)

    def apply_pod_kwargs(self, kwargs: dict[str, Any]) -> None:
        """Set the attributes `KubernetesPodOperator.__init__` would derive from `kwargs`.

        Covers exactly what `build_pod_operator_kwargs` returns (an unknown key raises, so a
        new key there cannot be dropped silently); `deferrable` stays this task's own choice.
        """
        for key, value in kwargs.items():
            if key == "deferrable":
                continue
            if key == "on_finish_action":
                # The provider reads the public `on_finish_action` only; the private flag its `__init__`
                # derives from it (`_is_delete_operator_pod`, for a deprecated parameter) is read nowhere
                # (cncf.kubernetes 10.x) and is not written here (ADR 0007).
                self.on_finish_action = OnFinishAction(value)
            elif key == "on_kill_action":
                self.on_kill_action = OnKillAction(value)
            elif key == "startup_timeout_seconds":
                self.startup_timeout_seconds = value
                self.schedule_timeout_seconds = value
            elif key == "callbacks":
                self.callbacks = list(value or [])
            elif key in _PLAIN_ATTRIBUTES:
                setattr(self, key, value)
            else:
                raise TypeError(f"SatTrainingPodOperator cannot apply the operator argument {key!r}")
        self.pod_request_obj = None

    def create_rendezvous_service(self, job: TrainingJob, run_id: str, plan: Plan, ranks: int | None = None) -> bool:
        """Multi-node: create the attempt's headless Service (what `sat render` prints first), for `ranks` ranks.

        Every rank's task tries; the first creates it, the others find it (409). Without it
        rank 0's DNS name never resolves and the ranks cannot rendezvous. True when created.
        An elastic failover's rank 0 creates it before the other ranks look (`place_ranks`).
        """
        from kubernetes.client.exceptions import ApiException

        if not job.distributed:
            return False
        body = rendezvous_service(job, run_id=run_id, attempt=plan.attempt, namespace=self.target_namespace(),
                                  settings=KubernetesSettings.from_sat_config(), ranks=ranks)
        created = True
        try:
            self.client.create_namespaced_service(self.target_namespace(), body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = False
        # then the ranks' NetworkPolicy (what `sat render` prints next), before any pod: without it the namespace's
        # default deny keeps the ranks apart (ADR 0040)
        self.create_rendezvous_network_policy(job, run_id, plan)
        if created:
            self.log.info("created the rendezvous Service %s/%s", self.target_namespace(), body["metadata"]["name"])
        return created

    def create_rendezvous_network_policy(self, job: TrainingJob, run_id: str, plan: Plan) -> bool:
        """Multi-node: the attempt's NetworkPolicy letting its ranks reach one another (the namespace denies
        the rest: ADR 0040). Every rank's task tries; the first creates it, the others find it (409)."""
        from kubernetes.client import NetworkingV1Api
        from kubernetes.client.exceptions import ApiException

        body = rendezvous_network_policy(job, run_id=run_id, attempt=plan.attempt, namespace=self.target_namespace())
        try:
            NetworkingV1Api(self.client.api_client).create_namespaced_network_policy(self.target_namespace(), body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        self.log.info("created the rendezvous NetworkPolicy %s/%s", self.target_namespace(), body["metadata"]["name"])
        return True

    def create_attempt_credentials(self, job: TrainingJob, run_id: str, plan: Plan) -> bool:
        """The attempt's Secret with Object Storage credentials scoped to its run (ADR 0020); True when created.

        SAT's keys ask STS for them (`io.scoped_credentials`); the pods reference the Secret
        (`pods.training_key_env`), `cleanup_attempt` deletes it. Every rank's task tries; the
        first creates it, the others find it (409). Nothing with `[sat] scoped_credentials = off`.
        """
        from kubernetes.client.exceptions import ApiException

        from sat_tasks.backends.kubernetes.pods import attempt_credentials_secret
        from sat_tasks.io.object_storage import object_storage_hook
        from sat_tasks.io.scoped_credentials import (
            scoped_credentials_on,
            training_credentials,
        )

        if not scoped_credentials_on():
            self.log.warning("[sat] scoped_credentials = off: the training pods get the shared Object Storage "
                             "Secret and can read and write every job's data and results")
            return False
        hook = object_storage_hook(sat_setting("object_storage_conn_id"))
        credentials = training_credentials(JobRun(job, run_id), hook, plan.attempt, self.log.info)
        body = attempt_credentials_secret(job, run_id=run_id, attempt=plan.attempt,
                                          namespace=self.target_namespace(), credentials=credentials)
        try:  # the answer (the Secret with its keys) is not read: the client logs what it reads at DEBUG
            response = self.client.create_namespaced_secret(self.target_namespace(), body, _preload_content=False)
            getattr(response, "release_conn", lambda: None)()
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        self.log.info("created the attempt's credentials Secret %s/%s", self.target_namespace(),
                      body["metadata"]["name"])
        return True

    def ensure_pull_secret(self, job: TrainingJob, run_id: str) -> str | None:
        """The run's image pull Secret from the job's registry login, created or updated before this rank's pod
        (`pull_secret.ensure_pull_secret`, ADR 0032); its name, None when the job has no registry login."""
        from sat_tasks.backends.kubernetes.pull_secret import ensure_pull_secret

        return ensure_pull_secret(job, run_id, client=self.client, namespace=self.target_namespace(),
                                  log=self.log.info)

    def prepare(self, context: Context) -> tuple[TrainingJob, Plan]:
        """`build_plan`, then the pod of this rank onto the operator (before the provider builds it).

        An elastic failover's rank count is the one its Service says (rank 0 decided it before the pod).
        """
        from sat_tasks.backends.kubernetes.elastic import (
            needs_elastic_placement,
            read_attempt_ranks,
        )

        job, plan = self.build_plan(context)
        ranks = None
        if needs_elastic_placement(job, plan):
            ranks = read_attempt_ranks(self.client, self.target_namespace(), job, context["run_id"], plan.attempt)
        self.apply_pod_kwargs(self.build_pod_kwargs(job, context["run_id"], plan, ranks))
        return job, plan

    def place_ranks(self, job: TrainingJob, context: Context, plan: Plan,
                    quarantined: Sequence[str]) -> tuple[int, str]:
        """How many ranks this attempt runs, and the status history's words for a shrink ("" when none).

        Not an elastic failover: all, after the waits of today (`await_workspace`, `await_rank0`).
        An elastic failover (`elastic.needs_elastic_placement`): rank 0 decides (`elastic.place_elastic`;
        a decision its Service already holds stands, e.g. when its task runs again) and creates the
        Service with it before any pod; another rank waits for that Service (`elastic.await_attempt_ranks`).
        """
        from sat_tasks.backends.kubernetes.elastic import (
            RanksUndecided,
            await_attempt_ranks,
            needs_elastic_placement,
            place_elastic,
            read_attempt_ranks,
        )

        run_id, namespace = context["run_id"], self.target_namespace()
        if not needs_elastic_placement(job, plan):
            self.await_workspace(job, run_id, plan)
            self.await_rank0(job, context, plan)  # before the Service and this rank's pod
            return job.nodes, ""
        wait = float(job.elastic.wait_seconds) + float(sat_setting("workspace_wait_seconds"))
        if self.node_rank > 0:
            try:
                return await_attempt_ranks(self.client, namespace, job, run_id, plan.attempt, node_rank=self.node_rank,
                                           deadline_seconds=wait, rank0_ended=lambda: self.rank0_task_ended(context),
                                           poll_seconds=RANK0_POLL_SECONDS, log=self.log.info, sleep=time.sleep,
                                           clock=time.monotonic), ""
            except RanksUndecided as exc:
                raise AirflowFailException(str(exc)) from None
        ranks = read_attempt_ranks(self.client, namespace, job, run_id, plan.attempt)
        if ranks is not None:
            self.log.info("attempt %s runs on %s of %s nodes (decided by an earlier run of this task)",
                          plan.attempt, ranks, job.nodes)
            return ranks, ""
        placement = place_elastic(job, run_id, plan, client=self.client,
                                  history=JobRun(job, run_id).history(self.log.info), quarantined=quarantined,
                                  slots=self.pool_slots_held(job, context, plan), log=self.log.info,
                                  sleep=time.sleep, clock=time.monotonic)
        if placement.ranks == job.nodes:
            self.await_workspace(job, run_id, plan)  # no shrink: the full count waits as without elastic
        self.create_rendezvous_service(job, run_id, plan, placement.ranks)  # the decision, before any pod
        return placement

    def pool_slots_held(self, job: TrainingJob, context: Context, plan: Plan) -> Callable[[], int] | None:
        """Rank 0 in its workspace's pool (`workspace.launch_pool`): how many ranks hold their slots now; else None."""
        from sat_tasks.backends.kubernetes.elastic import ranks_with_slots
        from sat_tasks.backends.kubernetes.workspace import launch_pool

        pool = launch_pool(job, KubernetesSettings.from_sat_config(), attempt=plan.attempt).get("pool")
        if not pool or self.pool != pool or job.elastic is None:
            return None
        stem = self.task_id[: -len(rank_task_id(0))]
        ranks = {stem + rank_task_id(r): r for r in range(job.elastic.min_nodes, job.nodes)}
        ti, run_id = context.get("ti"), context["run_id"]

        def held() -> int:
            try:
                states = (ti.get_task_states(dag_id=ti.dag_id, task_ids=list(ranks), run_ids=[run_id]) or {})
            except Exception as exc:  # noqa: BLE001 - unreadable: count only rank 0's own slots
                self.log.warning("could not read the states of this attempt's rank tasks: %s", exc)
                states = {}
            mine = states.get(run_id) or {}
            return ranks_with_slots({r: state_name(mine.get(task_id)) for task_id, r in ranks.items()}, job)

        return held

    def await_workspace(self, job: TrainingJob, run_id: str, plan: Plan) -> None:
        """A failover in a workspace waits for healthy room there first (`workspace_wait`); rank 0 records why."""
        from sat_tasks.backends.kubernetes.workspace_wait import (
            WorkspaceFailoverTimeout,
            await_workspace_nodes,
            needs_workspace_wait,
        )

        if not needs_workspace_wait(job, plan):
            return
        history = JobRun(job, run_id).history(self.log.info) if self.node_rank == 0 else None
        try:
            await_workspace_nodes(job, run_id, plan, client=self.client, history=history,
                                  deadline_seconds=float(sat_setting("workspace_wait_seconds")), log=self.log.info)
        except WorkspaceFailoverTimeout as exc:
            raise AirflowFailException(str(exc)) from None

    def rank0_task_id(self) -> str | None:
        """The task id of rank 0's `launch` of this attempt (same task group: `attempt_<k>.launch`)."""
        suffix = rank_task_id(self.node_rank)
        if self.node_rank == 0 or not self.task_id.endswith(suffix):
            return None
        return self.task_id[: -len(suffix)] + rank_task_id(0)

    def rank0_pool(self, job: TrainingJob) -> str | None:
        """The workspace pool rank 0's `launch` queues in (`workspace.launch_pool`), for a rank > 0; else None.

        `KubernetesBackend.launch_operators` gives rank 0 the pool when the DAG is built; a
        rank 0 in this DAG without it (the generic DAG: spec known only at run time) does not
        queue, so there is nothing to wait for.
        """
        from sat_tasks.backends.kubernetes.workspace import launch_pool

        if self.node_rank == 0 or not job.distributed:
            return None
        pool = launch_pool(job, KubernetesSettings.from_sat_config()).get("pool")
        rank0_id = self.rank0_task_id()
        if pool and rank0_id and self.has_dag():
            rank0 = self.dag.task_dict.get(rank0_id)
            if rank0 is not None and rank0.pool != pool:
                return None
        return pool

    def rank0_task_ended(self, context: Context) -> str | None:
        """The state of rank 0's task of this attempt once it has ended; None while not (or unreadable)."""
        rank0_id = self.rank0_task_id()
        if rank0_id is None:
            return None
        return ended_task_state(context.get("ti"), context["run_id"], rank0_id)

    def await_rank0(self, job: TrainingJob, context: Context, plan: Plan) -> float:
        """A rank > 0 whose rank 0 queues in the workspace's pool waits for rank 0's pod (`await_rank0_pod`)."""
        pool = self.rank0_pool(job)
        if pool is None:
            return 0.0
        return await_rank0_pod(
            client=self.client, namespace=self.target_namespace(),
            rank0_pod=pod_name(job, context["run_id"], plan.attempt, 0), node_rank=self.node_rank,
            pool=pool, slots=job.nodes, deadline_seconds=float(sat_setting("workspace_wait_seconds")),
            rank0_ended=lambda: self.rank0_task_ended(context), log=self.log.info)

    def record_node_at_start(self, name: str | None, namespace: str | None) -> None:
        """Keep the labels of the node pod `name` runs on, on the pod (`evidence.record_node_at_start`).

        A node deleted by the end of the attempt (a Spot shutdown) is still known to have been
        Spot. Never fails the task: a line says what could not be read or written.
        """
        from sat_tasks.backends.kubernetes.evidence import record_node_at_start

        name, namespace = name or self.name, namespace or self.target_namespace()
        if name:
            try:
                record_node_at_start(self.client, namespace, name, self.log.info)
            except Exception as exc:  # noqa: BLE001 - evidence for classify, never a reason to fail the attempt
                self.log.warning("could not keep the labels of pod %s's node: %s", name, exc)

    # -- the provider's entry points ---------------------------------------------------------------
    def await_pod_start(self, pod: Any) -> None:
        """The provider's wait for the pod to start; then its node's labels are kept (also when it did not start)."""
        try:
            super().await_pod_start(pod)
        finally:
            metadata = getattr(pod, "metadata", None)
            self.record_node_at_start(getattr(metadata, "name", None), getattr(metadata, "namespace", None))

    def execute(self, context: Context) -> Any:
        job, plan = self.build_plan(context)
        run_id = context["run_id"]
        quarantined = self.quarantined_nodes(job)
        ranks, note = self.place_ranks(job, context, plan, quarantined)
        if self.node_rank >= ranks:  # an elastic failover on fewer nodes: this rank's slot goes back at once
            self.log.info("attempt %s resumes on %s of %s nodes: rank %s is not used (no pod)",
                          plan.attempt, ranks, job.nodes, self.node_rank)
            return None
        self.apply_pod_kwargs(self.build_pod_kwargs(job, run_id, plan, ranks, quarantined))
        self.create_rendezvous_service(job, run_id, plan, ranks)
        self.create_attempt_credentials(job, run_id, plan)
        self.ensure_pull_secret(job, run_id)
        if self.node_rank == 0:  # one Running entry per attempt
            pods = ", ".join(pod_name(job, run_id, plan.attempt, r) for r in range(ranks))
            where = f"{pods}; {note}" if note else ""  # an elastic shrink says so, in the local backend's words
            held = {"nodes_held": ranks} if job.elastic is not None else {}  # what the run's usage counts (ADR 0033)
            JobRun(job, run_id).record_attempt_start(plan, self.log.info, where=where, **held)
        return super().execute(context)

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        # A deferred task resumes in a freshly parsed operator: rebuild what execute set.
        self.prepare(context)
        # Deferred, the provider waits for the start in the triggerer: the node's labels are read
        # now (a node already gone has none to keep).
        self.record_node_at_start(event.get("name"), event.get("namespace"))
        return super().trigger_reentry(context, event)


# Operator attributes that `build_pod_operator_kwargs` sets and `__init__` stores unchanged.
_PLAIN_ATTRIBUTES = frozenset({
    "kubernetes_conn_id", "namespace", "name", "random_name_suffix", "full_pod_spec", "base_container_name",
    "termination_message_policy", "termination_grace_period", "get_logs", "log_events_on_failure",
    "do_xcom_push",
})


def make_launch_operators(
    *,
    attempt: int,
    previous_decide_task_id: str | None,
    job: TrainingJob | None,
    max_nodes: int = 1,
    **kwargs: Any,
) -> list[SatTrainingPodOperator]:
    """The `launch` task(s) of attempt `attempt` (call inside its TaskGroup): one per node rank.

    Task ids `launch`, `launch_rank_1`, ...; all go upstream of `classify`. `job` None (the
    generic DAG, spec known only at run time): `max_nodes` rank tasks; ranks beyond the
    job's `nodes` are skipped and a job asking for more fails `launch`. `kwargs` go to
    every operator (e.g. `namespace`).
    """
    ranks = job.nodes if job is not None else max_nodes
    return [
        SatTrainingPodOperator(
            task_id=rank_task_id(rank), attempt=attempt, previous_decide_task_id=previous_decide_task_id,
            node_rank=rank, max_nodes=ranks, **kwargs,
        )
        for rank in range(ranks)
    ]
