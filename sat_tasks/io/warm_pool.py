"""The warm pool's store: the states runs keep warm in Object Storage, claiming and releasing them (ADR 0015).

The rules (what a state holds, what may be reused and why) are pure functions in
`sat_tasks.core.warm_pool`; the task functions reach all of this through one hook,
`sat_tasks.pipeline.warm_pool`. A job with `warm_pool.keep_alive_seconds` leaves, when a run
Completed, one `WarmState` at `<root>/<workspace or ->/<job>.json` (root: `[sat] warm_pool_uri`,
else `<results destination>/_warm-pool/`, a name no job can take).

Call order for one run: `check_image` notes the digest (`note_run`), `stage_data` takes
the job's state (`claim`: expired -> released, a changed spec -> no node, else the whole
state is this run's), stages only the objects whose ETag changed, `validate_data` reuses
the result when neither the data nor the suite changed, and `cleanup_run` keeps the run
warm (`keep`) or lets it go. A claimed, expired or stopped state is released through the
backend (`release` callback): its staged directory deleted, its placeholder pods deleted.
What the run reused is `<results>/<job>/<run_id>/warm.json`, quoted by the job log and
`report.json`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sat_tasks.core.handoffs import Log
from sat_tasks.core.warm_pool import (  # noqa: F401 - the records and rules, re-exported for the store's callers
    Claim,
    WarmState,
    claim_parts,
    image_reuse,
    same_backend,
    spec_hash,
    validation_reuse,
)
from sat_tasks.core.warm_pool import not_kept_because as kept_rule
from sat_tasks.io import object_storage as storage
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob, split_s3_uri

Release = Callable[["WarmState", Log], list[str]]
WARM_PREFIX = "_warm-pool/"  # '_' cannot start a job name: no job's results collide with it
NO_WORKSPACE = "-"


def suite_hash(job: TrainingJob) -> str | None:
    """A digest of the expectation suite file the data is validated with (None: no such file)."""
    from sat_tasks.io.validation import DataValidationError, resolve_suite_path

    try:
        path = resolve_suite_path(job.data.expectation_suite)
    except DataValidationError:
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def list_objects(hook: Any, source_uri: str) -> dict[str, str]:
    """`{key: ETag}` of every object under `source_uri` (one listing; what staging would copy)."""
    bucket, prefix = split_s3_uri(source_uri)
    return {m["Key"]: str(m.get("ETag", "")).strip('"')
            for m in hook.iter_file_metadata(prefix=prefix, bucket_name=bucket) if not m["Key"].endswith("/")}


def warm_root(job: TrainingJob) -> str:
    """Where the warm states live: `[sat] warm_pool_uri`, else `<results destination>/_warm-pool/`."""
    return storage.sat_root("warm_pool_uri", WARM_PREFIX, job.results.destination)


def warm_roots() -> list[str]:
    """The roots a sweep looks under: `[sat] warm_pool_uri`, else those of the job specs in `[sat] jobs_dir`.

    A job created from the generic form with another results destination is swept by its
    own next run and by `sat warm-pool release JOB` (set `warm_pool_uri` to sweep all).
    """
    return storage.sat_roots("warm_pool_uri", WARM_PREFIX)


def state_uri(job: TrainingJob) -> str:
    """`<root><workspace>/<job>.json`; a run of a DAG that is not the job's own (the generic one) keys it
    `<job>@<dag_id>.json`, so it never takes over what a job DAG of that name kept warm (ADR 0024)."""
    dag_id = getattr(getattr(job, "results", None), "dag_id", None)
    key = job.name if dag_id in (None, job.name) else f"{job.name}@{dag_id}"
    return f"{warm_root(job)}{getattr(job, 'workspace', None) or NO_WORKSPACE}/{key}.json"


# ---- the store ---------------------------------------------------------------------------------
class WarmPoolStore:
    """The warm states in Object Storage: `load`, `save`, `delete` one job's, `states` under a root."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def load(self, job: TrainingJob) -> WarmState | None:
        data = storage.read_json(self.hook, state_uri(job))
        return WarmState.model_validate(data) if isinstance(data, dict) else None

    def save(self, job: TrainingJob, state: WarmState) -> None:
        storage.write_json(self.hook, state_uri(job), state.model_dump(mode="json"))

    def delete(self, job: TrainingJob) -> None:
        bucket, key = split_s3_uri(state_uri(job))
        self.hook.get_conn().delete_object(Bucket=bucket, Key=key)

    def states(self, root: str) -> list[tuple[str, WarmState]]:
        """Every state under `root` as (uri, state)."""
        bucket, prefix = split_s3_uri(root)
        found = []
        for key in self.hook.list_keys(bucket_name=bucket, prefix=prefix) or []:
            if key.endswith(".json"):
                uri = f"s3://{bucket}/{key}"
                data = storage.read_json(self.hook, uri)
                if isinstance(data, dict):
                    found.append((uri, WarmState.model_validate(data)))
        return found

    def delete_uri(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        self.hook.get_conn().delete_object(Bucket=bucket, Key=key)


# ---- the run's warm record (<results>/<job>/<run_id>/warm.json) ----------------------------------
def run_record_uri(results_uri: str) -> str:
    return results_uri + "warm.json"


def read_run_record(hook: Any, results_uri: str) -> dict[str, Any]:
    data = storage.read_json(hook, run_record_uri(results_uri))
    return data if isinstance(data, dict) else {}


def note_run(hook: Any, results_uri: str, *, record: dict[str, Any] | None = None, **parts: Any) -> dict[str, Any]:
    """Merge `parts` into the run's warm record (`record`: as just read; tasks run one after another)."""
    record = dict(read_run_record(hook, results_uri) if record is None else record)
    record.update(parts)
    storage.write_json(hook, run_record_uri(results_uri), record)
    return record


# ---- claiming and reusing -------------------------------------------------------------------------
def claim(job: TrainingJob, run_id: str, hook: Any, release: Release, *, log: Log = print,
          now: float | None = None) -> Claim | None:
    """Take the job's warm state for run `run_id`, or None when there is none (or it expired: then released).

    The state leaves the store at once (a second run at the same time starts cold). What
    the spec change invalidates is left out of the claim: the node when the spec hash
    differs; the staged files when the data source differs. The image and the validation
    are compared later, when their new keys are known (`image_reuse`, `validation_reuse`).
    """
    store = WarmPoolStore(hook)
    state = store.load(job)
    if state is None:
        log("warm pool: nothing kept warm for this job (cold start)")
        return None
    store.delete(job)
    when = time.time() if now is None else now
    if state.expired(when):
        log(f"warm pool: the state run {state.run_id} kept expired {when - state.expires_at:.0f}s ago: released")
        _release(state, release, log)
        return None
    result = claim_parts(state, job)
    if not same_backend(state, job):
        return result
    log(f"warm pool: run {run_id} takes over what run {state.run_id} kept warm "
        f"({state.expires_at - when:.0f}s of keep-alive left)")
    return result


def release_nodes_taken(workspace: str, nodes: Iterable[str], job: str, hook: Any, roots: Iterable[str],
                        release: Release, *, backend: str, log: Log = print) -> list[str]:
    """Release the warm states of *other* jobs of `workspace` that keep one of `nodes`, which `job` now holds.

    The local backend's slot board does not count warm nodes as held (a warm run must never
    keep a waiting job out), so the workspace needing a node shows up here: a job of the
    workspace took it. Its own warm state is the job's to claim, not to release.
    """
    taken, store, released = set(nodes), WarmPoolStore(hook), []
    for root in roots:
        for uri, state in store.states(root):
            if (state.backend != backend or state.workspace != workspace or state.job == job
                    or not taken.intersection(state.nodes)):
                continue
            store.delete_uri(uri)
            log(f"warm pool: workspace {workspace}: {job} took {', '.join(sorted(taken.intersection(state.nodes)))}; "
                f"releasing {state.job}'s warm state")
            released += [f"warm-state/{state.job}", *_release(state, release, log)]
    return released


def _release(state: WarmState, release: Release, log: Log) -> list[str]:
    released = release(state, log)
    for name in released:
        log(f"warm pool: released {name}")
    return released


def link_unchanged(previous_dir: str | Path, dest_dir: str | Path, previous: dict[str, str],
                   current: dict[str, str], prefix: str) -> list[str]:
    """Hard-link (else copy) into `dest_dir` each staged file whose (key, ETag) did not change; their keys.

    Staging then finds them present, verifies them against the object's checksum and does
    not download them; a file whose ETag changed is not linked, so it is downloaded again.
    """
    from sat_tasks.io.object_storage import safe_relative_path

    src_root, dest_root = Path(previous_dir), Path(dest_dir)
    linked = []
    for key, etag in current.items():
        if previous.get(key) != etag or not etag:
            continue
        rel = safe_relative_path(key, prefix)
        src, dest = src_root / rel, dest_root / rel
        if not src.is_file() or dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
        except OSError:
            shutil.copy2(src, dest)
        linked.append(key)
    return linked


def not_kept_because(run: JobRun, log: Log = print) -> str | None:
    """Why the run is not kept warm, read from its status history and stop request (`core.warm_pool`'s rule)."""
    entries = run.history(log).entries()
    return kept_rule(entries[-1]["status"] if entries else None, storage.read_json(run.hook(), run.stop_uri))


def keep(job: TrainingJob, run_id: str, hook: Any, state: WarmState, log: Log = print) -> WarmState:
    """Record `state` as the job's warm state (replacing an older one, which is released by the caller)."""
    WarmPoolStore(hook).save(job, state)
    left = state.expires_at - time.time()
    log(f"warm pool: run {run_id} kept warm for {left:.0f}s (until {time.strftime('%H:%M:%S', time.gmtime(state.expires_at))}"
        f" UTC): {len(state.objects)} staged objects, node(s) {', '.join(state.nodes) or 'none'}"
        + (f", placeholder pod(s) {', '.join(state.placeholders)}" if state.placeholders else ""))
    return state


def release_job(job: TrainingJob, hook: Any, release: Release, log: Log = print) -> list[str]:
    """Release the job's warm state now (a person's stop, `sat warm-pool release`); what was released."""
    store = WarmPoolStore(hook)
    state = store.load(job)
    if state is None:
        return []
    store.delete(job)
    return [f"warm-state/{job.name}", *_release(state, release, log)]


def release_expired(hook: Any, roots: Iterable[str], release: Release, *, backend: str, log: Log = print,
                    now: float | None = None) -> list[str]:
    """Release every expired state of `backend` under `roots` (the sweep: `sat warm-pool release --expired`)."""
    store, released = WarmPoolStore(hook), []
    for root in roots:
        for uri, state in store.states(root):
            if state.backend == backend and state.expired(now):
                store.delete_uri(uri)
                released += [f"warm-state/{state.job}", *_release(state, release, log)]
    return released


def release_for_capacity(workspace: str, nodes_needed: int, hook: Any, roots: Iterable[str], release: Release,
                         *, backend: str, log: Log = print) -> list[str]:
    """Release warm states of `workspace`, oldest first, until `nodes_needed` nodes are freed; what was released.

    What the workspace's queue calls when a job waits for nodes that warm states hold.
    """
    store, released, freed = WarmPoolStore(hook), [], 0
    candidates = sorted(((uri, s) for root in roots for uri, s in store.states(root)
                         if s.backend == backend and s.workspace == workspace and s.nodes),
                        key=lambda item: item[1].kept_at)
    for uri, state in candidates:
        if freed >= nodes_needed:
            break
        store.delete_uri(uri)
        log(f"warm pool: workspace {workspace} needs {nodes_needed} node(s): releasing {state.job}'s "
            f"{', '.join(state.nodes)}")
        released += [f"warm-state/{state.job}", *_release(state, release, log)]
        freed += len(state.nodes)
    return released
