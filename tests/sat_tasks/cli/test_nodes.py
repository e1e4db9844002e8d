"""`sat nodes ls|release` against the embedded S3 server."""

from __future__ import annotations

import json
import re
import time

import pytest

from sat_tasks.cli import main
from sat_tasks.core.node_health import FaultEvent
from sat_tasks.io.node_ledger import NodeLedger
from tests.support.ledger import fresh_ledger_root

BUCKET = "nodes-cli-tests"


@pytest.fixture
def ledger(s3_hook, monkeypatch) -> NodeLedger:
    root = fresh_ledger_root(s3_hook, monkeypatch, BUCKET)
    ledger = NodeLedger(s3_hook, [root])
    now = time.time()
    for job, node, ago in (("job-a", "gpu-1", 300), ("job-b", "gpu-1", 200), ("job-a", "gpu-2", 100)):
        ledger.record(FaultEvent(node=node, at=now - ago, job=job, run_id="r1", attempt=1, kind="HARDWARE",
                                 signature="nvrm: xid 79, gpu has fallen off the bus",
                                 evidence=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]))
    return ledger


def printed(capsys) -> list[str]:
    """What the command printed, without the Airflow provider's own log lines (they go to stdout too)."""
    return [line for line in capsys.readouterr().out.splitlines() if not re.match(r"\d{4}-\d\d-\d\dT", line)]


def test_ls_lists_quarantined_nodes_first_with_their_evidence(ledger, capsys):
    assert main(["nodes", "ls"]) == 0
    out = printed(capsys)
    assert out[0].startswith("gpu-1  quarantined: 2 fault(s) (HARDWARE) from 2 job(s): job-a, job-b")
    assert any("HARDWARE     job job-b run r1 attempt 1  nvrm: xid 79" in line for line in out)
    assert any(line.startswith("gpu-2  watched: 1 fault(s)") for line in out)
    assert out[-1].startswith("1 quarantined node(s), 1 other node(s) with faults in the last 86400s")
    assert main(["nodes", "ls", "--json"]) == 0
    data = json.loads("\n".join(printed(capsys)))
    assert [(n["node"], n["quarantined"]) for n in data["nodes"]] == [("gpu-1", True), ("gpu-2", False)]


def test_release_lifts_a_quarantine_and_says_when_there_was_none(ledger, capsys):
    assert main(["nodes", "release", "gpu-1", "--note", "GPU reseated"]) == 0
    assert "released gpu-1 (by " in printed(capsys)[-1]
    assert ledger.quarantined() == [] and ledger.releases()[-1].note == "GPU reseated"
    assert main(["nodes", "release", "gpu-2"]) == 1
    assert "gpu-2 was not quarantined" in printed(capsys)[-1]
