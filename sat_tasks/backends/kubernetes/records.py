"""Reading what an attempt's pods left behind into one AttemptRecord, and the attempt's part of the job log.

``read_attempt_record(job, run_id, k)`` (the `classify` task, `trigger_rule=ALL_DONE`) reads
the kept pod(s), the node and the log tail through the Kubernetes API, with the events of
the pod, its node, NodeClaim and Kueue Workload in the attempt's window (`evidence`); the
training progress comes from the engine's progress.json as its mirror keeps it in Object
Storage (structured data, never parsed from log text). It builds one record for the whole
attempt (``classify.combine_rank_records``), stores it where classify and the report look
(the same place as the local backend's record) and stores the attempt's section of the
job log next to it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sat_tasks.backends.kubernetes import names
from sat_tasks.backends.kubernetes.evidence import as_dict, attempt_events, read_node
from sat_tasks.classify import combine_rank_records, record_from_pod
from sat_tasks.core.attempt import (
    MAIN_CONTAINER_NAME,
    AttemptRecord,
    progress_of_attempt,
)
from sat_tasks.core.clock import now_utc, parse_time
from sat_tasks.core.handoffs import Log
from sat_tasks.core.joblog import job_log_footer, job_log_header
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob, split_s3_uri

#: Bounds on the container log read per pod: the last `LOG_READ_LINES` lines, of which the last
#: `LOG_READ_BYTES` bytes. All of it goes to the run's job.log and is searched for the engine's
#: progress lines; the record keeps the last `attempt.LOG_TAIL_LINES`.
LOG_READ_LINES = 100_000

LOG_READ_BYTES = 16 * 2**20

_LOG_CHUNK = 1 << 16

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
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_NODE_RANK, 0))
    except ValueError:
        return 0


def _ranks_of(pods: list[dict[str, Any]], job: TrainingJob) -> int:
    """How many ranks the attempt ran: its pods' `sat.ai/ranks` (an elastic failover on fewer nodes), else all."""
    for pod in pods:
        raw = str(((pod.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_RANKS, ""))
        if raw.isdigit() and 1 <= int(raw) <= job.nodes:
            return int(raw)
    return job.nodes


def _held_nodes(record: AttemptRecord, pods: list[dict[str, Any]]) -> list[str]:
    """Every node the attempt's pods ran on, the record's own node first (`AttemptRecord.nodes`)."""
    ran = [node for pod in pods if (node := (pod.get("spec") or {}).get("nodeName"))]
    first = [record.node] if record.node in ran else []
    return first + [node for node in dict.fromkeys(ran) if node not in first]


def _read_rank(client: Any, pod: dict[str, Any], job: TrainingJob, attempt: int, namespace: str,
               progress: dict[str, Any] | None, log: Log) -> tuple[AttemptRecord, PodLog]:
    """The record of one pod (one node rank): pod, its node (conditions, taints and labels; none
    when the node is gone), the events of the pod, node, NodeClaim and Kueue Workload
    (`evidence.attempt_events`), the node's labels at start (kept on the pod by `launch`), log
    tail; and the container log it read (for the run's job.log)."""
    name = pod["metadata"]["name"]
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = read_node(client, node_name, log) if node_name else None
    events = attempt_events(client, pod, namespace, node, log)
    pod_log = _read_log(client, name, namespace, log)
    record = record_from_pod(pod, job=job.name, attempt=attempt, log=pod_log.lines, events=events, node=node,
                             progress=progress, container=MAIN_CONTAINER_NAME)
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
    started = (record.started_at or parse_time(status.get("startTime"))
               or parse_time(metadata.get("creationTimestamp")) or now_utc())
    node = record.node or (pod.get("spec") or {}).get("nodeName")
    handle.write(job_log_header(job=job.name, attempt=attempt, node=node, at=started,
                                note=f"log of pod {name} (rank {rank}) follows") + "\n")
    if pod_log.note:
        handle.write(f"{now_utc().isoformat()} [sat] pod {name}: {pod_log.note}\n")
    handle.writelines(line + "\n" for line in pod_log.lines)
    reason = f", {record.termination_reason}" if record.termination_reason else ""
    handle.write(job_log_footer(attempt=attempt, at=record.finished_at or now_utc(), exit_code=record.exit_code,
                                note=f"rank {rank}, pod {name}{reason}") + "\n")


def read_attempt_record(run: JobRun, attempt: int, *, client: Any, namespace: str,
                        log: Log = print) -> AttemptRecord | None:
    """Read the kept pod(s) of an attempt, build its record and store it for classify.

    `client` is a CoreV1Api; None when the attempt has no pod (it never launched). The
    container log comes from the API (bounded by `LOG_READ_LINES` / `LOG_READ_BYTES`), the
    training progress from the engine's progress.json in Object Storage (`JobRun.progress_uri`,
    what the engine mirrors on every commit and resume); the node's kernel log is not
    reachable through the API (node-problem-detector events carry Xids instead). Every
    rank's log also goes into the attempt's section of the run's job.log (`write_rank_log`),
    stored at `JobRun.attempt_log_uri`; `KubernetesBackend.job_log` assembles them.
    """
    job = run.job
    selector = names.attempt_label_selector(job, run.run_id, attempt)
    pods = [as_dict(pod) for pod in client.list_namespaced_pod(namespace, label_selector=selector).items]
    if not pods:
        log(f"attempt {attempt}: no pod matches {selector} in {namespace} (it never launched, or was cleaned up)")
        return None
    pods.sort(key=_rank_of)
    progress = progress_of_attempt(run.read_progress(), attempt)
    section = run.run_dir / "attempts" / f"attempt-{attempt}.log"
    section.parent.mkdir(parents=True, exist_ok=True)
    records = []
    with open(section, "w", encoding="utf-8") as handle:
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase")
            log(f"attempt {attempt}: pod {pod['metadata']['name']} (rank {_rank_of(pod)}) {phase} "
                f"on {(pod.get('spec') or {}).get('nodeName') or 'no node'}")
            record, pod_log = _read_rank(client, pod, job, attempt, namespace, progress, log)
            write_rank_log(handle, job=job, attempt=attempt, pod=pod, record=record, pod_log=pod_log)
            records.append(record)
        missing = sorted(set(range(_ranks_of(pods, job))) - {_rank_of(p) for p in pods})
        handle.writelines(f"{now_utc().isoformat()} [sat] attempt {attempt} rank {rank}: no pod left to read "
                          "(stopped when a peer failed, or never created)\n" for rank in missing)
    record = combine_rank_records(records, log)
    record = record.model_copy(update={"nodes": _held_nodes(record, pods), **_planned_restart(pods)})
    run.store_record(record)
    run.upload_file(section, run.attempt_log_uri(attempt))
    return record


def _planned_restart(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The grow-back watch's note on the attempt's pods (`elastic.request_growth`, ADR 0029): why it was stopped,
    and the excluded nodes it takes back; {} when none was stopped to grow back."""
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        why = (annotations.get(names.ANNOTATION_PLANNED_RESTART) or "").strip()
        if why:
            readmitted = [n for n in (annotations.get(names.ANNOTATION_READMITTED) or "").split(",") if n.strip()]
            return {"planned_restart": why[:500], "readmitted_nodes": [n.strip() for n in readmitted]}
    return {}


def assemble_job_log(run: JobRun) -> Path | None:
    """Rebuild the run's local job.log from the stored attempt sections, in attempt order.

    Each section is stored whole by its attempt's classify, so a retried classify replaces
    its section instead of appending it twice. Returns the job log, None when no section exists.
    """
    hook = run.hook()
    found = []
    for attempt in range(1, run.job.max_attempts() + 1):
        bucket, key = split_s3_uri(run.attempt_log_uri(attempt))
        if hook.check_for_key(key, bucket_name=bucket):
            found.append((bucket, key))
    if not found:
        return None
    run.job_log.parent.mkdir(parents=True, exist_ok=True)
    part = run.job_log.with_name(run.job_log.name + ".part")
    client = hook.get_conn()
    with open(part, "wb") as handle:
        for bucket, key in found:
            # Streamed in order: download_fileobj writes at the object's own offsets (seek), which
            # would overwrite the previous section instead of appending.
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            try:
                handle.writelines(body.iter_chunks(1 << 20))
            finally:
                body.close()
    os.replace(part, run.job_log)
    return run.job_log
