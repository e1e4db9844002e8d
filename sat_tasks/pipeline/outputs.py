"""What `upload_results` checks before a run may end Completed: the training's outputs reached Object Storage (issue 48.1).

Three checks, after the backend's upload:

- every file the training wrote to this worker's output directory (`JobRun.output_dir`: the
  local backend's) is under `<results>/output/` with the same size;
- the backend's transfer report read no more files than Object Storage now holds there (the
  Kubernetes backend's upload pod reads the claim, which this worker does not see);
- a job that declares outputs (its command names `$SAT_OUTPUT_DIR`, where the runtime contract
  says outputs go) has at least one there: a training that wrote none did not produce its model.

Each problem names the files; at most `SHOWN` are listed, then how many more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_engine.contract import OUTPUT_DIR_ENV
from sat_tasks.io.run_layout import JobRun
from sat_tasks.spec import TrainingJob, split_s3_uri

SHOWN = 10


def declares_outputs(job: TrainingJob) -> bool:
    """The job says it writes outputs: its command names the output directory's variable."""
    return OUTPUT_DIR_ENV in job.command


def written_files(root: Path) -> dict[str, int] | None:
    """`relative path -> size` of every file below `root` (as `upload_dir` reads it); None when it is no directory."""
    if not root.is_dir():
        return None
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def stored_objects(hook: Any, uri: str) -> dict[str, int]:
    """`key below uri -> size` of every object under `uri`."""
    bucket, prefix = split_s3_uri(uri)
    return {meta["Key"][len(prefix):]: int(meta["Size"])
            for meta in hook.iter_file_metadata(prefix=prefix, bucket_name=bucket) if meta["Key"] != prefix}


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def output_problems(job: TrainingJob, written: dict[str, int] | None, stored: dict[str, int],
                    report: dict[str, Any]) -> list[str]:
    """What is missing from Object Storage, compared with what the training wrote (see the module's doc)."""
    problems = []
    if written:
        missing = [f"{name} ({size} B)" for name, size in sorted(written.items()) if name not in stored]
        if missing:
            problems.append(f"{len(missing)} of {len(written)} output file(s) not uploaded: {_names(missing)}")
        changed = [f"{name} ({size} B written, {stored[name]} B uploaded)" for name, size in sorted(written.items())
                   if name in stored and stored[name] != size]
        if changed:
            problems.append(f"{len(changed)} output file(s) uploaded with another size: {_names(changed)}")
    read = report.get("files")
    if isinstance(read, int) and read > len(stored):
        problems.append(f"the upload read {read} file(s) from {report.get('source')}, "
                        f"but Object Storage holds {len(stored)}")
    if not stored and not problems and declares_outputs(job):
        problems.append(f"the training wrote no output: its command names ${OUTPUT_DIR_ENV}, and the upload "
                        f"found no file in {report.get('source')}")
    return problems


def check_outputs(run: JobRun, report: dict[str, Any]) -> list[str]:
    """`output_problems` for `run`, after its backend's upload returned `report`."""
    return output_problems(run.job, written_files(run.output_dir), stored_objects(run.hook(), run.output_uri), report)
