"""The warm pool's one hook in the task functions: note, claim and reuse at the start of a run, keep or release at its end.

`steps` asks `hook_for(job)` and calls the hook at four points, whatever the job: a job
without `warm_pool` gets `NoWarmPool`, whose methods do nothing but the plain step (stage
through the backend, keep nothing). The rules are `sat_tasks.core.warm_pool`'s, the store
`sat_tasks.io.warm_pool` (ADR 0015). Every line that says what was reused starts with
`warm pool:`; the run's `warm.json` keeps them and `report.json` quotes them (`warm`).

Call order: `image_checked` (check_image), `stage` (stage_data), `reused_validation` then
`data_validated` (validate_data), `cleanup` (cleanup_run: the one place that decides whether
the run is kept, and tells the backend so).
"""

from __future__ import annotations

import time
from typing import Any

from sat_tasks.backends import Backend, backend_for, get_backend
from sat_tasks.backends.base import KeepsWarm, release_warm_on
from sat_tasks.core.handoffs import Log
from sat_tasks.core.warm_pool import WarmState, reuse_lines, validation_reuse
from sat_tasks.io import warm_pool
from sat_tasks.io.object_storage import read_json
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob


def release_state(state: WarmState, log: Log) -> list[str]:
    """Release a warm state through the backend that kept it."""
    return release_warm_on(get_backend(state.backend), state, log)


def _stopped(job: TrainingJob, state: WarmState, hook: Any) -> dict | None:
    """The stop request a person made on the run that kept `state` (after it ended: stop the warm pool)."""
    request = read_json(hook, JobRun(job, state.run_id).stop_uri)
    return request if isinstance(request, dict) else None


class NoWarmPool:
    """The hook of a job without `warm_pool`: the plain steps, nothing noted, nothing kept."""

    @staticmethod
    def image_checked(run: JobRun, image: dict[str, Any]) -> None:
        """`check_image`: the image the run's node needs (reference, digest)."""

    @staticmethod
    def stage(run: JobRun, backend: Backend, log: Log) -> dict[str, Any]:
        """`stage_data`: stage the script and the data through the backend."""
        return backend.stage(run, log)

    @staticmethod
    def reused_validation(run: JobRun, staged: dict | None, log: Log) -> dict[str, Any] | None:
        """`validate_data`: a result the data already passed (None: validate)."""
        return None

    @staticmethod
    def data_validated(run: JobRun, result: dict[str, Any]) -> None:
        """`validate_data`: the result the data passed."""

    @staticmethod
    def cleanup(run: JobRun, backend: Backend, log: Log) -> list[str]:
        """`cleanup_run`: delete what the run kept on its backend; `kind/name` of each."""
        return backend.cleanup_run(run, log)


class WarmPool(NoWarmPool):
    """The hook of a job with `warm_pool` (ADR 0015): claim and reuse at the start, keep or release at the end."""

    @staticmethod
    def image_checked(run: JobRun, image: dict[str, Any]) -> None:
        """The reference and digest the run's node needs (compared with the warm one's)."""
        warm_pool.note_run(run.hook(), run.results_uri, image={"reference": image.get("reference"),
                                                                "digest": image.get("digest")})

    @staticmethod
    def stage(run: JobRun, backend: Backend, log: Log) -> dict[str, Any]:
        """Claim the job's state, stage what changed, say what was reused."""
        job, hook = run.job, run.hook()
        claimed = warm_pool.claim(job, run.run_id, hook, release_state, log=log)
        if claimed is not None and (request := _stopped(job, claimed.state, hook)):
            log(f"warm pool: stopped by {request.get('by', 'someone')} after run {claimed.state.run_id}: released")
            release_state(claimed.state, log)
            claimed = None
        objects = warm_pool.list_objects(hook, job.data.source)  # the keys of this run's warm state
        if claimed is not None:
            claimed.current = objects
        try:
            staged = backend.stage(run, log, reuse=claimed)
        finally:
            if claimed is not None:  # the run has what it takes over (linked files, the node): the rest goes now
                leftover = claimed.state
                if claimed.node:  # the node's warm interpreter goes with the node
                    leftover = leftover.model_copy(update={"interpreter_pid": None, "interpreter_socket": None})
                for name in release_state(leftover, log):
                    log(f"warm pool: released {name} (handed over to run {run.run_id})")
        suite = warm_pool.suite_hash(job)
        record = warm_pool.read_run_record(hook, run.results_uri)
        lines, reused = reuse_lines(claimed, staged, record.get("image") or {}, objects, suite)
        validation = validation_reuse(claimed.state, objects, suite) if claimed else None
        for line in lines:
            log(line)
        warm_pool.note_run(hook, run.results_uri, record=record, objects=objects, suite_hash=suite, reused=reused,
                           lines=lines, from_run=claimed.state.run_id if claimed else None)
        staged["warm"] = {"reused": reused, "validation": validation}
        return staged

    @staticmethod
    def reused_validation(run: JobRun, staged: dict | None, log: Log) -> dict[str, Any] | None:
        """The warm run's result, when neither the data nor the suite changed (noted for the next run too)."""
        reused = ((staged or {}).get("warm") or {}).get("validation")
        if reused is not None:
            log("warm pool: data validation reused (data and suite unchanged since the warm run)")
            WarmPool.data_validated(run, reused)
        return reused

    @staticmethod
    def data_validated(run: JobRun, result: dict[str, Any]) -> None:
        """The result the data passed, kept with the state for the next run."""
        warm_pool.note_run(run.hook(), run.results_uri, validation=result)

    @staticmethod
    def cleanup(run: JobRun, backend: Backend, log: Log) -> list[str]:
        """Keep a Completed, unstopped run warm for `keep_alive_seconds`, else keep nothing: decided once here,
        and the backend told (`keep_warm`: a kept Kubernetes run keeps its claim)."""
        why = warm_pool.not_kept_because(run, log)
        deleted = backend.cleanup_run(run, log, keep_warm=why is None)
        if why is not None:
            log(f"warm pool: run {why}: nothing kept warm")
            return deleted + _release_handed_over(run, run.hook(), log)
        return deleted + _keep(run, backend, log)


def hook_for(job: TrainingJob) -> type[NoWarmPool]:
    """The warm pool hook the task functions call for `job` (none where its backend keeps nothing warm)."""
    return WarmPool if job.warm_pool is not None and backend_for(job).capabilities.warm_pool else NoWarmPool


def _keep(run: JobRun, backend: Backend, log: Log) -> list[str]:
    """Keep the run warm (replacing and releasing an older state), and sweep the expired states beside it."""
    assert isinstance(backend, KeepsWarm), "hook_for gives the warm pool hook only to a backend that keeps warm"
    job, hook = run.job, run.hook()
    record = warm_pool.read_run_record(hook, run.results_uri)
    now = time.time()
    state = WarmState(
        job=job.name, workspace=getattr(job, "workspace", None), backend=job.backend.value, run_id=run.run_id,
        kept_at=now, expires_at=now + job.warm_pool.keep_alive_seconds, spec_hash=warm_pool.spec_hash(job),
        data_source=job.data.source, objects=record.get("objects") or {}, suite_hash=record.get("suite_hash"),
        validation=record.get("validation"), image=record.get("image") or {}, nodes=_last_nodes(run, hook),
    )
    released = []
    older = warm_pool.WarmPoolStore(hook).load(job)  # a run that ended in between kept one: ours is newer
    if older is not None and older.run_id != run.run_id:  # our own (a retried cleanup_run) holds what we keep
        released = release_state(older, log)
    warm_pool.keep(job, run.run_id, hook, backend.keep_warm(run, state, log), log)
    # the cleanup path for jobs whose next run never came: sweep the expired states beside this one
    released += warm_pool.release_expired(hook, [warm_pool.warm_root(job)], release_state, backend=job.backend.value,
                                          log=log)
    return released


def _release_handed_over(run: JobRun, hook: Any, log: Log) -> list[str]:
    """A run that keeps nothing warm lets go of what it took over and still holds (a warm interpreter)."""
    interpreter = (warm_pool.read_run_record(hook, run.results_uri).get("reused") or {}).get("interpreter")
    if not interpreter:
        return []
    now = time.time()
    state = WarmState(job=run.job.name, backend=run.job.backend.value, run_id=run.run_id, kept_at=now,
                      expires_at=now, spec_hash="", data_source=run.job.data.source,
                      interpreter_pid=interpreter.get("pid"), interpreter_socket=interpreter.get("socket"))
    return release_state(state, log)


def _last_nodes(run: JobRun, hook: Any) -> list[str]:
    """The node(s) of the run's last attempt (what the warm state holds)."""
    for attempt in range(run.job.max_attempts(), 0, -1):
        record = read_json(hook, run.attempt_uri(attempt))
        if isinstance(record, dict) and record.get("node"):
            return [n.strip() for n in str(record["node"]).split(",") if n.strip()]
    return []
