"""`sat render JOB.yaml`: the Kubernetes manifests an attempt of a job would submit (a YAML stream)."""

from __future__ import annotations

import argparse
import sys

from sat_tasks.cli.common import EXIT_INVALID, EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sat render JOB.yaml [--attempt N] [--exclude-node X ...] [--resume-step N] ...`."""
    parser = subparsers.add_parser(
        "render",
        help="print the Kubernetes manifests an attempt of a job would submit (YAML stream)",
        description="Print the manifests the DAG submits for one attempt: the run's volume claim "
        "(unless --pvc names an existing one), the rendezvous Service (multi-node) and the pods. "
        "Ready for `kubectl apply --dry-run=server -f -`.",
    )
    parser.add_argument("spec", metavar="JOB.yaml", help="the Training Job spec")
    parser.add_argument("--attempt", type=int, default=1, help="1-based attempt number (default 1)")
    parser.add_argument("--exclude-node", action="append", default=[], metavar="NODE",
                        help="a node an earlier attempt failed on (repeatable)")
    parser.add_argument("--resume-step", type=int, default=None, metavar="N",
                        help="resume from checkpoint step N (-1 = newest complete)")
    parser.add_argument("--run-id", default="manual__render", help="the DAG run id (default manual__render)")
    parser.add_argument("--dag-id", default=None, metavar="DAG",
                        help="the DAG that runs the job, which scopes its results prefix (default: the spec "
                             "file's own DAG, the job's name; a Create-made job's is sat_training_job)")
    parser.add_argument("--namespace", default=None, help="namespace (default: [sat] kubernetes_namespace)")
    parser.add_argument("--pvc", default=None, metavar="CLAIM", help="an existing claim instead of the run's own")
    parser.set_defaults(func=render_command)



def render_command(args: argparse.Namespace) -> int:
    """`sat render`: print the manifests; exit 2 with `<file>: <field>: <rule>` lines on a bad spec."""
    import yaml

    from sat_tasks.backends.kubernetes.pods import render_attempt_manifests, render_run_volume_claim
    from sat_tasks.backends.kubernetes.settings import KubernetesSettings
    from sat_tasks.config import sat_setting
    from sat_tasks.core.handoffs import Plan
    from sat_tasks.io.run_layout import scoped
    from sat_tasks.spec import SpecError, dag_id_for, load_spec

    try:
        job = load_spec(args.spec)
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    dag_id = args.dag_id or dag_id_for(job)
    if "/" in dag_id:
        print(f"{args.spec}: --dag-id: must be a DAG id (no '/')", file=sys.stderr)
        return EXIT_INVALID
    # As validate_spec records it: every manifest names the run's prefix `<destination>/<dag>/<job>/<run>/`.
    job = scoped(job, dag_id)
    if args.attempt < 1:
        print(f"{args.spec}: --attempt: must be >= 1", file=sys.stderr)
        return EXIT_INVALID
    if args.namespace is None:
        args.namespace = sat_setting("kubernetes_namespace")
    settings = KubernetesSettings.from_sat_config()
    manifests = []
    if args.pvc is None:
        manifests.append(render_run_volume_claim(job, run_id=args.run_id, namespace=args.namespace,
                                                 settings=settings))
    manifests += render_attempt_manifests(
        job, run_id=args.run_id,
        plan=Plan(attempt=args.attempt, exclude_nodes=list(args.exclude_node or ()), resume_step=args.resume_step),
        namespace=args.namespace, pvc_name=args.pvc, settings=settings,
    )
    sys.stdout.write(f"# sat render {args.spec}: job {job.name}, DAG {dag_id}, run {args.run_id}, "
                     f"attempt {args.attempt}\n")
    sys.stdout.write(yaml.dump_all(manifests, Dumper=_block_style_dumper(), sort_keys=False, explicit_start=True,
                                   width=120))
    return EXIT_OK



def _block_style_dumper() -> type:
    import yaml

    class BlockStyleDumper(yaml.SafeDumper):
        """SafeDumper that writes multi-line strings (the supervisor script) as `|` blocks."""

    def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value and not value.endswith((" ", "\t")) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockStyleDumper.add_representer(str, represent_str)
    return BlockStyleDumper

