"""`sat classify FILE`: why did an attempt fail? (an attempt record, or a pod as kubectl prints it)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `sat classify FILE [--log FILE] [--node-log FILE] [--json] [--explain]`."""
    parser = subparsers.add_parser(
        "classify",
        help="classify a failed attempt as hardware, preempted, internal, image or succeeded",
        description="Classify one training attempt and print the verdict with its evidence. FILE is an "
                    "attempt record JSON or a pod as `kubectl get pod NAME -o json` prints it ('-' = stdin).",
    )
    parser.add_argument("file", metavar="FILE", help="attempt record or pod JSON")
    parser.add_argument("--log", metavar="FILE", help="the container log (`kubectl logs POD`)")
    parser.add_argument("--node-log", metavar="FILE", help="kernel-log lines of the node (dmesg, journalctl -k)")
    parser.add_argument("--events", metavar="FILE", help="events JSON (`kubectl get events -o json`)")
    parser.add_argument("--node", metavar="FILE", help="node JSON (`kubectl get node NAME -o json`)")
    parser.add_argument("--node-events", metavar="FILE",
                        help="the node's (or its NodeClaim's, or the Kueue Workload's) events JSON (`kubectl get "
                             "events -n default -o json --field-selector involvedObject.name=NODE`); only those "
                             "within the attempt's window are read, as the Kubernetes backend reads them")
    parser.add_argument("--json", action="store_true", help='print {"kind": ..., "evidence": [...], "reason": ...}')
    parser.add_argument("--explain", action="store_true",
                        help="also print every rule that matched (family, kind, line) and each precedence step "
                             "weighed, with the one that decided and why")
    parser.set_defaults(func=run_classify_cli)
    return parser


def run_classify_cli(args: argparse.Namespace) -> int:
    """Run `sat classify`; 0 when classified, 2 when the input cannot be read at all.

    Malformed parts (null fields, missing container statuses, binary or huge logs, other
    encodings, unreadable side files) are named on stderr, one line each, and the verdict
    is drawn from the rest.
    """
    from sat_tasks.classify import UnreadableInput, explain, load_record_with_notes

    try:
        record, notes = load_record_with_notes(
            args.file, log=getattr(args, "log", None), node_log=getattr(args, "node_log", None),
            events=getattr(args, "events", None), node=getattr(args, "node", None),
            node_events=getattr(args, "node_events", None))
    except UnreadableInput as error:
        print(f"sat classify: error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"sat classify: could not read everything: {note}", file=sys.stderr)
    why = explain(record)
    verdict = why.verdict
    if getattr(args, "json", False):
        data = verdict.model_dump(mode="json", include={"kind", "evidence", "reason"})
        if getattr(args, "explain", False):
            data["explain"] = {"who_ended": _who_json(why.who),
                               "findings": [_finding_json(f) for f in why.findings],
                               "steps": [{"step": step, "outcome": outcome} for step, outcome in why.steps]}
        print(json.dumps(data, indent=2))
        return 0
    print(f"{verdict.kind.value}: {verdict.reason}")
    print(f"  job {record.job}, attempt {record.attempt}, node {record.node or '-'}")
    print("evidence:")
    for line in verdict.evidence:
        print(f"  {line}")
    if getattr(args, "explain", False):
        print(render_explanation(why))
    return 0


def _who_json(who) -> dict | None:
    if who is None:
        return None
    return {"who": who.who.name.lower(), "by": who.by, "outside": who.outside, "reclaimed": who.reclaimed,
            "node_fault": who.node_fault, "evidence": list(who.evidence), "line": who.line()}


def _finding_json(finding) -> dict:
    return {"rule": finding.rule or "-", "kind": finding.kind.value, "line": finding.evidence,
            "reason": finding.reason, "ambiguous": finding.ambiguous, "peer_symptom": finding.peer_symptom,
            "beats_success": finding.beats_success, "node_loss": finding.node_loss}


def render_explanation(why) -> str:
    """The --explain text: who ended the process first, then the rules that matched, then the precedence steps
    (the deciding one marked)."""
    out = [""]
    if why.who is not None:
        out.append(f"who ended it: {why.who.line()}" + ("" if why.who.outside else " (not an interruption)"))
        out += [f"  {line}" for line in why.who.evidence]
    out.append("rules that matched (rule family, kind, line):")
    if not why.findings:
        out.append("  none: the verdict comes from how the process ended")
    for finding in why.findings:
        notes = [note for note, on in (("ambiguous: counts only when nothing decisive is left", finding.ambiguous),
                                       ("peer symptom: yields to the job's own error", finding.peer_symptom),
                                       ("cannot outrank a clean exit", not finding.beats_success),
                                       ("the node went away", finding.node_loss)) if on]
        out.append(f"  [{finding.rule or '-'}] {finding.kind.value}: {finding.evidence}")
        out.append(f"      why: {finding.reason}" + (f" ({'; '.join(notes)})" if notes else ""))
    out.append("precedence steps considered (ADR 0004), in order:")
    for index, (step, outcome) in enumerate(why.steps):
        marker = "=>" if index == len(why.steps) - 1 else "  "
        out.append(f"  {marker} {step}: {outcome}")
    return "\n".join(out)
