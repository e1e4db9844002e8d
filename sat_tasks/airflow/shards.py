"""Which job DAG file holds a spec's DAG: a stable shard of the spec file's name (ADR 0023).

The DAG processor parses each DAG file in its own process under a time limit, so the job DAGs
are spread over `JOB_DAG_FILES` files (`dags/sat_jobs_00.py` ...). A spec's shard is a jump
consistent hash of its file name: it depends on nothing else (not on the other specs, not on
their order), and growing the number of files moves only the specs the new files take.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

JOB_DAG_FILES = 16  # dags/sat_jobs_00.py .. dags/sat_jobs_15.py
JOB_DAG_FILE = "sat_jobs_{shard:02d}.py"
WATCH_DAG_FILE = "sat_data_changes.py"  # also reads the specs (those scheduled on an Asset)

# A top-level `name:` line whose value is a plain or quoted job name (`name: my-job  # comment`).
_NAME_LINE = re.compile(r"^name[ \t]*:(.*)$", re.MULTILINE)
_NAME_VALUE = re.compile(r"""[ \t]*(?:"([a-z0-9][a-z0-9.-]*)"|'([a-z0-9][a-z0-9.-]*)'|([a-z0-9][a-z0-9.-]*))"""
                         r"""[ \t]*(?:#.*)?$""")


def shard_of(spec_file_name: str, shards: int = JOB_DAG_FILES) -> int:
    """The shard (0 .. shards-1) of a spec file, from its name alone (jump consistent hash, Lamping & Veach).

    From n to n+1 shards a spec stays where it was unless it moves to the new shard (about 1 in n+1 do).
    """
    if shards < 1:
        raise ValueError(f"shards: must be at least 1 (got {shards})")
    key = int.from_bytes(hashlib.sha256(spec_file_name.encode("utf-8")).digest()[:8], "big")
    bucket, jump = -1, 0
    while jump < shards:
        bucket = jump
        key = (key * 2862933555777941757 + 1) % (1 << 64)
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def name_hint(text: str) -> str | None:
    """The job name a spec's text most likely has (its one top-level `name:` line), without parsing it.

    None when the text does not say plainly (no such line, several, a value that is not a job
    name): then the file must be read in full. Only a hint: a caller confirms a match by
    validating the file.
    """
    lines = _NAME_LINE.findall(text)
    if len(lines) != 1:
        return None
    value = _NAME_VALUE.match(lines[0])
    if value is None:
        return None
    return next(group for group in value.groups() if group is not None)


def spec_paths(jobs_dir: str | Path) -> list[Path]:
    """The spec files of a jobs directory, in the order that decides which of two same-named specs wins."""
    return sorted(Path(jobs_dir).glob("*.y*ml"))


def job_dag_files() -> set[str]:
    """The file names of the job DAG files (`sat_jobs_00.py` ...)."""
    return {JOB_DAG_FILE.format(shard=k) for k in range(JOB_DAG_FILES)}
