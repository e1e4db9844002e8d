"""Issue 44.7: the Nodes page shows a fault's job, run and evidence only to a person who may read that job's DAG.

Nodes are capacity (pool permission): everyone who may read pools sees which nodes are
quarantined and why in numbers. What the training of a job printed, and the job's name and
run, are the job's: `outsider` (refused the demo DAG) sees "a job you may not read" in their
place, on the page and in `GET /sat/api/nodes`; an admin sees them all.
"""

# ruff: noqa: F811 (the fixtures imported from test_api are parameters of the tests below)
from __future__ import annotations

import time
import uuid

from sat_tasks.core.node_health import FaultEvent
from sat_tasks.io.node_ledger import NodeLedger
from tests.sat_tasks.ui.test_api import (  # noqa: F401 (the module-scoped app and its client)
    DEMO,
    _headers,
    admin,
    app,
    client,
)

OTHER_JOB = "a job you may not read"  # sat_tasks.ui.routers.nodes.OTHER_JOB


def test_the_nodes_page_hides_other_dags_job_names_and_evidence(client, admin, s3_hook, demo_bucket):
    node, secret, created = f"gpu-tenancy-{uuid.uuid4().hex[:6]}", f"NVRM: Xid 79 {uuid.uuid4().hex}", "made-by-create"
    ledger = NodeLedger.for_deployment(s3_hook)
    now = time.time()
    ledger.record(FaultEvent(node=node, at=now - 60, job=DEMO, run_id="manual__victim-run", attempt=1,
                             kind="HARDWARE", signature="xid 79 victim", evidence=[secret]))
    ledger.record(FaultEvent(node=node, at=now - 30, job=created, run_id="manual__own", attempt=1,
                             kind="HARDWARE", signature="xid 79 own", evidence=["own evidence"]))
    outsider = _headers("outsider", "user")

    seen = client.get("/sat/api/nodes", headers=outsider)
    assert seen.status_code == 200, seen.text
    row = next(n for n in seen.json()["nodes"] if n["node"] == node)
    assert row["quarantined"] and len(row["faults"]) == 2  # the node's state stands
    assert DEMO not in seen.text and secret not in seen.text and "manual__victim-run" not in seen.text
    assert "xid 79 victim" not in seen.text
    assert OTHER_JOB in row["jobs"] and created in row["jobs"] and "own evidence" in seen.text
    page = client.get("/sat/nodes", headers=outsider)
    assert page.status_code == 200 and node in page.text
    assert secret not in page.text and "manual__victim-run" not in page.text and OTHER_JOB in page.text

    full = client.get("/sat/api/nodes", headers=admin)
    row = next(n for n in full.json()["nodes"] if n["node"] == node)
    assert DEMO in row["jobs"] and secret in full.text
    assert secret in client.get("/sat/nodes", headers=admin).text
