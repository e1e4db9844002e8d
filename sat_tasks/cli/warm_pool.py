"""`sat warm-pool list|release`: what the warm pool holds, and letting it go (a person's stop, the expiry sweep)."""

from __future__ import annotations

import argparse
import time

from sat_tasks.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    needs_object_storage,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sat warm-pool list` and `sat warm-pool release (JOB... | --expired | --all)`."""
    parser = subparsers.add_parser(
        "warm-pool", help="list or release what finished runs keep warm for their job's next run",
        description="The warm pool (ADR 0015) under [sat] warm_pool_uri, else under the results destinations "
                    "of the job specs in [sat] jobs_dir (<destination>/_warm-pool/).")
    sub = parser.add_subparsers(dest="warm_command", required=True)
    listing = sub.add_parser("list", help="the warm states: job, run, backend, nodes, time left")
    listing.add_argument("--root", action="append", help="an s3:// warm-pool root to look under (repeatable)")
    listing.set_defaults(func=cmd_list)
    release = sub.add_parser("release", help="release warm states now: their staged data, nodes, placeholder pods")
    release.add_argument("jobs", nargs="*", metavar="JOB", help="job names whose warm state to release")
    release.add_argument("--expired", action="store_true", help="release every state whose keep-alive ran out")
    release.add_argument("--all", action="store_true", help="release every state")
    release.add_argument("--root", action="append", help="an s3:// warm-pool root to look under (repeatable)")
    release.set_defaults(func=cmd_release)


def _hook():
    from sat_tasks.config import sat_setting
    from sat_tasks.io.object_storage import object_storage_hook

    return object_storage_hook(sat_setting("object_storage_conn_id"))


def _states(args: argparse.Namespace, hook) -> list:
    from sat_tasks.io.warm_pool import WarmPoolStore, warm_roots

    store = WarmPoolStore(hook)
    return [item for root in (args.root or warm_roots()) for item in store.states(root)]


@needs_object_storage("sat warm-pool list")
def cmd_list(args: argparse.Namespace) -> int:
    hook, now = _hook(), time.time()
    states = _states(args, hook)
    for _, s in states:
        left = s.expires_at - now
        print(f"{s.job:<32} {s.workspace or '-':<16} {s.backend:<10} run {s.run_id}  "
              f"node(s) {', '.join(s.nodes) or '-'}  {len(s.objects)} staged object(s)  "
              + (f"{left:.0f}s left" if left > 0 else f"expired {-left:.0f}s ago"))
    print(f"{len(states)} warm state(s)")
    return EXIT_OK


def cmd_release(args: argparse.Namespace) -> int:
    """Release the named jobs' states (or the expired ones, or all); 1 when a named job has none."""
    if not (args.jobs or args.expired or args.all):
        print("sat warm-pool release: name a JOB, or pass --expired or --all")
        return EXIT_INVALID
    return _release(args)


@needs_object_storage("sat warm-pool release")
def _release(args: argparse.Namespace) -> int:
    from sat_tasks.io.warm_pool import WarmPoolStore
    from sat_tasks.pipeline.warm_pool import release_state

    hook, now = _hook(), time.time()
    store, found = WarmPoolStore(hook), set()
    for uri, state in _states(args, hook):
        if not (args.all or state.job in args.jobs or (args.expired and state.expired(now))):
            continue
        store.delete_uri(uri)
        found.add(state.job)
        released = release_state(state, print)
        print(f"released the warm state of {state.job} (run {state.run_id}): "
              + (", ".join(released) if released else "nothing else was held"))
    missing = [job for job in args.jobs if job not in found]
    for job in missing:
        print(f"sat warm-pool release: {job}: nothing kept warm")
    return EXIT_FAILED if missing else EXIT_OK
