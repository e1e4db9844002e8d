"""Warm pool rules as pure functions: the state a run keeps warm, what the next run may reuse of it, and why.

Nothing here reads or writes (ADR 0015): `sat_tasks.io.warm_pool` keeps the states in
Object Storage and calls these to decide; `sat_tasks.pipeline.warm_pool` is the one hook
the task functions call. The job's `warm_pool` setting is the spec's (`spec.model.WarmPool`).

A state's parts and what each depends on:

    staged data   (object key, ETag) of every staged object, and the directory (local) or the
                  volume claim (Kubernetes) holding them
    validation    the suite file's hash + the data's keys and ETags -> the result it had
    image         the reference and the digest the registry check saw
    node          the spec hash (everything but tags, schedule, warm_pool) -> the node(s)
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sat_tasks.core.status import JobStatus
from sat_tasks.spec import TrainingJob

# Spec fields that change neither the node a run needs nor what runs on it.
_SPEC_HASH_IGNORES = ("tags", "schedule", "warm_pool")


class WarmState(BaseModel):
    """What one finished run keeps warm for the next run of its job (see the module doc)."""

    model_config = ConfigDict(extra="ignore")

    job: str
    workspace: str | None = None
    backend: str
    run_id: str
    kept_at: float
    expires_at: float
    spec_hash: str
    data_source: str
    data_dir: str = ""  # the local backend's staged directory; "" where it is not kept
    claim: str | None = None  # Kubernetes: the run's volume claim, kept with the staged data in it
    objects: dict[str, str] = Field(default_factory=dict)  # object key -> ETag
    suite_hash: str | None = None
    validation: dict[str, Any] | None = None  # the result the data passed (success only)
    image: dict[str, Any] = Field(default_factory=dict)  # {"reference", "digest"}
    nodes: list[str] = Field(default_factory=list)
    placeholders: list[str] = Field(default_factory=list)  # Kubernetes: placeholder pods holding the nodes
    namespace: str | None = None
    interpreter_pid: int | None = None  # local: the warm interpreter (framework imported) on the node
    interpreter_socket: str | None = None
    resources: dict[str, Any] = Field(default_factory=dict)  # what a placeholder asks for (for release logs)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at


class Claim(BaseModel):
    """What a run takes over from the warm state of its job, part by part (None: that part is cold)."""

    state: WarmState
    data_dir: str | None = None  # reuse staged files from here (unchanged ETags only)
    volume: str | None = None  # Kubernetes: the warm run's claim to copy the unchanged files from
    objects: dict[str, str] = Field(default_factory=dict)
    current: dict[str, str] | None = None  # the data's listing now, when the caller listed it (one LIST less)
    node: list[str] = Field(default_factory=list)
    lines: list[str] = Field(default_factory=list)  # why a part is not reused


def spec_hash(job: TrainingJob) -> str:
    """A digest of everything in the spec the node and the training process depend on."""
    data = {k: v for k, v in job.to_dict().items() if k not in _SPEC_HASH_IGNORES}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def same_backend(state: WarmState, job: TrainingJob) -> bool:
    """Whether the job runs on the backend that kept `state` (a job without a resolved backend: yes)."""
    return job.backend is None or state.backend == job.backend.value


def claim_parts(state: WarmState, job: TrainingJob) -> Claim:
    """What of an unexpired `state` the job's run may take over: a changed spec keeps the node, a changed
    data source the staged files, a changed backend everything (each with the line that says why)."""
    result = Claim(state=state)
    if not same_backend(state, job):
        result.lines.append(f"backend changed ({state.backend} -> {getattr(job.backend, 'value', None)}): "
                            "nothing reused")
        return result
    if state.data_source == job.data.source and (state.data_dir or state.claim):
        result.data_dir, result.volume, result.objects = state.data_dir or None, state.claim, dict(state.objects)
    elif state.data_source != job.data.source:
        result.lines.append(f"data source changed ({state.data_source} -> {job.data.source}): staged again")
    if state.spec_hash == spec_hash(job):
        result.node = list(state.nodes)
    else:
        result.lines.append("spec changed: the node is not reused (it was held for the old spec)")
    return result


def image_reuse(state: WarmState, image: dict[str, Any]) -> tuple[bool, str]:
    """Whether the node kept warm still has the image the run needs, and the line that says so."""
    reference, digest = image.get("reference"), image.get("digest")
    before = state.image.get("digest")
    if not digest:
        return False, f"image {reference or '?'}: no registry digest (not pulled on this backend)"
    if state.image.get("reference") == reference and before == digest:
        return True, f"image check (digest unchanged: {digest[:19]})"
    return False, f"image changed ({(before or 'none')[:19]} -> {digest[:19]}): pulled again"


def validation_reuse(state: WarmState, objects: dict[str, str], suite: str | None) -> dict[str, Any] | None:
    """The validation result the data passed, when neither the data nor the suite changed; else None."""
    if state.validation is None or suite is None or state.suite_hash != suite or state.objects != objects:
        return None
    return dict(state.validation)


def not_kept_because(last_status: str | None, stop_request: object | None) -> str | None:
    """Why a run is not kept warm (a person stopped it, or it did not end Completed); None: it is kept."""
    if stop_request is not None:
        return f"stopped by {stop_request.get('by', 'someone') if isinstance(stop_request, dict) else 'someone'}"
    return None if last_status == JobStatus.COMPLETED.value else f"ended as {last_status}"


def reuse_lines(claimed: Claim | None, staged: dict, image: dict, objects: dict[str, str],
                suite: str | None) -> tuple[list[str], dict[str, Any]]:
    """The `warm pool:` lines that say what a run reused, and the same as a record (`warm.json`'s `reused`)."""
    if claimed is None:
        return ["warm pool: cold start (nothing reused); this run will be kept warm if it completes"], {}
    state, data = claimed.state, staged.get("data") or {}
    reused: dict[str, Any] = {"from_run": state.run_id}
    lines = [f"warm pool: reusing what run {state.run_id} kept warm"]
    if "reused" in data:
        reused["staged_data"] = {"unchanged": data["reused"], "redownloaded": data["redownloaded"]}
        lines.append(f"warm pool: reused staged data ({data['reused']} objects unchanged, "
                     f"{data['redownloaded']} re-downloaded)")
    else:
        lines.append("warm pool: staged data not reused (" + (
            "the data source changed" if claimed.lines else "no staged copy of it was kept") + ")")
    engine = staged.get("engine")  # the local backend's vendored engine (on Kubernetes it is in the image)
    if engine is not None:
        reused["engine"] = engine
        lines.append(f"warm pool: reused the vendored engine {engine['hash']} (unchanged, linked)" if engine["reused"]
                     else f"warm pool: vendored engine {engine['hash']} laid out fresh (none kept, or it changed)")
    ok, line = image_reuse(state, image)
    reused["image"] = {"reused": ok, "digest": image.get("digest")}
    lines.append("warm pool: " + ("reused " if ok else "") + line)
    if claimed.node:
        reused["nodes"] = claimed.node
        lines.append(f"warm pool: node {', '.join(claimed.node)} held since run {state.run_id}, handed over")
        if state.interpreter_pid:
            reused["interpreter"] = {"pid": state.interpreter_pid, "socket": state.interpreter_socket}
            lines.append(f"warm pool: warm interpreter pid {state.interpreter_pid} handed over "
                         "(the framework is already imported)")
    valid = validation_reuse(state, objects, suite) is not None
    reused["validation"] = valid
    lines.append("warm pool: " + ("reused the data validation result (data and suite unchanged)" if valid else
                                  "data validation runs again (the data or the suite changed)"))
    lines += [f"warm pool: {line}" for line in claimed.lines]
    return lines, reused
