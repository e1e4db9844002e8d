"""The health check where the ledger decides (issue 43 item 3): `diagnose_attempt(..., probe=...)` with a fake device.

A suspect fault whose node fails the probe is HARDWARE, recorded against the node by "health-check" (SAT
read it there) even when the training only printed its error; a passed probe leaves the relocation to
decide and records nothing; a probe that raises decides nothing.
"""

from __future__ import annotations

import json
import uuid

import pytest

from sat_tasks.classify import classify
from sat_tasks.core.handoffs import VerdictKind
from sat_tasks.core.health_check import PROBE_RULE
from sat_tasks.io.node_ledger import NodeLedger, diagnose_attempt
from sat_tasks.io.node_probe import FAKE_DEVICE_FILE, FakeDeviceProbe
from tests.sat_tasks.io.test_ledger_observed import BUCKET, make_run, record
from tests.support.ledger import fresh_ledger_root

PRINTED = "RuntimeError: CUDA error: an illegal instruction was encountered"


@pytest.fixture
def root(s3_hook, monkeypatch) -> str:
    return fresh_ledger_root(s3_hook, monkeypatch, BUCKET)


def fake_device(tmp_path, **counters) -> FakeDeviceProbe:
    (tmp_path / "gpu-1").mkdir(exist_ok=True)
    (tmp_path / "gpu-1" / FAKE_DEVICE_FILE).write_text(json.dumps({"devices": [{"index": 0, **counters}]}))
    return FakeDeviceProbe(tmp_path)


def suspect_attempt(run):
    attempt = record(job=run.job.name, log_tail=[PRINTED])
    run.store_record(attempt)
    verdict = classify(attempt).model_copy(update={"attempt": 1, "node": "gpu-1"})
    assert verdict.kind is VerdictKind.HARDWARE and verdict.reason.startswith("ambiguous:")
    return verdict


def test_a_failed_health_check_decides_the_suspect_and_is_recorded(s3_hook, root, tmp_path):
    run = make_run(f"probed-{uuid.uuid4().hex[:6]}")
    lines: list[str] = []
    probe = fake_device(tmp_path, ecc_uncorrected_volatile=2, kernel_ok=True)
    verdict = diagnose_attempt(run, suspect_attempt(run), lines.append, probe=probe)
    assert verdict.kind is VerdictKind.HARDWARE and verdict.reason.startswith("health check: gpu-1 failed ecc:gpu0")
    events = NodeLedger(s3_hook, [root]).events()
    assert [(e.node, e.kind, e.by) for e in events] == [("gpu-1", "HARDWARE", PROBE_RULE)]
    assert any("the suspect fault is the node's" in line for line in lines), lines
    said = [entry["reason"] for entry in run.history(lines.append).entries()]
    assert any(r.startswith("health check: FAULTY by fake-device on gpu-1") for r in said), said


@pytest.mark.parametrize("counters", [{"ecc_uncorrected_volatile": 0, "kernel_ok": True}, None])
def test_a_passed_or_absent_health_check_leaves_the_relocation_to_decide(s3_hook, root, tmp_path, counters):
    run = make_run(f"probed-{uuid.uuid4().hex[:6]}")
    lines: list[str] = []
    probe = fake_device(tmp_path, **counters) if counters is not None else FakeDeviceProbe(tmp_path)
    verdict = diagnose_attempt(run, suspect_attempt(run), lines.append, probe=probe)
    assert verdict.kind is VerdictKind.SUSPECT_NODE
    assert NodeLedger(s3_hook, [root]).events() == []  # printed only, probe passed or absent: nothing on the node
    assert any("health check:" in line and "decide" in line for line in lines), lines


def test_a_probe_that_raises_decides_nothing(s3_hook, root):
    run = make_run(f"probed-{uuid.uuid4().hex[:6]}")
    lines: list[str] = []

    def broken(node):
        raise OSError("probe pod could not start")

    verdict = diagnose_attempt(run, suspect_attempt(run), lines.append, probe=broken)
    assert verdict.kind is VerdictKind.SUSPECT_NODE
    assert any("could not run (OSError: probe pod could not start)" in line for line in lines), lines
