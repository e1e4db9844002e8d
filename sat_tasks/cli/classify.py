"""`sat classify FILE`: why did an attempt fail? (an attempt record, or a pod as kubectl prints it)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `sat classify FILE [--log FILE] [--node-log FILE] [--json]`."""
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
    parser.add_argument("--json", action="store_true", help='print {"kind": ..., "evidence": [...], "reason": ...}')
    parser.set_defaults(func=run_classify_cli)
    return parser


def run_classify_cli(args: argparse.Namespace) -> int:
    """Run `sat classify`; 0 when classified, 2 when the input cannot be read at all.

    Malformed parts (null fields, missing container statuses, binary or huge logs, other
    encodings, unreadable side files) are named on stderr, one line each, and the verdict
    is drawn from the rest.
    """
    from sat_tasks.classify import UnreadableInput, classify, load_record_with_notes

    try:
        record, notes = load_record_with_notes(
            args.file, log=getattr(args, "log", None), node_log=getattr(args, "node_log", None),
            events=getattr(args, "events", None), node=getattr(args, "node", None))
    except UnreadableInput as error:
        print(f"sat classify: error: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"sat classify: could not read everything: {note}", file=sys.stderr)
    verdict = classify(record)
    if getattr(args, "json", False):
        print(json.dumps(verdict.model_dump(mode="json", include={"kind", "evidence", "reason"}), indent=2))
        return 0
    print(f"{verdict.kind.value}: {verdict.reason}")
    print(f"  job {record.job}, attempt {record.attempt}, node {record.node or '-'}")
    print("evidence:")
    for line in verdict.evidence:
        print(f"  {line}")
    return 0
