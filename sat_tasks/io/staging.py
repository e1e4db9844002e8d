"""Move a job's files between Object Storage and directories: `python -m sat_tasks.io.staging stage|upload`.

`stage_job_files` is what the `stage_data` task does on every backend. Locally the Airflow
worker calls it with the `sat_object_storage` connection's hook; on Kubernetes the staging
pod (`sat_tasks.backends.kubernetes.staging`) runs this module, which has no Airflow metadata and so no
connection: it uses SAT's S3Hook with `aws_conn_id=None` (`object_storage_hook.new_hook`), i.e. boto3's own credential chain. The pod
gets the keys as `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (secretKeyRef into the Object
Storage Secret) and the endpoint as `AWS_ENDPOINT_URL_S3` (boto3 reads it natively), so the
same verified, parallel, idempotent `storage.stage_prefix` runs in both places.

With `--reuse-dir DIR --reuse-objects JSON` (the Kubernetes staging pod of a run that took
over a warm run's claim, ADR 0015) the objects whose ETag is the one in the JSON `{key:
ETag}` are copied from DIR (the warm run's staged data) and verified instead of downloaded;
the report's `data.reused` / `data.redownloaded` say how many of each.

`upload` is the reverse, for the training outputs (`upload_results` on Kubernetes runs it in
an upload pod, where the outputs are). The last line of a successful run is
`SAT_STAGE_REPORT <json>` (the report the task returns); errors go to stderr with exit
status 1 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sat_tasks.core.handoffs import Log
from sat_tasks.io import object_storage as storage
from sat_tasks.spec import split_s3_uri

if TYPE_CHECKING:  # pragma: no cover
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

REPORT_PREFIX = "SAT_STAGE_REPORT "


def stage_job_files(
    hook: S3Hook,
    *,
    data_source: str,
    data_dest: str | Path,
    code_dest: str | Path,
    script_url: str | None = None,
    log: Log = print,
    reuse_dir: str | Path | None = None,
    reuse_objects: dict[str, str] | None = None,
    current_objects: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Stage the script (one object, or every object under a prefix ending in `/`) and the data.

    Without a script URL the code directory is only created (the image carries the code).
    With `reuse_dir` (a warm run's staged data) and `reuse_objects` (its `{key: ETag}`), the
    objects whose ETag did not change are linked from there and only verified, not
    downloaded (`data.reused`, `data.redownloaded`); `current_objects` is the data's listing
    when the caller has it (else it is listed here). Returns `{"code": ..., "data":
    TransferReport dict}`.
    """
    report: dict[str, Any] = {}
    code_dest = Path(code_dest)
    if script_url:
        _, key = split_s3_uri(script_url)
        if key.endswith("/") or not key:
            report["code"] = storage.stage_prefix(hook, script_url, code_dest, log=log).to_dict()
        else:
            target = storage.download_object(hook, script_url, code_dest / Path(key).name)
            log(f"training script {script_url} -> {target}")
            report["code"] = {"files": 1, "destination": str(code_dest)}
    else:
        code_dest.mkdir(parents=True, exist_ok=True)
    linked: list[str] = []
    if reuse_dir is not None:
        from sat_tasks.io.warm_pool import link_unchanged, list_objects

        _, prefix = split_s3_uri(data_source)
        current = current_objects if current_objects is not None else list_objects(hook, data_source)
        linked = link_unchanged(reuse_dir, data_dest, reuse_objects or {}, current, prefix)
        log(f"warm pool: {len(linked)} of {len(current)} objects unchanged since the warm run: "
            f"linked or copied from {reuse_dir}, not downloaded")
    transfer = storage.stage_prefix(hook, data_source, data_dest, log=log)
    report["data"] = transfer.to_dict()
    if reuse_dir is not None:
        # the destination was empty but for the linked files: skipped = linked and verified
        report["data"].update(reused=transfer.skipped, redownloaded=transfer.transferred)
    return report


def _stage(args: argparse.Namespace, hook: S3Hook) -> dict[str, Any]:
    report = stage_job_files(hook, data_source=args.source, data_dest=args.dest, code_dest=args.code_dest,
                             script_url=args.script_url, log=_say, reuse_dir=args.reuse_dir,
                             reuse_objects=args.reuse_objects if args.reuse_dir else None)
    if args.validate:
        from sat_tasks.io.validation import DataValidationError, validate_dataset

        try:
            validation = validate_dataset(args.dest, args.suite, log=_say)
            report["validation"] = validation.to_dict() | {"summary_lines": validation.summary_lines()}
        except DataValidationError as exc:  # a bad suite is the job's error, reported like a failed suite
            report["validation"] = {"success": False, "summary_lines": [f"data validation could not run: {exc}"]}
    return report


def _etag_map(text: str) -> dict[str, str]:
    """`--reuse-objects`: a JSON object of object key -> ETag."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise argparse.ArgumentTypeError("must be a JSON object of object key -> ETag")
    return data


def _upload(args: argparse.Namespace, hook: S3Hook) -> dict[str, Any]:
    return storage.upload_dir(hook, args.source, args.dest, log=_say).to_dict()


def _say(line: str) -> None:
    print(line, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """`stage` (Object Storage -> directories) and `upload` (a directory -> Object Storage)."""
    parser = argparse.ArgumentParser(
        prog="python -m sat_tasks.io.staging",
        description="Move a Training Job's files between Object Storage and the run's volume.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage", help="stage the data (and script) from Object Storage into directories")
    stage.add_argument("--source", required=True, help="s3:// prefix of the data")
    stage.add_argument("--dest", required=True, help="directory the data goes to")
    stage.add_argument("--script-url", default=None,
                       help="s3:// URL of the training script (or a prefix ending in /)")
    stage.add_argument("--code-dest", required=True, help="directory the script goes to")
    stage.add_argument("--validate", action="store_true",
                       help="run the Great Expectations suite on the staged data (where the data is)")
    stage.add_argument("--suite", default=None, help="expectation suite (default: the text-corpus suite)")
    stage.add_argument("--reuse-dir", default=None,
                       help="a warm run's staged data: unchanged objects are copied from here, not downloaded")
    stage.add_argument("--reuse-objects", type=_etag_map, default={},
                       help="JSON {key: ETag} of the objects in --reuse-dir (as the warm run staged them)")
    stage.set_defaults(func=_stage)
    upload = sub.add_parser("upload", help="upload a directory (the training outputs) to Object Storage")
    upload.add_argument("--source", required=True, help="the directory to upload")
    upload.add_argument("--dest", required=True, help="s3:// prefix it goes to")
    upload.set_defaults(func=_upload)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, move the files with boto3's credential chain, print the report line."""
    args = build_parser().parse_args(argv)

    from sat_tasks.io.object_storage_hook import new_hook

    hook = new_hook(None)
    try:
        report = args.func(args, hook)
    except Exception as exc:  # noqa: BLE001 - one clear line for the task log; the pod fails with status 1
        print(f"{args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(REPORT_PREFIX + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
