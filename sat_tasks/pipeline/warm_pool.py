"""The warm pool in the task functions: note, claim and reuse at the start of a run, keep or release at its end.

`steps` calls these only for a job with `warm_pool` (ADR 0015; `sat_tasks.io.warm_pool`
holds the state and the rules). Every line that says what was reused starts with
`warm pool:`; the run's `warm.json` keeps them and `report.json` quotes them (`warm`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sat_tasks.backends import Backend, backend_for, get_backend
from sat_tasks.io import warm_pool
from sat_tasks.io.object_storage import read_json
from sat_tasks.io.run_layout import JobRun
from sat_tasks.io.warm_pool import Claim, WarmState
from sat_tasks.spec import TrainingJob

Log = Callable[[str], None]


def release_state(state: WarmState, log: Log) -> list[str]:
    """Release a warm state through the backend that kept it."""
    return get_backend(state.backend).release_warm(state, log)


def _stopped(job: TrainingJob, state: WarmState, hook: Any) -> dict | None:
    """The stop request a person made on the run that kept `state` (after it ended: stop the warm pool)."""
    request = read_json(hook, JobRun(job, state.run_id).stop_uri)
    return request if isinstance(request, dict) else None


def note_image(run: JobRun, image: dict[str, Any]) -> None:
    """`check_image`: the reference and digest the run's node needs (compared with the warm one's)."""
    warm_pool.note_run(run.hook(), run.results_uri, image={"reference": image.get("reference"),
                                                            "digest": image.get("digest")})


def stage(run: JobRun, backend: Backend, log: Log) -> dict[str, Any]:
    """`stage_data` with the warm pool: claim the job's state, stage what changed, say what was reused."""
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
    lines, reused = _reuse_lines(claimed, staged, record.get("image") or {}, objects, suite)
    validation = warm_pool.validation_reuse(claimed.state, objects, suite) if claimed else None
    for line in lines:
        log(line)
    warm_pool.note_run(hook, run.results_uri, record=record, objects=objects, suite_hash=suite, reused=reused,
                       lines=lines,
                       from_run=claimed.state.run_id if claimed else None)
    staged["warm"] = {"reused": reused, "validation": validation}
    return staged


def _reuse_lines(claimed: Claim | None, staged: dict, image: dict, objects: dict[str, str],
                 suite: str | None) -> tuple[list[str], dict[str, Any]]:
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
    ok, line = warm_pool.image_reuse(state, image)
    reused["image"] = {"reused": ok, "digest": image.get("digest")}
    lines.append("warm pool: " + ("reused " if ok else "") + line)
    if claimed.node:
        reused["nodes"] = claimed.node
        lines.append(f"warm pool: node {', '.join(claimed.node)} held since run {state.run_id}, handed over")
        if state.interpreter_pid:
            reused["interpreter"] = {"pid": state.interpreter_pid, "socket": state.interpreter_socket}
            lines.append(f"warm pool: warm interpreter pid {state.interpreter_pid} handed over "
                         "(the framework is already imported)")
    valid = warm_pool.validation_reuse(state, objects, suite) is not None
    reused["validation"] = valid
    lines.append("warm pool: " + ("reused the data validation result (data and suite unchanged)" if valid else
                                  "data validation runs again (the data or the suite changed)"))
    lines += [f"warm pool: {line}" for line in claimed.lines]
    return lines, reused


def note_validation(run: JobRun, result: dict[str, Any]) -> None:
    """`validate_data`: the result the data passed, kept with the state for the next run."""
    warm_pool.note_run(run.hook(), run.results_uri, validation=result)


def keep_or_release(run: JobRun, log: Log) -> list[str]:
    """`cleanup_run`: keep a Completed, unstopped run warm for `keep_alive_seconds`; else keep nothing."""
    job, hook = run.job, run.hook()
    why = warm_pool.not_kept_because(run, log)
    if why is not None:
        log(f"warm pool: run {why}: nothing kept warm")
        return _release_handed_over(run, hook, log)
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
    warm_pool.keep(job, run.run_id, hook, backend_for(job).keep_warm(run, state, log), log)
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
