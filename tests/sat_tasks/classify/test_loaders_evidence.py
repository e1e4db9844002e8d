"""`sat classify` takes the Kubernetes backend's evidence from files: node events in the attempt's window, node labels at start."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sat_tasks.classify import load_record_with_notes
from sat_tasks.classify.loaders import NODE_LABELS_AT_START_ANNOTATION, record_from_pod
from sat_tasks.classify.window import (
    MAX_EVENTS_PER_OBJECT,
    WINDOW_AFTER,
    WINDOW_BEFORE,
    AttemptWindow,
)
from sat_tasks.cli.classify import register, run_classify_cli

STARTED = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
FINISHED = STARTED + timedelta(hours=1)
NODE = "gke-a3-spot-pool-7c1e"
SPOT = {"cloud.google.com/gke-spot": "true", "kubernetes.io/hostname": NODE}


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(annotations: dict | None = None, *, finished: datetime | None = FINISHED) -> dict:
    state = ({"terminated": {"exitCode": 143, "reason": "Error", "startedAt": _at(STARTED),
                             "finishedAt": _at(finished)}} if finished else {"running": {"startedAt": _at(STARTED)}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "sat-train-a1-r0", "labels": {"dag_id": "train", "task_id": "attempt_1.launch"},
                         "annotations": annotations or {}},
            "spec": {"nodeName": NODE, "containers": [{"name": "base", "image": "img:1"}]},
            "status": {"phase": "Failed" if finished else "Running", "startTime": _at(STARTED),
                       "containerStatuses": [{"name": "base", "state": state}]}}


def _event(reason: str, at: datetime, *, kind: str = "Node", name: str = NODE, component: str = "kubelet") -> dict:
    return {"kind": "Event", "metadata": {"name": f"{name}.{reason}", "namespace": "default"},
            "involvedObject": {"kind": kind, "name": name}, "reason": reason, "message": reason, "type": "Warning",
            "source": {"component": component}, "lastTimestamp": _at(at)}


def _write(path: Path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _reasons(record) -> list[str]:
    return [e.get("reason") for e in record.events]


NODE_EVENTS = [
    _event("StaleXid", STARTED - timedelta(hours=5), component="nvidia-dcgm"),
    _event("PreemptScheduled", FINISHED - timedelta(seconds=30), component="gke-preemption"),
    _event("NodeNotReady", FINISHED + timedelta(seconds=45), component="node-controller"),
    _event("NextJobXid", FINISHED + WINDOW_AFTER + timedelta(seconds=1), component="nvidia-dcgm"),
]


@pytest.mark.parametrize("shape", [pytest.param("event-list", id="EventList"), pytest.param("list", id="list")])
def test_node_events_of_a_pod_are_read_within_its_window(tmp_path, shape):
    pod = _write(tmp_path / "pod.json", _pod())
    listed = {"apiVersion": "v1", "kind": "EventList", "items": NODE_EVENTS} if shape == "event-list" else NODE_EVENTS
    pod_events = [_event("Killing", FINISHED - timedelta(seconds=29), kind="Pod", name="sat-train-a1-r0")]
    record, notes = load_record_with_notes(pod, events=_write(tmp_path / "ev.json", {"items": pod_events}),
                                           node_events=_write(tmp_path / "node-ev.json", listed))
    assert _reasons(record) == ["Killing", "PreemptScheduled", "NodeNotReady"]
    assert notes == []


def test_node_events_of_a_record_are_read_within_its_started_and_finished(tmp_path):
    data = {"job": "train", "attempt": 2, "backend": "kubernetes", "node": NODE, "started_at": _at(STARTED),
            "finished_at": _at(FINISHED), "events": [{"reason": "Killing", "message": "Stopping container base"}]}
    record, notes = load_record_with_notes(_write(tmp_path / "record.json", data),
                                           node_events=_write(tmp_path / "node-ev.json", NODE_EVENTS))
    assert _reasons(record) == ["Killing", "PreemptScheduled", "NodeNotReady"] and notes == []


def test_kueue_and_karpenter_pod_events_reach_the_record(tmp_path):
    pod = _pod()
    pod["status"]["conditions"] = [{"type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue",
                                    "message": "Preempted to accommodate a workload"}]
    events = [_event("Preempted", FINISHED - timedelta(seconds=20), kind="Workload", name="pod-sat-train-a1-r0-1f2e3",
                     component="kueue-admission"),
              _event("Evicted", FINISHED - timedelta(seconds=10), kind="Pod", name="sat-train-a1-r0",
                     component="karpenter")]
    record, notes = load_record_with_notes(_write(tmp_path / "pod.json", pod),
                                           events=_write(tmp_path / "ev.json", {"items": events}))
    assert [(e["source"]["component"], e["reason"]) for e in record.events] == [
        ("kueue-admission", "Preempted"), ("karpenter", "Evicted")]
    assert record.pod_conditions[0]["type"] == "TerminationTarget" and notes == []


def test_node_labels_at_start_from_the_pod_annotation_and_from_a_record(tmp_path):
    pod = _pod({NODE_LABELS_AT_START_ANNOTATION: json.dumps(SPOT)})
    record, notes = load_record_with_notes(_write(tmp_path / "pod.json", pod))
    assert record.node_labels_at_start == SPOT and record.node_labels == {} and notes == []
    stored = _write(tmp_path / "record.json", record.model_dump(mode="json"))
    assert load_record_with_notes(stored)[0].node_labels_at_start == SPOT
    assert record_from_pod(pod, job="j", attempt=1, node_labels_at_start={"a": "b"}).node_labels_at_start == {"a": "b"}


@pytest.mark.parametrize("value, expected, note", [
    pytest.param("{not json", {}, f"pod annotation {NODE_LABELS_AT_START_ANNOTATION} is not JSON: ignored",
                 id="not-json"),
    pytest.param(json.dumps(["spot"]), {}, f"pod annotation {NODE_LABELS_AT_START_ANNOTATION} is a list, "
                                           "not a mapping of labels: ignored", id="a-list"),
    pytest.param(json.dumps({"cloud.google.com/gke-spot": True, "odd": {"x": 1}}), {"cloud.google.com/gke-spot": "true"},
                 f"pod annotation {NODE_LABELS_AT_START_ANNOTATION}: 1 label(s) without a text value ignored ('odd')",
                 id="booleans-kept-objects-dropped"),
])
def test_a_malformed_annotation_is_named_and_skipped(tmp_path, value, expected, note):
    record, notes = load_record_with_notes(_write(tmp_path / "pod.json", _pod({NODE_LABELS_AT_START_ANNOTATION: value})))
    assert record.node_labels_at_start == expected and notes == [note]


@pytest.mark.parametrize("value, expected, note", [
    pytest.param(["spot"], {}, "record field 'node_labels_at_start' is malformed: ignored", id="a-list"),
    pytest.param({"karpenter.sh/capacity-type": "spot", "n": None}, {"karpenter.sh/capacity-type": "spot"},
                 "record field 'node_labels_at_start': 1 label(s) without a text value ignored ('n')", id="a-null"),
])
def test_a_malformed_record_field_is_named_and_skipped(tmp_path, value, expected, note):
    data = {"job": "train", "attempt": 1, "backend": "kubernetes", "node_labels_at_start": value}
    record, notes = load_record_with_notes(_write(tmp_path / "record.json", data))
    assert record.node_labels_at_start == expected and notes == [note]


@pytest.mark.parametrize("content, note", [
    pytest.param("{oops", "node events not read: ", id="not-json"),
    pytest.param({"items": {"a": 1}}, "node events: not a list of events: skipped", id="items-not-a-list"),
    pytest.param([1, "x", _event("NodeNotReady", FINISHED)], "node events: 2 event(s) are not objects: skipped",
                 id="not-objects"),
])
def test_a_malformed_node_events_file_is_named_once_and_never_fatal(tmp_path, content, note):
    record, notes = load_record_with_notes(_write(tmp_path / "pod.json", _pod()),
                                           node_events=_write(tmp_path / "node-ev.json", content))
    assert len(notes) == 1 and notes[0].startswith(note), notes
    assert record.exit_code == 143


def test_node_events_are_bounded_to_the_newest(tmp_path):
    many = [_event(f"Npd{i}", STARTED + timedelta(seconds=i)) for i in range(MAX_EVENTS_PER_OBJECT + 5)]
    record, notes = load_record_with_notes(_write(tmp_path / "pod.json", _pod()),
                                           node_events=_write(tmp_path / "node-ev.json", many))
    assert _reasons(record) == [f"Npd{i}" for i in range(5, MAX_EVENTS_PER_OBJECT + 5)]
    assert notes == [f"node events: {len(many)} in the attempt's window, read only the newest {MAX_EVENTS_PER_OBJECT}"]


@pytest.mark.parametrize("pod, start, end", [
    pytest.param(_pod(), STARTED - WINDOW_BEFORE, FINISHED + WINDOW_AFTER, id="ended"),
    pytest.param(_pod(finished=None), STARTED - WINDOW_BEFORE, None, id="running"),
    pytest.param({"status": {"phase": "Failed", "conditions": [
        {"type": "PodScheduled", "lastTransitionTime": _at(STARTED)},
        {"type": "DisruptionTarget", "lastTransitionTime": _at(FINISHED)}]}},
        STARTED - WINDOW_BEFORE, FINISHED + WINDOW_AFTER, id="failed-without-container-state"),
    pytest.param({"status": {"phase": "Pending"}}, None, None, id="never-started"),
])
def test_the_attempt_window_of_a_pod(pod, start, end):
    assert AttemptWindow.of_pod(pod) == AttemptWindow(start, end)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sat")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_sat_classify_node_events_flag(tmp_path, capsys):
    pod = _pod({NODE_LABELS_AT_START_ANNOTATION: json.dumps(SPOT)})
    node_events = {"items": NODE_EVENTS + [{"no": "time"}, 7]}
    code = _cli(["classify", _write(tmp_path / "pod.json", pod), "--node-events",
                 _write(tmp_path / "node-ev.json", node_events), "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["kind"]
    assert err.splitlines() == [
        "sat classify: could not read everything: node events: 1 event(s) are not objects: skipped"]


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))
JSON_ANY = st.recursive(JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=10)
EVENT = st.one_of(JSON_ANY, st.fixed_dictionaries({}, optional={
    key: st.one_of(JSON_LEAF, st.just(_at(STARTED))) for key in ("lastTimestamp", "eventTime", "firstTimestamp",
                                                                  "reason")} | {"metadata": JSON_ANY}))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(JSON_ANY, st.lists(EVENT, max_size=4), st.fixed_dictionaries({"items": st.lists(EVENT)})),
       annotation=st.one_of(st.none(), JSON_LEAF, JSON_ANY.map(json.dumps)))
def test_any_node_events_file_or_annotation_is_read_or_named(tmp_path, content, annotation):
    pod = _pod({} if annotation is None else {NODE_LABELS_AT_START_ANNOTATION: annotation})
    assert run_classify_cli(argparse.Namespace(
        file=_write(tmp_path / "pod.json", pod), node_events=_write(tmp_path / "node-ev.json", content),
        json=True)) == 0
