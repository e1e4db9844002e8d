"""`sat nodes ls|release`: the node health ledger (which nodes are quarantined, and why) and lifting a quarantine."""

from __future__ import annotations

import argparse
import getpass
import json

from sat_tasks.cli.common import EXIT_FAILED, EXIT_OK, needs_object_storage


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sat nodes ls [--json]` and `sat nodes release NODE [--note TEXT]`."""
    parser = subparsers.add_parser(
        "nodes", help="the node health ledger: quarantined nodes with their evidence, and releasing them",
        description="Every job's HARDWARE and SUSPECT_NODE verdicts against their node (ADR 0004), under "
                    "[sat] node_ledger_uri, else under the results destinations of the job specs in "
                    "[sat] jobs_dir (<destination>/_node-health/). A node with faults of two different jobs "
                    "within [sat] node_quarantine_window_seconds is quarantined: no job is placed on it "
                    "until a person releases it.")
    sub = parser.add_subparsers(dest="nodes_command", required=True)
    listing = sub.add_parser("ls", help="every node with faults in the window: quarantined first, with evidence")
    listing.add_argument("--json", action="store_true", help="print the nodes as JSON")
    listing.add_argument("--root", action="append", help="an s3:// ledger root to read (repeatable)")
    listing.set_defaults(func=cmd_ls)
    release = sub.add_parser("release", help="lift a node's quarantine: its faults so far no longer count")
    release.add_argument("node", metavar="NODE")
    release.add_argument("--note", default="", help="why (kept with the release)")
    release.add_argument("--root", action="append", help="an s3:// ledger root to write to (repeatable)")
    release.set_defaults(func=cmd_release)


def _ledger(args: argparse.Namespace):
    from sat_tasks.config import sat_setting
    from sat_tasks.io.node_ledger import NodeLedger
    from sat_tasks.io.object_storage import object_storage_hook

    return NodeLedger.for_deployment(object_storage_hook(sat_setting("object_storage_conn_id")), args.root)


@needs_object_storage("sat nodes ls")
def cmd_ls(args: argparse.Namespace) -> int:
    from sat_tasks.io.node_ledger import describe, to_json, window_seconds

    fleet = _ledger(args).health()
    if args.json:
        print(json.dumps({"window_seconds": window_seconds(), "nodes": [to_json(h) for h in fleet]}, indent=2))
        return EXIT_OK
    for health in fleet:
        for line in describe(health):
            print(line)
    quarantined = sum(h.quarantined for h in fleet)
    print(f"{quarantined} quarantined node(s), {len(fleet) - quarantined} other node(s) with faults "
          f"in the last {window_seconds():.0f}s")
    return EXIT_OK


@needs_object_storage("sat nodes release")
def cmd_release(args: argparse.Namespace) -> int:
    """Write a release marker (every job sees it at its next placement); 1 when the node was not quarantined."""
    from sat_tasks.pipeline.actions import release_node

    ledger = _ledger(args)
    was = args.node in ledger.quarantined()
    marker = release_node(ledger, args.node, by=getpass.getuser(), note=args.note, log=print)
    if not was:
        print(f"sat nodes release: {args.node} was not quarantined (a release was recorded anyway)")
        return EXIT_FAILED
    print(f"released {args.node} (by {marker.by}): jobs may be placed there again")
    return EXIT_OK
