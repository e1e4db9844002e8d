"""The warm pool's pure rules (sat_tasks.core.warm_pool) and the hook the task functions call."""

from __future__ import annotations

import pytest

from sat_tasks.core.warm_pool import (
    WarmState,
    claim_parts,
    image_reuse,
    not_kept_because,
    reuse_lines,
    spec_hash,
    validation_reuse,
)
from sat_tasks.pipeline.warm_pool import NoWarmPool, WarmPool, hook_for
from sat_tasks.spec import parse_spec


def job(**overrides):
    data = {"name": "warm-rules", "image": {"url": "registry.sat.local/sat/training:0.1.0"},
            "data": {"source": "s3://bucket/data/"}, "results": {"destination": "s3://bucket/results/"},
            "command": "python train.py", "backend": "local", "warm_pool": {"keep_alive_seconds": 600}}
    data.update(overrides)
    return parse_spec(data, source="test").with_backend("local")


def state(the_job, **overrides) -> WarmState:
    data = dict(job=the_job.name, backend="local", run_id="run-1", kept_at=0.0, expires_at=100.0,  # noqa: C408
                spec_hash=spec_hash(the_job), data_source=the_job.data.source, data_dir="/warm/data",
                objects={"data/a.txt": "e1"}, suite_hash="s1", validation={"success": True},
                image={"reference": "r", "digest": "sha256:" + "a" * 64}, nodes=["local-node-1"])
    data.update(overrides)
    return WarmState(**data)


def test_an_unchanged_job_takes_over_the_node_and_the_staged_data():
    the_job = job()
    claim = claim_parts(state(the_job), the_job)
    assert claim.node == ["local-node-1"] and claim.data_dir == "/warm/data" and claim.lines == []


@pytest.mark.parametrize(("change", "node", "data", "line"), [
    pytest.param({"command": "python other.py"}, [], "/warm/data", "spec changed", id="spec-changed"),
    pytest.param({"data": {"source": "s3://bucket/other/"}}, [], None, "data source changed", id="data-changed"),
    pytest.param({"tags": {"team": "a"}}, ["local-node-1"], "/warm/data", None, id="tags-are-not-the-spec"),
])
def test_what_a_change_keeps_out_of_the_claim(change, node, data, line):
    kept = job()
    claim = claim_parts(state(kept), job(**change))
    assert claim.node == node  # the data source is part of the spec: a new one needs a new node too
    assert claim.data_dir == data
    assert (line is None and claim.lines == []) or any(line in entry for entry in claim.lines)


def test_another_backend_reuses_nothing():
    the_job = job()
    claim = claim_parts(state(the_job, backend="kubernetes"), the_job)
    assert claim.node == [] and claim.data_dir is None and "backend changed" in claim.lines[0]


def test_image_and_validation_reuse_need_their_keys_unchanged():
    the_job = job()
    kept = state(the_job)
    assert image_reuse(kept, {"reference": "r", "digest": kept.image["digest"]})[0] is True
    assert image_reuse(kept, {"reference": "r", "digest": None}) == (False, "image r: no registry digest "
                                                                            "(not pulled on this backend)")
    assert validation_reuse(kept, {"data/a.txt": "e1"}, "s1") == {"success": True}
    assert validation_reuse(kept, {"data/a.txt": "e2"}, "s1") is None  # the data changed
    assert validation_reuse(kept, {"data/a.txt": "e1"}, "s2") is None  # the suite changed


@pytest.mark.parametrize(("status", "stop", "why"), [
    pytest.param("Completed", None, None, id="completed-kept"),
    pytest.param("Failed", None, "ended as Failed", id="failed"),
    pytest.param("Completed", {"by": "ana"}, "stopped by ana", id="stopped"),
    pytest.param(None, None, "ended as None", id="no-history"),
])
def test_a_run_is_kept_only_when_it_completed_and_nobody_stopped_it(status, stop, why):
    assert not_kept_because(status, stop) == why


def test_a_cold_start_says_so_and_reuses_nothing():
    assert reuse_lines(None, {}, {}, {}, None) == (
        ["warm pool: cold start (nothing reused); this run will be kept warm if it completes"], {})


def test_the_steps_get_the_warm_pool_hook_only_for_a_job_with_a_warm_pool():
    assert hook_for(job()) is WarmPool
    assert hook_for(job(warm_pool=None)) is NoWarmPool
    assert NoWarmPool.reused_validation(None, {"warm": {"validation": {"success": True}}}, print) is None
