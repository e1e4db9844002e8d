"""`sat classify` never crashes on malformed input: it names what it could not read and classifies the rest."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sat_tasks.cli.classify import register, run_classify_cli

# JSON values where a pod field should be: anything, most of all null and wrong types.
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
JSON_ANY = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=12)
STATE = st.fixed_dictionaries({}, optional={
    "terminated": st.one_of(JSON_ANY, st.fixed_dictionaries({}, optional={
        "exitCode": st.one_of(st.integers(-300, 300), JSON_LEAF), "reason": JSON_LEAF, "message": JSON_LEAF,
        "signal": JSON_LEAF, "startedAt": JSON_LEAF, "finishedAt": JSON_LEAF})),
    "waiting": st.one_of(JSON_ANY, st.fixed_dictionaries({"reason": st.sampled_from(
        ["ErrImagePull", "StartError", "CreateContainerError", "x"])})),
    "running": JSON_ANY,
})
CONTAINER = st.one_of(JSON_ANY, st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.just("base"), JSON_LEAF), "state": st.one_of(STATE, JSON_LEAF),
    "lastState": st.one_of(STATE, JSON_LEAF), "image": JSON_LEAF}))
POD = st.fixed_dictionaries({"kind": st.just("Pod")}, optional={
    "metadata": st.one_of(JSON_ANY, st.fixed_dictionaries({}, optional={"name": JSON_LEAF, "labels": JSON_ANY})),
    "spec": st.one_of(JSON_ANY, st.fixed_dictionaries({}, optional={
        "nodeName": JSON_LEAF, "nodeSelector": JSON_ANY, "containers": JSON_ANY, "affinity": JSON_ANY})),
    "status": st.one_of(JSON_LEAF, st.fixed_dictionaries({}, optional={
        "reason": JSON_LEAF, "message": JSON_LEAF, "conditions": st.one_of(JSON_ANY, st.lists(JSON_ANY, max_size=3)),
        "containerStatuses": st.one_of(JSON_LEAF, st.lists(CONTAINER, max_size=2)),
        "initContainerStatuses": JSON_ANY})),
})
RECORD = st.fixed_dictionaries({"job": st.text(min_size=1, max_size=8), "attempt": st.integers(1, 5),
                                "backend": st.sampled_from(["local", "kubernetes"])},
                               optional={key: JSON_ANY for key in (
                                   "exit_code", "signal", "node", "termination_reason", "container_states",
                                   "pod_conditions", "events", "node_conditions", "node_taints", "node_labels",
                                   "log_tail", "progress", "started_at", "preemption_notice")})
LOG_BYTES = st.one_of(
    st.binary(max_size=2000),
    st.text(max_size=500).map(lambda text: text.encode("utf-16")),
    st.text(max_size=500).map(lambda text: text.encode("latin-1", errors="replace")),
    st.sampled_from([b"RuntimeError: CUDA error: unhandled cuda error\n", b"\x00" * 64 + b"Xid 79\n"]),
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sat")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def run(tmp: Path, main: Any, log: bytes, events: Any, node: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    (tmp / "main.json").write_text(json.dumps(main))
    (tmp / "container.log").write_bytes(log)
    (tmp / "events.json").write_text(json.dumps(events))
    (tmp / "node.json").write_text(json.dumps(node))
    code = run_classify_cli(parse(["classify", str(tmp / "main.json"), "--log", str(tmp / "container.log"),
                                   "--events", str(tmp / "events.json"), "--node", str(tmp / "node.json"), "--json"]))
    out, _err = capsys.readouterr()
    return code, out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(main=st.one_of(POD, RECORD, JSON_ANY), log=LOG_BYTES, events=JSON_ANY, node=JSON_ANY)
def test_sat_classify_never_crashes_on_malformed_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       main: Any, log: bytes, events: Any, node: Any):
    code, out = run(tmp_path, main, log, events, node, capsys)
    assert code in (0, 2)
    if code == 0:
        assert json.loads(out)["kind"] in {"SUCCEEDED", "HARDWARE", "PREEMPTED", "INTERNAL", "IMAGE_PULL"}


def test_null_fields_and_missing_statuses_are_named_and_the_rest_classified(tmp_path: Path, capsys):
    pod = {"kind": "Pod", "metadata": None, "spec": {"nodeName": None},
           "status": {"reason": "Evicted", "message": "The node was low on resource: memory.",
                      "containerStatuses": None, "conditions": [None, "x"]}}
    code, out = run(tmp_path, pod, b"\xff\xfe\x00garbage\x00", {"items": "nope"}, [1, 2], capsys)
    assert code == 0 and json.loads(out)["kind"] == "HARDWARE"
    err = capsys.readouterr().err
    (tmp_path / "main.json").write_text(json.dumps(pod))
    run_classify_cli(parse(["classify", str(tmp_path / "main.json"), "--events", str(tmp_path / "events.json"),
                            "--node", str(tmp_path / "node.json")]))
    err = capsys.readouterr().err
    assert "no container statuses" in err and "events: not a list" in err and "node: not a Node object" in err


def test_a_huge_binary_log_is_read_from_its_end(tmp_path: Path, capsys):
    from sat_tasks.classify import loaders

    log = tmp_path / "container.log"
    with log.open("wb") as handle:
        handle.write(b"\x00\x01\x02" * (loaders.LOG_READ_BYTES // 3 + 1000))
        handle.write(b"\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n")
    (tmp_path / "pod.json").write_text(json.dumps({"kind": "Pod", "status": {"containerStatuses": [
        {"name": "base", "state": {"terminated": {"exitCode": "1"}}}]}}))
    code = run_classify_cli(parse(["classify", str(tmp_path / "pod.json"), "--log", str(log), "--json"]))
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["kind"] == "HARDWARE"
    assert "read only its last 8 MiB" in captured.err


def test_a_record_with_malformed_optional_fields_keeps_the_rest(tmp_path: Path, capsys):
    record = {"job": "j", "attempt": 1, "backend": "local", "exit_code": "oops", "signal": [1],
              "log_tail": ["Traceback (most recent call last):", "ValueError: bad config"]}
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert run_classify_cli(parse(["classify", str(tmp_path / "record.json"), "--json"])) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["kind"] == "INTERNAL"
    assert "'exit_code' is malformed" in captured.err and "'signal' is malformed" in captured.err


@pytest.mark.parametrize("labels, said", [
    pytest.param(None, "'node_labels' is malformed", id="null"),
    pytest.param(["karpenter.sh/capacity-type=spot"], "'node_labels' is malformed", id="a-list"),
    pytest.param("spot", "'node_labels' is malformed", id="a-string"),
])
def test_a_record_with_unreadable_node_labels_is_classified_without_them(tmp_path: Path, capsys, labels, said):
    record = {"job": "j", "attempt": 1, "backend": "kubernetes", "termination_reason": "NodeLost",
              "node_labels": labels}
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert run_classify_cli(parse(["classify", str(tmp_path / "record.json"), "--json"])) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["kind"] == "HARDWARE"  # no Spot capacity known: a lost node
    assert said in captured.err


def test_node_labels_keep_their_text_values_and_name_the_rest(tmp_path: Path, capsys):
    record = {"job": "j", "attempt": 1, "backend": "kubernetes", "termination_reason": "NodeLost",
              "node_labels": {"karpenter.sh/capacity-type": "spot", "zone": None, "gpus": 8, "odd": {"x": 1}}}
    (tmp_path / "record.json").write_text(json.dumps(record))
    assert run_classify_cli(parse(["classify", str(tmp_path / "record.json"), "--json"])) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["kind"] == "PREEMPTED"
    assert "record field 'node_labels': 2 label(s) without a text value ignored ('zone', 'odd')" in captured.err

    pod = {"kind": "Pod", "spec": {"nodeName": "n"}, "status": {"reason": "NodeLost"}}
    for labels, kind, said in (
        ({"cloud.google.com/gke-spot": True, "bad": [1]}, "PREEMPTED", "node metadata.labels: 1 label(s)"),
        (["cloud.google.com/gke-spot"], "HARDWARE", "node metadata.labels is a list, not a mapping"),
    ):
        code, out = run(tmp_path, pod, b"", [], {"kind": "Node", "metadata": {"name": "n", "labels": labels}}, capsys)
        assert code == 0 and json.loads(out)["kind"] == kind
        (tmp_path / "main.json").write_text(json.dumps(pod))
        run_classify_cli(parse(["classify", str(tmp_path / "main.json"), "--node", str(tmp_path / "node.json")]))
        assert said in capsys.readouterr().err
