"""The Nodes page's router on an app of its own (FastAPI's TestClient), over a ledger on the embedded S3 server."""

from __future__ import annotations

import time
import uuid

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sat_tasks.core.node_health import FaultEvent
from sat_tasks.io.node_ledger import NodeLedger
from sat_tasks.ui.routers import nodes
from sat_tasks.ui.security import CHANGE_POOLS, READ_POOLS, SAME_ORIGIN

BUCKET = "nodes-page-tests"
HOST = "http://testserver"


@pytest.fixture
def ledger(s3_hook) -> NodeLedger:
    if not s3_hook.check_for_bucket(BUCKET):
        s3_hook.create_bucket(bucket_name=BUCKET, region_name="us-east-1")
    ledger = NodeLedger(s3_hook, [f"s3://{BUCKET}/ledger-{uuid.uuid4().hex[:8]}/"])
    now = time.time()
    for job, ago in (("job-a", 300), ("job-b", 200)):
        ledger.record(FaultEvent(node="gpu-1", at=now - ago, job=job, run_id="r1", attempt=1, kind="SUSPECT_NODE",
                                 signature="xid 68", evidence=["NVRM: Xid 68 <script>alert(1)</script>"]))
    return ledger


class _Opaque:
    """An ASGI app whose routes the outer router cannot see: how Airflow mounts the plugin's LazyApp."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


@pytest.fixture
def client(ledger) -> TestClient:
    view = FastAPI()
    view.include_router(nodes.router)
    allowed = {depends.dependency: (lambda: None) for depends in READ_POOLS + CHANGE_POOLS}
    view.dependency_overrides.update({**allowed, nodes.user_name: lambda: "admin", nodes.node_ledger: lambda: ledger,
                                     nodes.job_reader: lambda: (lambda job: True)})
    airflow = FastAPI()
    airflow.mount("/sat", _Opaque(view))  # as Airflow's API server mounts `fastapi_apps` (request.url_for fails)
    return TestClient(airflow, base_url=HOST)


def test_every_route_asks_airflows_pool_permission():
    needs = {route.path: {d.dependency for d in route.dependencies} for route in nodes.router.routes}
    can_read, can_change, same_origin = READ_POOLS[0].dependency, CHANGE_POOLS[0].dependency, SAME_ORIGIN[0].dependency
    assert needs["/nodes"] == needs["/api/nodes"] == {can_read}
    assert needs["/api/nodes/{node}/release"] == {can_change}
    assert needs["/nodes/{node}/release"] == {can_change, same_origin}


def test_the_page_lists_a_quarantined_node_with_its_evidence_escaped(client):
    page = client.get("/sat/nodes")
    assert page.status_code == 200
    assert "<nav class='views'>" in page.text and "href='/sat/jobs'" in page.text  # the view's navigation
    assert 'data-node="gpu-1"' in page.text and "quarantined" in page.text and "job-a, job-b" in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text and "<script>alert" not in page.text
    assert 'action="/sat/nodes/gpu-1/release"' in page.text
    assert client.get("/sat/api/nodes").json()["nodes"][0]["quarantined"] is True


def test_release_from_the_page_and_from_the_api(client, ledger):
    refused = client.post("/sat/nodes/gpu-1/release", data={"note": "x"}, headers={"origin": "https://evil.example"})
    assert refused.status_code == 403 and ledger.quarantined() == ["gpu-1"]
    done = client.post("/sat/nodes/gpu-1/release", data={"note": "reseated"}, headers={"origin": HOST},
                       follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/sat/nodes?released=gpu-1"
    assert ledger.quarantined() == [] and ledger.releases()[-1].by == "admin"
    assert "Released gpu-1" in client.get(done.headers["location"]).text
    assert client.post("/sat/api/nodes/gpu-1/release", json={"note": "again"}).json()["released"]["note"] == "again"
    assert client.post("/sat/api/nodes/no-such-node/release").status_code == 404
