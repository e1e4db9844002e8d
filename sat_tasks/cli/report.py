"""`sat report RUN`: the job report page (`report.html`) with plots of a run's metrics."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ckpt_engine.contract import REPORT_HTML_NAME
from sat_tasks.cli.common import needs_object_storage


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `sat report RUN [-o FILE]`."""
    parser = subparsers.add_parser(
        "report",
        help=f"render {REPORT_HTML_NAME} with plots of a run's metrics",
        description="Render a job run's report page (loss across attempts with failover and resume markers, "
                    "throughput, checkpoint stalls, CPU/GPU, goodput and recovery per fault). RUN is a local "
                    "run directory (holding metrics/) or an s3:// results URI (<results>/<job>/<run_id>/).",
    )
    parser.add_argument("run", metavar="RUN", help="local run directory or s3:// results URI")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"where to write the page (default: RUN/{REPORT_HTML_NAME}, or ./{REPORT_HTML_NAME} for s3://)")
    parser.set_defaults(func=run_report_cli)
    return parser


def run_report_cli(args: argparse.Namespace) -> int:
    """Write the page; 0 when every metrics line was read, 1 when some were not (named on stderr), 2 no RUN.

    An s3:// RUN is read with the running deployment's Object Storage connection (`needs_object_storage`).
    """
    return _remote_report(args) if args.run.startswith("s3://") else _report(args)


@needs_object_storage("sat report")
def _remote_report(args: argparse.Namespace) -> int:
    return _report(args)


def _report(args: argparse.Namespace) -> int:
    from sat_tasks.io.metrics import read_metrics
    from sat_tasks.pipeline.report_html import render_report_html

    source = args.run
    remote = source.startswith("s3://")
    if not remote and not Path(source).is_dir():
        print(f"sat report: error: {source}: no such directory", file=sys.stderr)
        return 2
    metrics = read_metrics(source)
    output = Path(args.output) if args.output else (Path(REPORT_HTML_NAME) if remote else Path(source) / REPORT_HTML_NAME)
    title = "SAT job report: " + source.rstrip("/").split("/")[-2] + " / " + source.rstrip("/").split("/")[-1] \
        if source.count("/") >= 2 else "SAT job report"
    output.write_text(render_report_html(metrics, title=title), encoding="utf-8")
    for problem in metrics.problems:
        print(f"sat report: error: {problem}", file=sys.stderr)
    print(f"wrote {output} ({len(metrics.files)} series file(s), {len(metrics.problems)} problem(s))")
    return 1 if metrics.problems else 0
