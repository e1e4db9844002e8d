"""An elastic job inside a Training Workspace (issue 32, ADR 0029): its failover shrinks instead of waiting for an edit."""

from __future__ import annotations

from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.core.handoffs import Plan
from sat_tasks.core.status import JobStatus, StatusHistory
from sat_tasks.io.workspaces import SlotBoard, WorkspaceStore
from sat_tasks.spec import parse_spec

from .conftest import job_spec


class FakeRun:
    """What `attempt_nodes` uses of a JobRun: the job, the run id, a status history (kept in memory)."""

    def __init__(self, job) -> None:
        self.job, self.run_id, self.entries = job, "run-elastic", []

    def history(self, log=print) -> StatusHistory:
        return StatusHistory(load=lambda: self.entries, save=lambda e: setattr(self, "entries", e), log=log)


def test_a_workspace_with_exactly_the_jobs_nodes_shrinks_an_elastic_failover(sat_dirs, workspace_data, monkeypatch):
    monkeypatch.setenv("AIRFLOW__SAT__WORKSPACE_WAIT_SECONDS", "30")
    WorkspaceStore().create({**workspace_data, "nodes": 2})
    run = FakeRun(parse_spec(job_spec(job_failover=True, elastic={"min_nodes": 1, "wait_seconds": 0})))
    plan = Plan(attempt=2, exclude_nodes=["team-a-node-0"], failovers=1, resume_step=10)
    with attempt_nodes(run, plan, lambda _line: None, poll_seconds=0.02) as nodes:
        assert nodes == ["team-a-node-1"]
        assert nodes.note.startswith("resumed on 1 of 2 nodes (team-a-node-0 excluded: HARDWARE)")
        assert [(u.job, u.state, u.nodes) for u in SlotBoard("team-a").uses()] == [
            ("ws-job", "running", ("team-a-node-1",))]
    waited = [e for e in run.entries if e["status"] == JobStatus.FAILOVER_IN_PROGRESS.value]
    assert waited and "waiting for the workspace to grow" in waited[-1]["reason"]
    assert SlotBoard("team-a").uses() == []
