"""The warm pool on the local backend, through the task functions, against the embedded S3 server."""

from __future__ import annotations

import time

import pytest

from sat_tasks.core.status import JobStatus
from sat_tasks.io import warm_pool
from sat_tasks.io.run_layout import JobRun
from sat_tasks.pipeline import steps
from sat_tasks.pipeline.report import build_report, format_report
from tests.sat_tasks.warm_pool.conftest import files_under

VALIDATION = {"success": True, "suite_name": "text_corpus", "results": []}  # what validate_data passed


def _first_run(warm_job, lines, **overrides):
    """A cold run that completes and is kept warm; (job, run)."""
    job = warm_job.job(**overrides)
    run_id = warm_job.run_id()
    steps.check_image(job, run_id, log=lines.append)
    staged = steps.stage_data(job, run_id, log=lines.append)
    assert staged["warm"] == {"reused": {}, "validation": None}
    warm_pool.note_run(warm_job.hook, JobRun(job, run_id).results_uri, validation=VALIDATION)
    run = warm_job.complete(job, run_id)
    steps.cleanup_run(job, run_id, log=lines.append)
    return job, run


def test_a_cold_run_is_kept_warm_with_its_keys(warm_job, lines):
    job, run = _first_run(warm_job, lines)
    assert "warm pool: cold start (nothing reused); this run will be kept warm if it completes" in lines
    state = warm_pool.WarmPoolStore(warm_job.hook).load(job)
    assert state.run_id == run.run_id and state.nodes == ["local-node-2"]
    assert state.data_dir == str(run.data_dir) and files_under(run.data_dir) == ["part-00.txt", "part-01.txt",
                                                                                 "part-02.txt"]
    assert sorted(state.objects) == [warm_job.prefix + f"part-0{i}.txt" for i in range(3)]
    assert all(len(etag) == 32 for etag in state.objects.values())
    assert state.spec_hash == warm_pool.spec_hash(job) and state.validation == VALIDATION
    assert 590 <= state.expires_at - state.kept_at <= 600
    assert any(line.startswith(f"warm pool: run {run.run_id} kept warm for") for line in lines)


def test_the_next_run_reuses_unchanged_data_the_validation_and_the_node(warm_job, lines):
    job, first = _first_run(warm_job, lines)
    from ckpt_engine.vendor import engine_hash, write_vendor_dir

    write_vendor_dir(first.vendor_dir)  # as its launch did
    lines.clear()
    run_id = warm_job.run_id()
    steps.check_image(job, run_id, log=lines.append)
    staged = steps.stage_data(job, run_id, log=lines.append)
    run = JobRun(job, run_id)
    assert staged["data"]["reused"] == 3 and staged["data"]["redownloaded"] == 0
    assert staged["data"]["transferred"] == 0
    assert "warm pool: reused staged data (3 objects unchanged, 0 re-downloaded)" in lines
    assert f"warm pool: reused the vendored engine {engine_hash()} (unchanged, linked)" in lines
    assert (JobRun(job, run_id).vendor_dir / "ckpt_engine" / "engine.py").stat().st_ino == (
        first.vendor_dir / "ckpt_engine" / "engine.py").stat().st_ino
    assert "warm pool: node local-node-2 held since run " + first.run_id + ", handed over" in lines
    assert files_under(run.data_dir) == ["part-00.txt", "part-01.txt", "part-02.txt"]
    # the warm run's directory is released once the files are linked: nothing left behind
    assert not first.data_dir.exists()
    assert f"warm pool: released directory/{first.data_dir.resolve()} (handed over to run {run_id})" in lines
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job) is None  # claimed: no longer warm
    # validate_data reuses the result without running the suite
    assert steps.validate_data(job, run_id, staged, log=lines.append) == VALIDATION
    assert "warm pool: data validation reused (data and suite unchanged since the warm run)" in lines
    # the report says what was reused
    warm_job.complete(job, run_id)
    report = build_report(run, run.history().entries())
    assert report["warm"]["from_run"] == first.run_id
    assert report["warm"]["reused"]["staged_data"] == {"unchanged": 3, "redownloaded": 0}
    assert report["warm"]["reused"]["validation"] is True and report["warm"]["reused"]["nodes"] == ["local-node-2"]
    assert "  warm pool: reused staged data (3 objects unchanged, 0 re-downloaded)" in format_report(report)


def test_a_changed_object_is_downloaded_again_and_the_suite_runs_again(warm_job, lines):
    job, _ = _first_run(warm_job, lines)
    warm_job.put("part-01.txt", b"a changed line of text for the corpus\n" * 40)
    lines.clear()
    run_id = warm_job.run_id()
    staged = steps.stage_data(job, run_id, log=lines.append)
    assert (staged["data"]["reused"], staged["data"]["redownloaded"]) == (2, 1)
    assert "warm pool: reused staged data (2 objects unchanged, 1 re-downloaded)" in lines
    assert staged["warm"]["validation"] is None
    assert "warm pool: data validation runs again (the data or the suite changed)" in lines
    assert (JobRun(job, run_id).data_dir / "part-01.txt").read_bytes().startswith(b"a changed line")


def test_an_added_object_is_downloaded_the_others_reused(warm_job, lines):
    job, _ = _first_run(warm_job, lines)
    warm_job.put("part-03.txt", b"one more file\n" * 30)
    staged = steps.stage_data(job, warm_job.run_id(), log=lines.append)
    assert (staged["data"]["reused"], staged["data"]["redownloaded"]) == (3, 1)
    assert staged["warm"]["validation"] is None


def test_a_spec_change_keeps_the_data_but_not_the_node(warm_job, lines):
    job, _ = _first_run(warm_job, lines)
    changed = warm_job.job(command="python train.py --max_steps 5")
    lines.clear()
    staged = steps.stage_data(changed, warm_job.run_id(), log=lines.append)
    assert staged["data"]["reused"] == 3
    assert "warm pool: spec changed: the node is not reused (it was held for the old spec)" in lines
    assert "nodes" not in staged["warm"]["reused"]
    # tags, schedule and the keep-alive are not part of the spec hash
    assert warm_pool.spec_hash(job) == warm_pool.spec_hash(warm_job.job(tags={"x": "y"}, schedule="@daily",
                                                                         warm_pool={"keep_alive_seconds": 5}))


def test_a_changed_data_source_stages_everything_again(warm_job, lines, s3_hook):
    _first_run(warm_job, lines)
    other = f"s3://{warm_job.bucket}/datasets/{warm_job.name}-other/"
    for name in ("a.txt", "b.txt"):
        s3_hook.load_bytes(b"text\n" * 50, key=f"datasets/{warm_job.name}-other/{name}", bucket_name=warm_job.bucket,
                           replace=True)
    lines.clear()
    staged = steps.stage_data(warm_job.job(data={"source": other}), warm_job.run_id(), log=lines.append)
    assert staged["data"]["transferred"] == 2 and "reused" not in staged["data"]
    assert any("data source changed" in line for line in lines)
    assert "warm pool: staged data not reused (the data source changed)" in lines


def test_an_expired_state_is_released_at_the_next_run_start(warm_job, lines):
    job, first = _first_run(warm_job, lines)
    lines.clear()
    run_id = warm_job.run_id()
    claim = warm_pool.claim(job, run_id, warm_job.hook, _release_local, log=lines.append,
                            now=time.time() + 601)
    assert claim is None
    assert not first.data_dir.exists()
    assert any(line.startswith(f"warm pool: the state run {first.run_id} kept expired") for line in lines)
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_the_sweep_releases_only_expired_states(warm_job, lines, monkeypatch):
    job, first = _first_run(warm_job, lines)
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_URI", warm_pool.warm_root(job))
    from sat_tasks.backends.local import warm as local_warm

    assert local_warm.release_expired(log=lines.append) == []
    assert first.data_dir.exists()
    released = warm_pool.release_expired(warm_job.hook, [warm_pool.warm_root(job)], local_warm.release_warm,
                                         backend="local", log=lines.append, now=time.time() + 601)
    assert released == [f"warm-state/{job.name}", f"directory/{first.data_dir.resolve()}", "node/local-node-2"]
    assert not first.data_dir.exists() and warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_a_run_that_did_not_complete_or_was_stopped_keeps_nothing(warm_job, lines):
    job = warm_job.job()
    failed = warm_job.run_id()
    steps.stage_data(job, failed, log=lines.append)
    warm_job.complete(job, failed, status=JobStatus.FAILED)
    steps.cleanup_run(job, failed, log=lines.append)
    assert "warm pool: run ended as Failed: nothing kept warm" in lines
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job) is None

    stopped = warm_job.run_id()
    steps.stage_data(job, stopped, log=lines.append)
    run = warm_job.complete(job, stopped)
    from sat_tasks.pipeline.actions import request_stop

    request_stop(warm_job.hook, run, "alice")
    steps.cleanup_run(job, stopped, log=lines.append)
    assert "warm pool: run stopped by alice: nothing kept warm" in lines
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_a_stop_on_the_warm_run_releases_its_state(warm_job, lines):
    job, first = _first_run(warm_job, lines)
    from sat_tasks.pipeline.actions import request_stop

    request_stop(warm_job.hook, first, "bob")  # the person stops the warm pool of the finished run
    lines.clear()
    staged = steps.stage_data(job, warm_job.run_id(), log=lines.append)
    assert f"warm pool: stopped by bob after run {first.run_id}: released" in lines
    assert not first.data_dir.exists()
    assert staged["data"]["transferred"] == 3 and "reused" not in staged["data"]


def test_release_for_capacity_frees_the_workspaces_oldest_warm_nodes_first(warm_job, lines):
    states = []
    for i, (workspace, node) in enumerate([("ws-a", "ws-a-node-0"), ("ws-a", "ws-a-node-1"), ("ws-b", "n")]):
        state = warm_pool.WarmState(job=f"{warm_job.name}-{i}", workspace=workspace, backend="local",
                                    run_id=f"r{i}", kept_at=1000 + i, expires_at=time.time() + 600, spec_hash="x",
                                    data_source=warm_job.source, nodes=[node])
        job = warm_job.job(name=f"{warm_job.name}-{i}")
        warm_pool.WarmPoolStore(warm_job.hook).save(job.model_copy(update={"workspace": workspace})
                                                     if hasattr(job, "workspace") else job, state)
        states.append(state)
    root = warm_pool.warm_root(warm_job.job())
    released = warm_pool.release_for_capacity("ws-a", 1, warm_job.hook, [root], _release_local, backend="local",
                                              log=lines.append)
    assert released == [f"warm-state/{warm_job.name}-0", "node/ws-a-node-0"]
    left = sorted(s.job for _, s in warm_pool.WarmPoolStore(warm_job.hook).states(root))
    assert left == [f"{warm_job.name}-1", f"{warm_job.name}-2"]
    assert "warm pool: workspace ws-a needs 1 node(s): releasing " + f"{warm_job.name}-0's ws-a-node-0" in lines


def test_release_never_deletes_outside_the_work_dir(tmp_path):
    from sat_tasks.backends.local.warm import release_warm

    outside = tmp_path / "data"
    outside.mkdir()
    state = warm_pool.WarmState(job="j", backend="local", run_id="r", kept_at=0, expires_at=0, spec_hash="x",
                                data_source="s3://b/p/", data_dir=str(outside), nodes=["n1"])
    assert release_warm(state, print) == ["node/n1"]
    assert outside.exists()


def _release_local(state, log):
    from sat_tasks.backends.local.warm import release_warm

    return release_warm(state, log)


@pytest.mark.parametrize("image, expected", [
    pytest.param({"reference": "r/i:1", "digest": "sha256:" + "a" * 64}, True, id="same-digest"),
    pytest.param({"reference": "r/i:1", "digest": "sha256:" + "b" * 64}, False, id="new-digest"),
    pytest.param({"reference": "r/i:1", "digest": None}, False, id="no-registry-check"),
])
def test_image_reuse_needs_the_same_digest(image, expected):
    state = warm_pool.WarmState(job="j", backend="kubernetes", run_id="r", kept_at=0, expires_at=0, spec_hash="x",
                                data_source="s3://b/p/", image={"reference": "r/i:1", "digest": "sha256:" + "a" * 64})
    ok, line = warm_pool.image_reuse(state, image)
    assert ok is expected
    assert ("digest unchanged" in line) is expected


def test_sat_warm_pool_list_and_release(warm_job, lines, monkeypatch, capsys):
    from sat_tasks.cli import main

    job, first = _first_run(warm_job, lines)
    monkeypatch.setenv("AIRFLOW__SAT__WARM_POOL_URI", warm_pool.warm_root(job))
    assert main(["warm-pool", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{job.name}" in out and "node(s) local-node-2" in out and "1 warm state(s)" in out
    assert main(["warm-pool", "release"]) == 2
    assert main(["warm-pool", "release", "--expired"]) == 0  # not expired: kept
    assert first.data_dir.exists()
    assert main(["warm-pool", "release", job.name, "no-such-job"]) == 1
    out = capsys.readouterr().out
    assert f"released the warm state of {job.name} (run {first.run_id}): directory/" in out
    assert "no-such-job: nothing kept warm" in out
    assert not first.data_dir.exists() and warm_pool.WarmPoolStore(warm_job.hook).load(job) is None


def test_the_next_run_starts_on_the_node_it_took_over(warm_job, lines):
    from sat_tasks.backends.local.warm import warm_node_first
    from sat_tasks.backends.local.workspace import attempt_nodes
    from sat_tasks.core.handoffs import Plan

    job, _ = _first_run(warm_job, lines)  # its attempt ran on local-node-2
    run_id = warm_job.run_id()
    steps.stage_data(job, run_id, log=lines.append)
    run = JobRun(job, run_id)
    pool = ["local-node-0", "local-node-1", "local-node-2"]
    assert warm_node_first(run, pool) == ["local-node-2", "local-node-0", "local-node-1"]
    with attempt_nodes(run, Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["local-node-2"]
    # a failover that excludes it goes elsewhere
    with attempt_nodes(run, Plan(attempt=2, exclude_nodes=["local-node-2"]), lines.append) as nodes:
        assert nodes == ["local-node-0"]


def test_a_run_kept_warm_sweeps_the_expired_states_beside_it(warm_job, lines):
    stale, first = _first_run(warm_job, lines)  # the job whose next run never came
    store = warm_pool.WarmPoolStore(warm_job.hook)
    store.save(stale, store.load(stale).model_copy(update={"expires_at": time.time() - 1}))
    other = warm_job.job(name=warm_job.name + "-b")
    run_id = warm_job.run_id()
    steps.stage_data(other, run_id, log=lines.append)
    warm_job.complete(other, run_id)
    deleted = steps.cleanup_run(other, run_id, log=lines.append)
    assert f"warm-state/{stale.name}" in deleted and not first.data_dir.exists()
    assert store.load(stale) is None and store.load(other).run_id == run_id


def test_a_workspaces_warm_pool_applies_to_its_jobs_without_one(warm_job, lines, monkeypatch, tmp_path):
    from sat_tasks.io.workspaces import WorkspaceStore

    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACES_DIR", str(tmp_path))
    WorkspaceStore().create({"name": "team-warm", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2027-12-31"},
                             "warm_pool": {"keep_alive_seconds": 120}})
    WorkspaceStore().create({"name": "team-cold", "nodes": 2, "contract": {"start": "2026-01-01", "end": "2027-12-31"}})
    inherited = steps.with_workspace_warm_pool(warm_job.job(workspace="team-warm", warm_pool=None), lines.append)
    assert inherited.warm_pool.keep_alive_seconds == 120
    assert "warm pool: keep_alive_seconds=120 from workspace team-warm" in lines
    own = steps.with_workspace_warm_pool(warm_job.job(workspace="team-warm"), lines.append)
    assert own.warm_pool.keep_alive_seconds == 600  # the job's own wins
    assert steps.with_workspace_warm_pool(warm_job.job(workspace="team-cold", warm_pool=None)).warm_pool is None
    spot = warm_job.job(workspace="team-warm", warm_pool=None, learning_type="spot")
    assert steps.with_workspace_warm_pool(spot).warm_pool is None  # Spot capacity is not held


def test_a_workspace_refuses_a_bad_keep_alive():
    from sat_tasks.spec import SpecError
    from sat_tasks.spec.workspace import parse_workspace

    with pytest.raises(SpecError) as refused:
        parse_workspace({"name": "w", "nodes": 1, "contract": {"start": "2026-01-01", "end": "2026-12-31"},
                         "warm_pool": {"keep_alive_seconds": 3601}})
    assert [str(p) for p in refused.value.problems] == ["warm_pool.keep_alive_seconds: must be between 1 and 3600"]


def test_a_reused_validation_is_kept_for_the_run_after(warm_job, lines):
    job, _ = _first_run(warm_job, lines)
    second = warm_job.run_id()
    staged = steps.stage_data(job, second, log=lines.append)
    assert steps.validate_data(job, second, staged, log=lines.append) == VALIDATION
    warm_job.complete(job, second)
    steps.cleanup_run(job, second, log=lines.append)
    assert warm_pool.WarmPoolStore(warm_job.hook).load(job).validation == VALIDATION
    third = warm_job.run_id()
    assert steps.stage_data(job, third, log=lines.append)["warm"]["validation"] == VALIDATION
