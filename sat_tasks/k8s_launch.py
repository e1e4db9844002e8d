"""The kubernetes backend in the DAG: launch an attempt's pods, read what they left behind, clean up.

Call order for attempt k (the DAG factory does the wiring, inside the `attempt_<k>` group):

1. ``make_launch_operator(attempt=k, previous_decide_task_id=..., job=...)``: the `launch`
   task(s), ``SatTrainingPodOperator`` (the provider's ``KubernetesPodOperator`` building the
   pod that ``sat_tasks.k8s`` renders, kept when it finishes). Multi-node: one per node rank
   (`launch`, `launch_rank_1`, ...); a failed rank tears the others down (gang callback).
2. ``read_attempt_record(job, run_id, k)`` in `classify` (``trigger_rule=ALL_DONE``), before
   ``pipeline.classify_attempt``: reads the kept pod(s), their events, the node and the log
   tail through the Kubernetes API, builds one ``AttemptRecord`` for the whole attempt and
   stores it where ``classify_attempt`` and the report look (the same place as the local
   backend's record).
3. ``cleanup_attempt_pods(job, run_id, k)`` once the record is stored: deletes the attempt's
   pods and rendezvous Service.

Importing this module imports the provider (and with it the kubernetes client): the DAG
factory imports it only when the backend is `kubernetes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.utils.pod_manager import OnFinishAction, OnKillAction
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from sat_tasks import k8s, pipeline
from sat_tasks.attempt import MAIN_CONTAINER_NAME, AttemptRecord, record_from_pod
from sat_tasks.local_backend import job_log_footer, job_log_header, now_utc
from sat_tasks.paths import sat_setting
from sat_tasks.spec import TrainingJob

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import BaseOperator
    from airflow.sdk.definitions.context import Context

__all__ = [
    "PodLog",
    "SatTrainingPodOperator",
    "cleanup_attempt_pods",
    "combine_rank_records",
    "core_v1_client",
    "make_launch_operator",
    "progress_from_log",
    "read_attempt_record",
    "rank_task_id",
    "write_rank_log",
]

Log = Callable[[str], None]

#: Bounds on the container log read per pod: the last `LOG_READ_LINES` lines, of which the last
#: `LOG_READ_BYTES` bytes. All of it goes to the run's job.log and is searched for the engine's
#: progress lines; the record keeps the last `attempt.LOG_TAIL_LINES`.
LOG_READ_LINES = 100_000
LOG_READ_BYTES = 16 * 2**20
_LOG_CHUNK = 1 << 16
#: Node events older than this before the pod started are about an earlier workload.
NODE_EVENT_SLACK = timedelta(seconds=60)
#: Node objects' events live in this namespace (kubelet, node-problem-detector).
NODE_EVENT_NAMESPACE = "default"

# The checkpoint engine's log lines (ckpt_engine.engine / ckpt_engine.hf). On Kubernetes its
# progress.json lives on the run volume, out of the scheduler's reach; the log says the same.
_COMMITTED_RE = re.compile(r"\[Concurrent Checkpoint\] committed checkpoint-(\d+)")
_RESUMED_RE = re.compile(r"\[Concurrent Checkpoint\] Resuming from checkpoint-(\d+)")
_STEP_RE = re.compile(r"\bcheckpoint-(\d+)\b")

# Verdict reasons of `classify` that a healthy rank shows when a *peer* (or the network
# between them) failed, and the exit of a rank stopped from outside by the gang teardown.
# A rank with such a verdict only does not decide a multi-node attempt while another rank
# has evidence of its own.
_PEER_SYMPTOM_REASONS = re.compile(
    r"NCCL network error|NCCL remote error|InfiniBand transport error|gloo network error"
    r"|collective operation hung|NCCL system error on a socket|killed by SIG(?:TERM|KILL|HUP) from outside"
)


# ---- the launch task ---------------------------------------------------------------------------
def rank_task_id(node_rank: int) -> str:
    """`launch` for rank 0, `launch_rank_<r>` for the other ranks of a multi-node attempt."""
    return "launch" if node_rank == 0 else f"launch_rank_{node_rank}"


class SatTrainingPodOperator(KubernetesPodOperator):
    """The `launch` task of one attempt (one node rank) on the kubernetes backend.

    Call order (`execute`): read the validated spec and the previous `decide` from XCom,
    `plan_attempt` (not needed -> skipped), build the operator kwargs of `sat_tasks.k8s`
    for this rank, apply them, record `Running` (rank 0), then the provider's `execute`
    creates the pod, follows its log and keeps the pod when it ends (a failed pod fails the
    task; `classify` runs anyway and reads the kept pod).

    Everything that depends on the run (the pod, its name, node exclusions, `CKPT_LAST_STEP`)
    is built at `execute`, never at parse time, and never through Jinja. The pod gets no
    secret: the image pull Secret is referenced by name only.

    Args:
        attempt: 1-based attempt number.
        previous_decide_task_id: task id of the previous attempt's `decide` (None for attempt 1).
        node_rank: the node rank this task launches (0 = rendezvous host).
        max_nodes: the number of rank tasks the DAG has for this attempt; a job asking for
            more nodes fails rank 0, ranks beyond the job's `nodes` are skipped. None: no check.
        spec_task_id: task id whose XCom is the validated spec (`TrainingJob.to_dict()`).
        pvc_name: an existing claim instead of the run's own (`k8s.run_volume_claim_name`).
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
        super().__init__(namespace=namespace, kubernetes_conn_id=kubernetes_conn_id, deferrable=deferrable,
                         on_finish_action="keep_pod", **kwargs)
        self.attempt = attempt
        self.previous_decide_task_id = previous_decide_task_id
        self.node_rank = node_rank
        self.max_nodes = max_nodes
        self.spec_task_id = spec_task_id
        self.pvc_name = pvc_name

    # -- steps ---------------------------------------------------------------------------------
    def build_plan(self, context: Context) -> tuple[TrainingJob, dict]:
        """The job and this attempt's plan; AirflowSkipException when this task has nothing to do."""
        ti = context["ti"]
        spec = ti.xcom_pull(task_ids=self.spec_task_id)
        if spec is None:
            raise AirflowSkipException("no validated spec (validate_spec did not succeed)")
        job = TrainingJob.model_validate(spec)
        if self.max_nodes is not None and job.nodes > self.max_nodes:
            if self.node_rank == 0:
                raise AirflowFailException(
                    f"job {job.name} asks for {job.nodes} nodes; this DAG launches at most {self.max_nodes}")
            raise AirflowSkipException(f"job {job.name} cannot run on this DAG ({job.nodes} nodes)")
        if self.node_rank >= job.nodes:
            raise AirflowSkipException(f"rank {self.node_rank} is not used by a {job.nodes}-node job")
        previous = ti.xcom_pull(task_ids=self.previous_decide_task_id) if self.previous_decide_task_id else None
        try:
            plan = pipeline.plan_attempt(job, self.attempt, previous)
        except pipeline.NotApplicable as exc:
            raise AirflowSkipException(str(exc)) from None
        return job, plan

    def build_pod_kwargs(self, job: TrainingJob, run_id: str, plan: dict) -> dict[str, Any]:
        """`k8s.build_pod_operator_kwargs` for this rank and plan."""
        return k8s.build_pod_operator_kwargs(
            job,
            run_id=run_id,
            attempt=plan["attempt"],
            exclude_nodes=plan["exclude_nodes"],
            resume_step=plan["resume_step"],
            namespace=self.namespace or sat_setting("kubernetes_namespace"),
            kubernetes_conn_id=self.kubernetes_conn_id or sat_setting("kubernetes_conn_id"),
            node_rank=self.node_rank,
            pvc_name=self.pvc_name,
            deferrable=self.deferrable,
        )

    def apply_pod_kwargs(self, kwargs: dict[str, Any]) -> None:
        """Set the attributes `KubernetesPodOperator.__init__` would derive from `kwargs`.

        Covers exactly what `build_pod_operator_kwargs` returns (an unknown key raises, so a
        new key there cannot be dropped silently); `deferrable` stays this task's own choice.
        """
        for key, value in kwargs.items():
            if key == "deferrable":
                continue
            if key == "on_finish_action":
                self.on_finish_action = OnFinishAction(value)
                self._is_delete_operator_pod = self.on_finish_action == OnFinishAction.DELETE_POD
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

    def record_start(self, job: TrainingJob, run_id: str, plan: dict) -> None:
        """Job status Running in the run's history (rank 0 only: one entry per attempt)."""
        if self.node_rank != 0:
            return
        attempt = plan["attempt"]
        history = pipeline.JobRun(job, run_id).history(self.log.info)
        history.record(pipeline.JobStatus.RUNNING, f"attempt {attempt} started", attempt=attempt, task="launch")
        if plan["exclude_nodes"]:
            self.log.info("avoiding nodes of failed attempts: %s", ", ".join(plan["exclude_nodes"]))
        if plan["resume_step"] is not None:
            self.log.info("resuming with CKPT_LAST_STEP=%s", plan["resume_step"])

    def prepare(self, context: Context) -> tuple[TrainingJob, dict]:
        """`build_plan`, then the pod of this rank onto the operator (before the provider builds it)."""
        job, plan = self.build_plan(context)
        self.apply_pod_kwargs(self.build_pod_kwargs(job, context["run_id"], plan))
        return job, plan

    # -- the provider's entry points ---------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        job, plan = self.prepare(context)
        self.record_start(job, context["run_id"], plan)
        return super().execute(context)

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        # A deferred task resumes in a freshly parsed operator: rebuild what execute set.
        self.prepare(context)
        return super().trigger_reentry(context, event)


# Operator attributes that `build_pod_operator_kwargs` sets and `__init__` stores unchanged.
_PLAIN_ATTRIBUTES = frozenset({
    "kubernetes_conn_id", "namespace", "name", "random_name_suffix", "full_pod_spec", "base_container_name",
    "termination_message_policy", "termination_grace_period", "get_logs", "log_events_on_failure",
    "do_xcom_push",
})


def make_launch_operator(
    *,
    attempt: int,
    previous_decide_task_id: str | None,
    job: TrainingJob | None,
    max_nodes: int = 1,
    **kwargs: Any,
) -> BaseOperator | list[BaseOperator]:
    """The `launch` task(s) of attempt `attempt` on the kubernetes backend (call inside its TaskGroup).

    One node (or `job` None with `max_nodes` 1): one operator, task id `launch`. A job with
    `nodes >= 2`: a list, one operator per rank (`launch`, `launch_rank_1`, ...), all
    upstream of `classify`. `job` None (the generic DAG, spec known only at run time): pass
    `max_nodes` to get that many rank tasks; ranks beyond the job's `nodes` are skipped and
    a job asking for more fails `launch`. `kwargs` go to every operator (e.g. `namespace`).
    """
    ranks = job.nodes if job is not None else max_nodes
    operators = [
        SatTrainingPodOperator(
            task_id=rank_task_id(rank), attempt=attempt, previous_decide_task_id=previous_decide_task_id,
            node_rank=rank, max_nodes=ranks, **kwargs,
        )
        for rank in range(ranks)
    ]
    return operators[0] if len(operators) == 1 else operators


# ---- the record --------------------------------------------------------------------------------
def core_v1_client(kubernetes_conn_id: str | None = None) -> Any:
    """A CoreV1Api from the Airflow Kubernetes connection (default `[sat] kubernetes_conn_id`)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=kubernetes_conn_id or sat_setting("kubernetes_conn_id")).core_v1_client


def _as_dict(obj: Any) -> dict[str, Any]:
    """A kubernetes client model as the API's JSON (camelCase keys, ISO timestamps)."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def progress_from_log(lines: Sequence[str]) -> dict[str, Any] | None:
    """The engine's progress as its log shows it: last committed step, step resumed from."""
    committed = resumed = None
    for line in lines:
        if _COMMITTED_RE.search(line):
            committed = int(_COMMITTED_RE.search(line).group(1))
        elif _RESUMED_RE.search(line):
            resumed = int(_RESUMED_RE.search(line).group(1))
    if committed is None and resumed is None:
        return None
    progress: dict[str, Any] = {"source": "log"}
    # A resumed attempt that has not committed yet still has the checkpoint it resumed from.
    progress["last_committed_step"] = committed if committed is not None else resumed
    if resumed is not None:
        progress["resumed_from_step"] = resumed
    return progress


def _parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _event_time(event: dict[str, Any]) -> datetime | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        moment = _parse_time(event.get(key))
        if moment:
            return moment
    return _parse_time((event.get("metadata") or {}).get("creationTimestamp"))


def _read_events(client: Any, namespace: str, field_selector: str, log: Log) -> list[dict[str, Any]]:
    from kubernetes.client.exceptions import ApiException

    try:
        items = client.list_namespaced_event(namespace, field_selector=field_selector).items
    except ApiException as exc:
        log(f"events {field_selector} in {namespace}: not readable ({exc.status} {exc.reason})")
        return []
    events = [_as_dict(item) for item in items]
    events.sort(key=lambda e: (_event_time(e) is not None, _event_time(e) or datetime.min))
    return events


def _read_node(client: Any, name: str, log: Log) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return _as_dict(client.read_node(name))
    except ApiException as exc:
        log(f"node {name}: not readable ({exc.status} {exc.reason}); "
            + ("it no longer exists" if exc.status == 404 else "no node conditions in the record"))
        return None


@dataclass(frozen=True)
class PodLog:
    """What could be read of one pod's container log: its lines and, if any, why it is not all there."""

    lines: list[str]
    note: str | None = None


def _read_bounded(response: Any, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of a raw (not preloaded) response; True when more came."""
    chunks = response.stream(_LOG_CHUNK) if hasattr(response, "stream") else [response.data]
    kept, clipped = bytearray(), False
    for chunk in chunks:
        kept += chunk
        if len(kept) > limit:
            del kept[: len(kept) - limit]
            clipped = True
    return bytes(kept), clipped


def _unreadable(exc: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        why = {404: "the pod no longer exists", 400: "the container never started"}.get(exc.status)
        return f"{exc.status} {exc.reason}" + (f": {why}" if why else "")
    return f"{type(exc).__name__}: the API server did not answer"


def _read_log(client: Any, name: str, namespace: str, log: Log) -> PodLog:
    """The pod's container log, bounded by `LOG_READ_LINES` and `LOG_READ_BYTES` (the newest part).

    A log that cannot be read (pod deleted, container never started, API error) gives no
    lines and a note saying why; it never raises.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    response = None
    try:
        # Raw bytes, decoded here: with content preloading kubernetes 36 returns the repr of
        # the bytes ("b'...'"), kubernetes-client/python#2596. One line more than kept tells
        # whether the line bound cut the log.
        response = client.read_namespaced_pod_log(name, namespace, container=MAIN_CONTAINER_NAME,
                                                  tail_lines=LOG_READ_LINES + 1, _preload_content=False)
        data, clipped = _read_bounded(response, LOG_READ_BYTES)
    except (ApiException, HTTPError, OSError) as exc:
        why = _unreadable(exc)
        log(f"pod {name}: no container log ({why})")
        return PodLog([], f"container log not readable ({why})")
    finally:
        release = getattr(response, "release_conn", None)
        if release is not None:
            release()
    lines = data.decode("utf-8", errors="replace").splitlines()
    note = None
    if clipped:
        lines = lines[1:]  # the first line was cut by the byte bound
        size = f"{LOG_READ_BYTES // 2**20} MiB" if LOG_READ_BYTES % 2**20 == 0 else f"{LOG_READ_BYTES} bytes"
        note = f"log cut to its last {size} (LOG_READ_BYTES); earlier lines are not kept"
    elif len(lines) > LOG_READ_LINES:
        lines = lines[-LOG_READ_LINES:]
        note = f"log cut to its last {LOG_READ_LINES} lines (LOG_READ_LINES); earlier lines are not kept"
    if note:
        log(f"pod {name}: {note}")
    return PodLog(lines, note)


def _rank_of(pod: dict[str, Any]) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(k8s.LABEL_NODE_RANK, 0))
    except ValueError:
        return 0


def _read_rank(client: Any, pod: dict[str, Any], job: TrainingJob, attempt: int, namespace: str,
               log: Log) -> tuple[AttemptRecord, PodLog]:
    """The record of one pod (one node rank): pod, its events, its node and node events, log tail;
    and the container log it read (for the run's job.log)."""
    name = pod["metadata"]["name"]
    events = _read_events(client, namespace, f"involvedObject.name={name}", log)
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = None
    if node_name:
        node = _read_node(client, node_name, log)
        started = _parse_time((pod.get("status") or {}).get("startTime"))
        node_events = _read_events(client, NODE_EVENT_NAMESPACE,
                                   f"involvedObject.kind=Node,involvedObject.name={node_name}", log)
        # Node events from before this pod are about an earlier workload (e.g. a stale Xid).
        events += [e for e in node_events
                   if started is None or _event_time(e) is None or _event_time(e) >= started - NODE_EVENT_SLACK]
    pod_log = _read_log(client, name, namespace, log)
    record = record_from_pod(pod, job=job.name, attempt=attempt, log=pod_log.lines, events=events, node=node,
                             progress=progress_from_log(pod_log.lines), container=MAIN_CONTAINER_NAME)
    return record, pod_log


def write_rank_log(handle: TextIO, *, job: TrainingJob, attempt: int, pod: dict[str, Any],
                   record: AttemptRecord, pod_log: PodLog) -> None:
    """One rank's part of the attempt's job-log section: header, its container log, footer.

    The header and footer are the local backend's (`job_log_header` / `job_log_footer`); the
    pod's own first line carries `Starting dataset initialization`, so the header names the
    pod instead. A log that was cut or could not be read gets a `[sat]` line saying so.
    """
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    name, rank = metadata.get("name"), _rank_of(pod)
    started = (record.started_at or _parse_time(status.get("startTime"))
               or _parse_time(metadata.get("creationTimestamp")) or now_utc())
    node = record.node or (pod.get("spec") or {}).get("nodeName")
    handle.write(job_log_header(job=job.name, attempt=attempt, node=node, at=started,
                                note=f"log of pod {name} (rank {rank}) follows") + "\n")
    if pod_log.note:
        handle.write(f"{now_utc().isoformat()} [sat] pod {name}: {pod_log.note}\n")
    handle.writelines(line + "\n" for line in pod_log.lines)
    reason = f", {record.termination_reason}" if record.termination_reason else ""
    handle.write(job_log_footer(attempt=attempt, at=record.finished_at or now_utc(), exit_code=record.exit_code,
                                note=f"rank {rank}, pod {name}{reason}") + "\n")


def combine_rank_records(records: Sequence[AttemptRecord], log: Log = print) -> AttemptRecord:
    """The record that speaks for a multi-node attempt (records in rank order).

    Precedence: a pre-empted rank; a rank with hardware evidence of its own; a rank whose
    image could not be pulled; a rank with an internal error of its own; a rank that only
    shows a peer's failure (NCCL/gloo network errors, stopped from outside); a rank that
    stopped because another rank got SIGTERM (the one that got it comes first); else
    (every rank succeeded) rank 0. The chosen rank's node is the one a failover avoids. Its progress is
    the newest checkpoint every rank that logged commits has committed.
    """
    from sat_tasks.classify import PEER_STOP_REASON, VerdictKind, classify

    if len(records) == 1:
        return records[0]
    verdicts = [classify(record) for record in records]

    def order(index: int) -> int:
        verdict = verdicts[index]
        peer_only = verdict.kind is VerdictKind.HARDWARE and bool(_PEER_SYMPTOM_REASONS.search(verdict.reason))
        if verdict.kind is VerdictKind.HARDWARE:
            if verdict.reason.startswith(PEER_STOP_REASON):
                return 5
            return 4 if peer_only else 1
        return {VerdictKind.PREEMPTED: 0, VerdictKind.IMAGE_PULL: 2, VerdictKind.INTERNAL: 3,
                VerdictKind.SUCCEEDED: 6}[verdict.kind]

    chosen = min(range(len(records)), key=lambda i: (order(i), i))
    for rank, verdict in enumerate(verdicts):
        log(f"rank {rank} on {records[rank].node}: {verdict.kind.value} — {verdict.reason}")
    log(f"rank {chosen} decides the attempt")
    committed = [r.last_committed_step for r in records if r.last_committed_step is not None]
    progress = dict(records[chosen].progress or {})
    if committed:
        progress["last_committed_step"] = min(committed)
    return records[chosen].model_copy(update={"progress": progress or None})


def read_attempt_record(
    job: TrainingJob,
    run_id: str,
    attempt: int,
    *,
    client: Any = None,
    namespace: str | None = None,
    kubernetes_conn_id: str | None = None,
    log: Log = print,
) -> AttemptRecord | None:
    """Read the kept pod(s) of an attempt, build its record and store it for `classify_attempt`.

    `client` is a CoreV1Api (default: from `kubernetes_conn_id`); None when the attempt has
    no pod (it never launched). The container log comes from the API (bounded by
    `LOG_READ_LINES` / `LOG_READ_BYTES`), the engine's progress from its log lines; the
    node's kernel log is not reachable through the API (node-problem-detector events carry
    Xids instead). Every rank's log also goes into the attempt's section of the run's
    job.log (`write_rank_log`), stored next to the record (`pipeline.store_attempt_log`);
    `pipeline.upload_job_log` assembles and uploads the job log.
    """
    client = client if client is not None else core_v1_client(kubernetes_conn_id)
    namespace = namespace or sat_setting("kubernetes_namespace")
    selector = k8s.attempt_label_selector(job, run_id, attempt)
    pods = [_as_dict(pod) for pod in client.list_namespaced_pod(namespace, label_selector=selector).items]
    if not pods:
        log(f"attempt {attempt}: no pod matches {selector} in {namespace} (it never launched, or was cleaned up)")
        return None
    pods.sort(key=_rank_of)
    run = pipeline.JobRun(job, run_id)
    section = run.run_dir / "attempts" / f"attempt-{attempt}.log"
    section.parent.mkdir(parents=True, exist_ok=True)
    records = []
    with open(section, "w", encoding="utf-8") as handle:
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            log(f"attempt {attempt}: pod {pod['metadata']['name']} (rank {_rank_of(pod)}) {phase} "
                f"on {(pod.get('spec') or {}).get('nodeName') or 'no node'}")
            record, pod_log = _read_rank(client, pod, job, attempt, namespace, log)
            write_rank_log(handle, job=job, attempt=attempt, pod=pod, record=record, pod_log=pod_log)
            records.append(record)
        missing = sorted(set(range(job.nodes)) - {_rank_of(p) for p in pods})
        handle.writelines(f"{now_utc().isoformat()} [sat] attempt {attempt} rank {rank}: no pod left to read "
                          "(stopped when a peer failed, or never created)\n" for rank in missing)
    record = combine_rank_records(records, log)
    pipeline.store_record(run, record)
    pipeline.store_attempt_log(run, attempt, section)
    return record


def cleanup_attempt_pods(
    job: TrainingJob,
    run_id: str,
    attempt: int,
    *,
    client: Any = None,
    namespace: str | None = None,
    kubernetes_conn_id: str | None = None,
) -> list[str]:
    """Delete the attempt's kept pods (and rendezvous Service); `kind/name` of each deleted object."""
    client = client if client is not None else core_v1_client(kubernetes_conn_id)
    return k8s.cleanup_attempt(client, job, run_id=run_id, attempt=attempt,
                               namespace=namespace or sat_setting("kubernetes_namespace"))
