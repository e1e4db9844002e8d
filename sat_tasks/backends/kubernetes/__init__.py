"""The Kubernetes backend (production): attempts as pods, one per node rank, launched by KubernetesPodOperator.

Modules: `settings` (cluster conventions), `names` (names and labels), `supervisor` (PID 1,
the launch command, probes), `pods` (the attempt's pods, Service and the run's claim: the
one source `sat render` prints), `operator` (the `launch` task), `records` (reading the
kept pods into an AttemptRecord), `staging` (helper pods: staging and upload),
`capacity` (Spot capacity), `cleanup` (deleting what SAT created), `client` (the API
client from the Airflow connection), `evidence` (what classify reads besides the pod: the
events of its node, NodeClaim and Kueue Workload in the attempt's window, and the node's
labels kept at start), `elastic` (an elastic job's failover on fewer nodes: how many ranks,
ADR 0029). ADR 0007 explains the choices.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sat_tasks.backends.base import (
    Backend,
    BackendCapabilities,
    Capacity,
    Claim,
    DataCheck,
    KeepsWarm,
    LiveLogSource,
    ProbesNodes,
    ReleasesNodes,
    WarmState,
    WatchesGrowth,
)
from sat_tasks.core.attempt import AttemptRecord
from sat_tasks.core.clock import parse_time
from sat_tasks.core.handoffs import Decision, Log, Plan
from sat_tasks.core.health_check import ProbeResult
from sat_tasks.core.live_log import LiveCursor, LiveLog
from sat_tasks.core.status import JobStatus
from sat_tasks.errors import JobStopped
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import BaseOperator
    from kubernetes.client import CoreV1Api, SchedulingV1Api



class KubernetesBackend(Backend, WatchesGrowth, KeepsWarm, LiveLogSource, ReleasesNodes, ProbesNodes):
    """The Backend protocol on a cluster (see `sat_tasks.backends.base` for the call order).

    `client` is a CoreV1Api; by default the provider's KubernetesHook on `[sat]
    kubernetes_conn_id`, made when first needed. Tests pass a recording fake. `scheduling`
    is a SchedulingV1Api (the warm pool's PriorityClass); by default on `client`'s
    connection when one was passed, else on the same Airflow connection.
    """

    kind = "kubernetes"
    capabilities = BackendCapabilities(
        pulls_images=True,
        watches_stop_request=False,  # Stop ends the DAG run; the launch task's on_kill deletes the pods with their grace
        injects_faults=False,
        workspace_pool=True,  # without Kueue, rank 0's launch takes a slot per node (`workspace.launch_pool`)
        grow_watch=True,  # the launch is deferred while the pods run: a sensor watches for capacity (ADR 0029)
        warm_pool=True,  # the run's claim and placeholder pods (ADR 0015)
        live_log=True,  # a running pod's log is read from the API server until the attempt's section is stored
        node_release=True,  # a released node SAT cordoned is uncordoned (`[sat] quarantine_cordon`)
        node_probe=True,  # a probe pod bound to the suspect node (`kubernetes.probe`)
    )
    task_modules = ("sat_tasks.backends.kubernetes.operator", "sat_tasks.backends.kubernetes.workspace")

    def __init__(self, client: CoreV1Api | None = None, namespace: str | None = None,
                 scheduling: SchedulingV1Api | None = None) -> None:
        self._client = client
        self._namespace = namespace
        self._scheduling = scheduling

    @property
    def client(self) -> CoreV1Api:
        if self._client is None:
            from sat_tasks.backends.kubernetes.client import core_v1_client

            return core_v1_client()
        return self._client

    @property
    def scheduling(self) -> SchedulingV1Api:
        if self._scheduling is None:
            from sat_tasks.backends.kubernetes.client import scheduling_v1_client

            return scheduling_v1_client(core=self._client)
        return self._scheduling

    @property
    def namespace(self) -> str:
        from sat_tasks.backends.kubernetes.client import namespace

        return self._namespace or namespace()

    # ---- before training -----------------------------------------------------------------------
    def stage(self, run: JobRun, log: Log, reuse: Claim | None = None) -> dict[str, Any]:
        """Create the run's claim (once) and its image pull Secret (ADR 0032), then fill the claim with the staging pod; its report.

        `reuse` (a warm-pool Claim) with a kept volume claim: the staging pod copies the
        unchanged objects from it (`staging.WarmSource`) instead of downloading them.
        """
        from sat_tasks.backends.kubernetes.pull_secret import ensure_pull_secret
        from sat_tasks.backends.kubernetes.staging import (
            WarmSource,
            ensure_run_volume,
            stage_into_volume,
        )

        client, namespace = self.client, self.namespace
        if ensure_run_volume(run.job, run.run_id, client=client, namespace=namespace):
            log(f"created the run volume claim in {namespace}")
        ensure_pull_secret(run.job, run.run_id, client=client, namespace=namespace, log=log)  # before any pod
        warm = (WarmSource(reuse.volume, reuse.state.run_id, dict(reuse.objects))
                if reuse is not None and reuse.volume else None)
        return stage_into_volume(run.job, run.run_id, client=client, namespace=namespace, log=log, warm=warm)

    def check_staged_data(self, run: JobRun, staged: dict[str, Any] | None, log: Log) -> DataCheck:
        """The staging pod ran the suite where the data is (`stage --validate`): read its result."""
        result = (staged or {}).get("validation")
        if result is None:
            raise JobStopped("the staging pod reported no data validation result")
        return DataCheck(bool(result.get("success")), list(result.get("summary_lines", [])), result)

    # ---- attempts ------------------------------------------------------------------------------
    def launch_operators(self, *, attempt: int, previous_decide_task_id: str | None,
                         job: TrainingJob | None) -> list[BaseOperator]:
        from sat_tasks.backends.kubernetes.operator import make_launch_operators
        from sat_tasks.backends.kubernetes.settings import KubernetesSettings
        from sat_tasks.backends.kubernetes.workspace import launch_pool

        operators = make_launch_operators(attempt=attempt, previous_decide_task_id=previous_decide_task_id, job=job)
        # A workspace job without Kueue queues in its workspace's Airflow pool: rank 0 takes a slot per node
        # (an elastic job's later attempts: a slot per rank it may drop, `workspace.launch_pool`).
        settings = KubernetesSettings.from_sat_config()
        for operator in operators:
            pool = launch_pool(job, settings, attempt=attempt, node_rank=operator.node_rank)
            if pool:
                operator.pool, operator.pool_slots = pool["pool"], pool["pool_slots"]
        return operators

    def read_attempt_record(self, run: JobRun, attempt: int, log: Log) -> AttemptRecord | None:
        from sat_tasks.backends.kubernetes.records import read_attempt_record

        return read_attempt_record(run, attempt, client=self.client, namespace=self.namespace, log=log)

    def cleanup_attempt(self, run: JobRun, attempt: int, log: Log) -> list[str]:
        from sat_tasks.backends.kubernetes.cleanup import cleanup_attempt

        return cleanup_attempt(self.client, run.job, run_id=run.run_id, attempt=attempt, namespace=self.namespace)

    def watch_growth(self, run: JobRun, plan: Plan, log: Log) -> bool:
        """`elastic.check_growth` with the node health ledger's word, then `elastic.request_growth` (ADR 0029).

        Nodes count again when a person released them in the ledger after the attempt started
        (its Running entry in the status history).
        """
        from sat_tasks.backends.kubernetes.elastic import check_growth, request_growth
        from sat_tasks.io.node_ledger import NodeLedger

        job = run.job
        started = [e for e in run.history(log).entries()
                   if e.get("attempt") == plan.attempt and e.get("status") == JobStatus.RUNNING.value]
        at = parse_time(started[0].get("at")) if started else None
        since = at.timestamp() if at is not None else None
        quarantined: list[str] = []
        released: list[str] = []
        if since is not None and job.elastic is not None:
            try:
                ledger = NodeLedger.for_job(job, run.hook())
                quarantined = list(ledger.quarantined())
                released = sorted({r.node for r in ledger.releases() if r.at >= since})
            except Exception as exc:  # noqa: BLE001 - without the ledger nothing is readmitted; capacity still counts
                log(f"[sat] elastic: could not read the node health ledger ({type(exc).__name__}: {exc})")
        growth = check_growth(job, run.run_id, plan, client=self.client, namespace=self.namespace,
                              quarantined=quarantined, released=released, log=log)
        if growth.grow is not None:
            request_growth(self.client, self.namespace, plan.attempt, growth, log=log)
        elif growth.done:
            log(f"[sat] elastic: not watching attempt {plan.attempt} for capacity to grow back: {growth.why}")
        return growth.done

    def capacity(self, run: JobRun, decision: Decision, log: Log) -> Capacity:
        """Ask the cluster for nodes a rank of the next attempt fits on (`capacity.cluster_capacity`)."""
        from sat_tasks.backends.kubernetes.capacity import (
            CapacityForbidden,
            cluster_capacity,
        )

        try:
            assessment = cluster_capacity(run.job, run.run_id, Plan(attempt=decision.attempt + 1,
                                                                    exclude_nodes=list(decision.exclude_nodes)),
                                          client=self._client, log=log)
        except CapacityForbidden as exc:
            raise JobStopped(str(exc)) from None
        if assessment is None:
            return Capacity(False, "the Kubernetes API did not answer; asking again")
        return Capacity(assessment.available, assessment.summary())

    # ---- after training ------------------------------------------------------------------------
    def upload_outputs(self, run: JobRun, log: Log) -> dict[str, Any]:
        """The outputs are on the run's claim: an upload pod copies them to `run.output_uri`.

        The run's pull Secret is made again first (an operator may have deleted it, or the login changed).
        """
        from sat_tasks.backends.kubernetes.pull_secret import ensure_pull_secret
        from sat_tasks.backends.kubernetes.staging import upload_from_volume

        client, namespace = self.client, self.namespace
        ensure_pull_secret(run.job, run.run_id, client=client, namespace=namespace, log=log)
        return upload_from_volume(run.job, run.run_id, client=client, namespace=namespace, log=log)

    def job_log(self, run: JobRun, log: Log) -> Path | None:
        """The job log assembled from the attempts' sections that classify stored."""
        from sat_tasks.backends.kubernetes.records import assemble_job_log

        return assemble_job_log(run)

    def live_log(self, run: JobRun, *, stored: Collection[int], cursor: LiveCursor | None, limit: int,
                 lines: int) -> LiveLog | None:
        """The running attempt's section from its rank-0 pod, in bounded reads (`pod_log`)."""
        from sat_tasks.backends.kubernetes.pod_log import live_log

        return live_log(self.client, self.namespace, run, stored=stored, cursor=cursor, limit=limit, lines=lines)

    def cleanup_run(self, run: JobRun, log: Log, *, keep_warm: bool = False) -> list[str]:
        """Delete the run's claim, helper pods and anything an attempt left (once the outputs are uploaded).

        A run that is kept warm (ADR 0015) keeps its claim: `keep_warm` records it for the next run.
        """
        from sat_tasks.backends.kubernetes.cleanup import cleanup_run

        return cleanup_run(self.client, run.job, run_id=run.run_id, namespace=self.namespace, keep_claim=keep_warm)

    def release_node(self, node: str, log: Log) -> bool:
        """Uncordon the node when `[sat] quarantine_cordon` is on and SAT's taint is on it (RBAC: patch nodes)."""
        from sat_tasks.backends.kubernetes.quarantine import uncordon_released

        return uncordon_released(node, log)

    def probe_node(self, run: JobRun, node: str, log: Log) -> ProbeResult:
        """A probe pod bound to `node`, in SAT's staging image (`kubernetes.probe`; RBAC: create/get/delete pods and
        get their log in the jobs' namespace, which the launcher already has)."""
        from sat_tasks.backends.kubernetes.probe import probe_node
        from sat_tasks.backends.kubernetes.settings import KubernetesSettings

        return probe_node(run.job, run.run_id, node, client=self.client, namespace=self.namespace,
                          settings=KubernetesSettings.from_sat_config(), log=log)

    # ---- warm pool (ADR 0015) ------------------------------------------------------------------
    def keep_warm(self, run: JobRun, state: WarmState, log: Log) -> WarmState:
        """Placeholder pods on the run's nodes (PriorityClass ensured) and the run's claim, which `cleanup_run` kept."""
        from sat_tasks.backends.kubernetes import names
        from sat_tasks.backends.kubernetes.settings import KubernetesSettings
        from sat_tasks.backends.kubernetes.warm import keep_warm

        return keep_warm(self.client, self.namespace, run.job, run.run_id, state,
                         KubernetesSettings.from_sat_config(), log, scheduling=self.scheduling,
                         claim=names.run_volume_claim_name(run.job, run.run_id))

    def release_warm(self, state: WarmState, log: Log) -> list[str]:
        from sat_tasks.backends.kubernetes.warm import release_warm

        return release_warm(self.client, self.namespace, state, log)

    def workspace_queue_problem(self, job: TrainingJob, *, spec_with_run: bool, log: Log) -> str | None:
        """Kueue queues every workspace job; without it a generic-DAG run has no pool (`check_generic_run`)."""
        from sat_tasks.backends.kubernetes.settings import KubernetesSettings
        from sat_tasks.backends.kubernetes.workspace import check_generic_run

        if not spec_with_run:
            return None
        try:
            check_generic_run(job, KubernetesSettings.from_sat_config(), log)
        except ValueError as exc:
            return str(exc)
        return None


BACKEND = KubernetesBackend()
__all__ = ["BACKEND", "KubernetesBackend"]
