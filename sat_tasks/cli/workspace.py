"""`sat workspace ls|validate|show|create|edit|delete|render`: Training Workspaces (ADR 0015).

Definitions are YAML files in `[sat] workspaces_dir` (include/workspaces/). Edits and
deletes are refused, naming the jobs, while jobs use the workspace (the local backend's
slot board says which; the Workspaces page also sees the Airflow runs). create, edit and
delete also set the Airflow pool `sat-workspace-<name>` in the metadata DB of the Airflow
config in effect, as the page does; where that DB is not reachable they say so in one
line and the file is still written.
"""

from __future__ import annotations

import argparse
import sys

from sat_tasks.cli.common import EXIT_FAILED, EXIT_INVALID, EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sat workspace <verb>`."""
    parser = subparsers.add_parser("workspace", help="Training Workspaces: reserved nodes for a team",
                                   description="Create, list, edit (node count) and delete Training Workspaces; "
                                               "print the Kubernetes objects that reserve their nodes.")
    parser.add_argument("--dir", default=None, help="the workspaces folder (default: [sat] workspaces_dir)")
    verbs = parser.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("ls", help="list workspaces: nodes, allocation, contract, who runs and waits")
    p.set_defaults(func=cmd_ls)

    p = verbs.add_parser("validate", help="validate workspace YAML files",
                         description="Exit 0 when every file is valid, 2 otherwise; one `<file>: <field>: <rule>` "
                                     "line per problem.")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = verbs.add_parser("show", help="print one workspace's YAML")
    p.add_argument("name")
    p.set_defaults(func=cmd_show)

    p = verbs.add_parser("create", help="create a workspace from a YAML file or from options",
                         description="Exit 2 with `<field>: <rule>` lines when a field breaks a rule.")
    p.add_argument("-f", "--file", help="a workspace YAML file (options below override its fields)")
    p.add_argument("--name")
    p.add_argument("--nodes", type=int)
    p.add_argument("--server-type")
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--memory", help="memory per node, e.g. 1600Gi")
    p.add_argument("--cpu", help="CPU cores per node")
    p.add_argument("--start", help="contract start, YYYY-MM-DD")
    p.add_argument("--end", help="contract end, YYYY-MM-DD")
    p.add_argument("--description")
    p.set_defaults(func=cmd_create)

    p = verbs.add_parser("edit", help="change a workspace's node count (for the next job that starts)")
    p.add_argument("name")
    p.add_argument("--nodes", type=int, required=True)
    p.set_defaults(func=cmd_edit)

    p = verbs.add_parser("delete", help="delete a workspace (refused while jobs run or wait in it)")
    p.add_argument("name")
    p.set_defaults(func=cmd_delete)

    p = verbs.add_parser("render", help="print the Kubernetes objects an operator applies for a workspace",
                         description="Node patches (label + taint) for --node NAMEs; with Kueue ([sat] k8s_kueue "
                                     "or --kueue) a ResourceFlavor, ClusterQueue and LocalQueue; with --warm-pool "
                                     "the warm pool's cluster-wide PriorityClass (NAME optional then). A YAML stream.")
    p.add_argument("name", nargs="?")
    p.add_argument("--warm-pool", action="store_true",
                   help="also print the PriorityClass the warm pool's placeholder pods use (apply it once where "
                        "SAT may not create it)")
    p.add_argument("--node", action="append", default=[], metavar="NODE", help="a cluster node to reserve")
    p.add_argument("--namespace", default=None, help="the jobs' namespace (default: [sat] kubernetes_namespace)")
    kueue = p.add_mutually_exclusive_group()
    kueue.add_argument("--kueue", dest="kueue", action="store_true", default=None)
    kueue.add_argument("--no-kueue", dest="kueue", action="store_false")
    p.set_defaults(func=cmd_render)


def _store(args: argparse.Namespace):
    from sat_tasks.io.workspaces import WorkspaceStore

    return WorkspaceStore(args.dir)


def _uses(name: str):
    from sat_tasks.io.workspaces import SlotBoard

    return SlotBoard(name).uses()


def _sync_pool(name: str, nodes: int | None) -> None:
    """Keep the Airflow pool sat-workspace-<name> in step, as the Workspaces page does; one line either way.

    The file is written first: without a reachable metadata DB the command still succeeds and says so.
    """
    from sat_tasks.airflow.workspace_pools import MetadataDBUnreachable, sync_workspace_pool
    from sat_tasks.backends.base import workspace_pool_name as pool_name

    try:
        print(sync_workspace_pool(name, nodes))
    except MetadataDBUnreachable as exc:
        print(f"Airflow pool {pool_name(name)} not {'deleted' if nodes is None else 'set'}: {exc}", file=sys.stderr)


def _fail(message: str, status: int = EXIT_FAILED) -> int:
    print(message, file=sys.stderr)
    return status


def cmd_ls(args: argparse.Namespace) -> int:
    store = _store(args)
    workspaces = store.list()
    print(f"{'NAME':24} {'NODES':>5} {'SERVER':6} {'GPUS':>4} {'MEMORY':>8} {'CONTRACT':25} RUNNING / QUEUED")
    for ws in workspaces:
        uses = _uses(ws.name)
        running = sum(u.slots for u in uses if u.state == "running")
        queued = [u.job for u in uses if u.state == "queued"]
        print(f"{ws.name:24} {ws.nodes:>5} {ws.resources.server_type:6} {ws.resources.gpus_per_node:>4} "
              f"{ws.resources.memory:>8} {ws.contract.describe():25} {running} node(s) used"
              + (f"; queued: {', '.join(queued)}" if queued else ""))
    for problem in store.problems().values():
        print(problem, file=sys.stderr)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sat_tasks.spec import SpecError
    from sat_tasks.spec.workspace import load_workspace

    status = EXIT_OK
    for path in args.files:
        try:
            ws = load_workspace(path)
        except SpecError as exc:
            for problem in exc.problems:
                print(f"{path}: {problem.field}: {problem.rule}")
            status = EXIT_INVALID
            continue
        if ws.name != Path(path).stem:
            print(f"{path}: name: must match the file name ({Path(path).stem!r})")
            status = EXIT_INVALID
        else:
            print(f"{path}: ok ({ws.name}, {ws.nodes} node(s), contract {ws.contract.describe()})")
    return status


def cmd_show(args: argparse.Namespace) -> int:
    import yaml

    from sat_tasks.io.workspaces import WorkspaceNotFound

    try:
        ws = _store(args).get(args.name)
    except WorkspaceNotFound as exc:
        return _fail(str(exc))
    sys.stdout.write(yaml.safe_dump(ws.to_dict(), sort_keys=False))
    return EXIT_OK


def cmd_create(args: argparse.Namespace) -> int:
    import yaml

    from sat_tasks.spec import SpecError

    data: dict = {}
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as handle:
                data = yaml.safe_load(handle) or {}
        except (OSError, yaml.YAMLError) as exc:
            return _fail(f"{args.file}: <file>: cannot be read as YAML: {exc}", EXIT_INVALID)
        if not isinstance(data, dict):
            return _fail(f"{args.file}: <workspace>: must be a mapping of fields", EXIT_INVALID)
    for key in ("name", "nodes", "description"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    for key in ("server_type", "gpus_per_node", "memory", "cpu"):
        if getattr(args, key) is not None:
            data.setdefault("resources", {})[key] = getattr(args, key)
    for key in ("start", "end"):
        if getattr(args, key) is not None:
            data.setdefault("contract", {})[key] = getattr(args, key)
    try:
        ws = _store(args).create(data)
    except SpecError as exc:
        return _fail(str(exc), EXIT_INVALID)
    print(f"workspace {ws.name} created: {ws.nodes} node(s), contract {ws.contract.describe()}")
    _sync_pool(ws.name, ws.nodes)
    return EXIT_OK


def cmd_edit(args: argparse.Namespace) -> int:
    from sat_tasks.io.workspaces import WorkspaceNotFound, WorkspaceRefused
    from sat_tasks.spec import SpecError

    try:
        ws = _store(args).set_nodes(args.name, args.nodes, _uses(args.name))
    except SpecError as exc:
        return _fail(str(exc), EXIT_INVALID)
    except (WorkspaceNotFound, WorkspaceRefused) as exc:
        return _fail(str(exc))
    print(f"workspace {ws.name}: {ws.nodes} node(s) from the next job that starts")
    _sync_pool(ws.name, ws.nodes)
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    from sat_tasks.io.workspaces import WorkspaceNotFound, WorkspaceRefused

    try:
        ws = _store(args).delete(args.name, _uses(args.name))
    except (WorkspaceNotFound, WorkspaceRefused) as exc:
        return _fail(str(exc))
    print(f"workspace {ws.name} deleted")
    _sync_pool(ws.name, None)
    return EXIT_OK


def cmd_render(args: argparse.Namespace) -> int:
    import yaml

    from sat_tasks.backends.kubernetes.settings import KubernetesSettings
    from sat_tasks.backends.kubernetes.warm import PRIORITY_CLASS, render_priority_class
    from sat_tasks.backends.kubernetes.workspace import (
        operator_notes,
        render_workspace_manifests,
    )
    from sat_tasks.config import sat_setting
    from sat_tasks.io.workspaces import WorkspaceNotFound

    if args.name is None and not args.warm_pool:
        return _fail("a workspace NAME, or --warm-pool, is needed", EXIT_INVALID)
    if args.warm_pool:
        sys.stdout.write(f"# the warm pool's placeholder pods use PriorityClass {PRIORITY_CLASS} (cluster-wide, "
                         "applied once)\n")
        sys.stdout.write(yaml.safe_dump(render_priority_class(), sort_keys=False, explicit_start=True))
        if args.name is None:
            return EXIT_OK
    try:
        ws = _store(args).get(args.name)
    except WorkspaceNotFound as exc:
        return _fail(str(exc))
    settings = KubernetesSettings.from_sat_config()
    kueue = settings.kueue if args.kueue is None else args.kueue
    namespace = args.namespace or sat_setting("kubernetes_namespace")
    manifests = render_workspace_manifests(ws, namespace=namespace, nodes=args.node, settings=settings, kueue=kueue)
    for line in operator_notes(ws, namespace=namespace, settings=settings, kueue=kueue):
        sys.stdout.write(f"# {line}\n")
    if manifests:
        sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False, explicit_start=True))
    return EXIT_OK
