"""Copy a job's training script and data from Object Storage into directories: `python -m sat_tasks.stage_cli`.

`stage_job_files` is what `pipeline.stage_data` does on every backend. Locally the Airflow
worker calls it with the `sat_object_storage` connection's hook; on Kubernetes the staging
pod (`sat_tasks.k8s_staging`) runs this module, which has no Airflow metadata and so no
connection: it uses `S3Hook(aws_conn_id=None)`, i.e. boto3's own credential chain. The pod
gets the keys as `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (secretKeyRef into the Object
Storage Secret) and the endpoint as `AWS_ENDPOINT_URL_S3` (boto3 reads it natively), so the
same verified, parallel, idempotent `storage.stage_prefix` runs in both places.

The last line of a successful run is `SAT_STAGE_REPORT <json>` (the report `stage_data`
returns); errors go to stderr with exit status 1 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from sat_tasks import storage
from sat_tasks.spec import split_s3_uri

if TYPE_CHECKING:  # pragma: no cover
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

REPORT_PREFIX = "SAT_STAGE_REPORT "
Log = Callable[[str], None]


def stage_job_files(
    hook: S3Hook,
    *,
    data_source: str,
    data_dest: str | Path,
    code_dest: str | Path,
    script_url: str | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Stage the script (one object, or every object under a prefix ending in `/`) and the data.

    Without a script URL the code directory is only created (the image carries the code).
    Returns `{"code": ..., "data": TransferReport dict}`.
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
    report["data"] = storage.stage_prefix(hook, data_source, data_dest, log=log).to_dict()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, stage with boto3's credential chain, print the report line."""
    parser = argparse.ArgumentParser(
        prog="python -m sat_tasks.stage_cli",
        description="Stage a Training Job's data (and script) from Object Storage into local directories.",
    )
    parser.add_argument("--source", required=True, help="s3:// prefix of the data")
    parser.add_argument("--dest", required=True, help="directory the data goes to")
    parser.add_argument("--script-url", default=None, help="s3:// URL of the training script (or a prefix ending in /)")
    parser.add_argument("--code-dest", required=True, help="directory the script goes to")
    parser.add_argument("--validate", action="store_true",
                        help="run the Great Expectations suite on the staged data (where the data is)")
    parser.add_argument("--suite", default=None, help="expectation suite (default: the text-corpus suite)")
    args = parser.parse_args(argv)

    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=None, transfer_config_args={"max_concurrency": 4})
    try:
        report = stage_job_files(hook, data_source=args.source, data_dest=args.dest, code_dest=args.code_dest,
                                 script_url=args.script_url, log=lambda line: print(line, flush=True))
    except Exception as exc:  # one clear line for the task log; the pod fails with status 1
        print(f"staging failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    if args.validate:
        from sat_tasks.validation import DataValidationError, validate_dataset

        try:
            validation = validate_dataset(args.dest, args.suite, log=lambda line: print(line, flush=True))
            report["validation"] = validation.to_dict() | {"summary_lines": validation.summary_lines()}
        except DataValidationError as exc:  # a bad suite is the job's error, reported like a failed suite
            report["validation"] = {"success": False, "summary_lines": [f"data validation could not run: {exc}"]}
    print(REPORT_PREFIX + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
