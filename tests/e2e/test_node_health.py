"""Relocation and the node health ledger end to end (issue 27 items 6, 7): local backend, embedded S3, dag.test().

Two Training Jobs meet the same bad node. The first hits an ambiguous device error (Xid 68)
there: SUSPECT_NODE, one failover, a clean run on the next node, the first node blamed. The
second hits a hardware fault on it: faults of two jobs, so the node is quarantined; the next
placement avoids it until a person releases it. Two DAG runs of two attempts each: ~60 s on two
idle cores (242 s while other suites ran beside it), so `make test` runs it early (tests/conftest.py).
"""

from __future__ import annotations

from sat_tasks.airflow.dag_factory import GENERIC_DAG_ID
from sat_tasks.backends.local.workspace import attempt_nodes
from sat_tasks.cli import main
from sat_tasks.core.handoffs import Plan
from sat_tasks.io.node_ledger import NodeLedger
from sat_tasks.io.object_storage import read_json
from sat_tasks.io.run_layout import JobRun
from tests.e2e.test_job_dags import make_job, run, scripts_in_bucket  # noqa: F401 - the fixture


def fault(xid: int) -> list[dict]:
    return [{"kind": "hardware", "attempt": 1, "at_step": 5, "xid": xid}]


def reasons(report: dict) -> list[str]:
    return [entry["reason"] for entry in report["history"]]


def test_a_suspect_node_is_relocated_blamed_and_quarantined_when_a_second_job_fails_there(
        scripts_in_bucket, s3_hook):  # noqa: F811 - the fixture imported above
    first_job = make_job("e2e-suspect-a", faults=fault(68))
    report, attempts = run(first_job)
    assert report["status"] == "Completed"
    assert [(a["verdict"], a["node"]) for a in attempts] == [("SUSPECT_NODE", "local-node-0"),
                                                            ("SUCCEEDED", "local-node-1")]
    assert any("Xid" in line and "68" in line for line in attempts[0]["evidence"])
    said = reasons(report)
    assert any(r.startswith("suspect node local-node-0: ") and "relocating once" in r for r in said)
    assert any(r.startswith("relocation: attempt 2 ran clean on local-node-1 after attempt 1's suspect fault on "
                            "local-node-0: local-node-0 is blamed") for r in said)
    second = read_json(s3_hook, JobRun.of(first_job, GENERIC_DAG_ID, report["run_id"]).verdict_uri(2))  # the Attempts tab's data
    assert second["kind"] == "SUCCEEDED" and "local-node-0 is blamed" in second["reason"]
    ledger = NodeLedger.for_job(first_job, s3_hook)
    assert [(e.node, e.kind, e.by) for e in ledger.events()] == [("local-node-0", "SUSPECT_NODE", "classify"),
                                                                  ("local-node-0", "HARDWARE", "relocation")]
    assert ledger.quarantined() == []  # one job's faults: watched, not quarantined

    report, attempts = run(make_job("e2e-suspect-b", faults=fault(79)))
    assert report["status"] == "Completed"
    assert [(a["verdict"], a["node"]) for a in attempts] == [("HARDWARE", "local-node-0"), ("SUCCEEDED", "local-node-1")]
    assert ledger.quarantined() == ["local-node-0"]

    # A third job's placement avoids the node until a person releases it.
    third = JobRun(make_job("e2e-suspect-c"), "manual__e2e-suspect-c")
    lines: list[str] = []
    with attempt_nodes(third, Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["local-node-1"]
    assert any("not placing on quarantined node(s) local-node-0" in line for line in lines)
    assert main(["nodes", "release", "local-node-0", "--note", "GPU replaced"]) == 0
    with attempt_nodes(third, Plan(attempt=1), lines.append) as nodes:
        assert nodes == ["local-node-0"]
