"""Object Storage credentials for one training attempt: STS `AssumeRole` with the run's session policy (ADR 0020).

SAT's own tasks (staging, upload, status, verdicts, the ledger) keep the service's keys (the
`sat_object_storage` connection). A training process gets instead a temporary triple (key id,
secret, session token) that STS issued for `run_policy`: read-only on `data.source` and
`storage.script_url`, read-write on the three folders of the run's results prefix the
training writes (`TRAINING_WRITES`: the engine's mirror `checkpoints/`, its metrics
`metrics/`, its outputs `output/`), read of the run's `status.json`, nothing else. SAT's own
records beside them (`attempts/`, `status.json`, `stop.json`, `warm.json`, `tags.json`, the
job log and the report) are written with the service's keys only (issue 44.5, ADR 0039).

Revocation (ADR 0039): `revoke_run_credentials` marks a run whose credentials must stop
working (a deleted run) under `REVOKED_PREFIX` of its results bucket, and `revoked_because`
says whether a session's run is marked or has ended (its status history's last status is
terminal for longer than `ended_grace_seconds`). The embedded Object Storage's gate asks it
on every request of a temporary key (`io.s3_gate`); a store outside SAT cannot revoke an
STS session, so there the lifetime (`scoped_credentials_seconds`) is the bound.

Settings (`[sat]`):

- `scoped_credentials` (`on`): `off` gives trainings the service's keys, with a warning in
  the job log (an Object Storage without STS; every job can then touch every other's objects);
- `scoped_credentials_role_arn`: the role SAT's keys assume (MinIO ignores it; on AWS or
  Ceph RGW a role whose own policy covers the data and results buckets);
- `scoped_credentials_seconds` (`43200`): how long the credentials live (STS's minimum is
  900; the role's maximum session duration must allow it). An attempt that runs longer loses
  its mirror: raise it for such jobs.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckpt_engine import contract
from sat_tasks.config import sat_setting
from sat_tasks.core.handoffs import Log
from sat_tasks.core.object_policy import (
    PolicyInputError,
    policy_json,
    run_records_of,
    run_session_policy,
)
from sat_tasks.core.status import TERMINAL
from sat_tasks.errors import SatError

if TYPE_CHECKING:  # pragma: no cover
    from sat_tasks.io.run_layout import RunLayout

SETTING = "scoped_credentials"
STS_MIN_SECONDS = 900
DEFAULT_REGION = "us-east-1"
_SESSION_NAME_UNSAFE = re.compile(r"[^\w+=,.@-]")
# The folders of a run's results prefix the training writes (ckpt_engine.contract): its mirror, metrics, outputs.
TRAINING_WRITES = (contract.MIRROR_DIR, contract.METRICS_DIR, contract.OUTPUT_DIR)
# Where revocation markers live in a results bucket: `<REVOKED_PREFIX><results key prefix>revoked.json`
# ('_' starts no job name nor DAG id; the data roots refuse it as a data source, io.data_roots).
REVOKED_PREFIX = "_revoked-credentials/"
REVOKED_NAME = "revoked.json"
ENDED_GRACE_MARGIN_SECONDS = 120  # beyond the final checkpoint's grace: a stopped pod's last mirror write


class ScopedCredentialsError(SatError):
    """SAT could not get scoped Object Storage credentials for an attempt; the message names the setting."""


@dataclass(frozen=True)
class TemporaryCredentials:
    """What STS issued for one attempt (never in a repr: the secret and the token are the credentials)."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expiration: Any = None

    def env(self, region: str | None) -> dict[str, str]:
        """The standard AWS variables boto3 (the engine's mirror, the metrics recorder) reads."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_SESSION_TOKEN": self.session_token, "AWS_DEFAULT_REGION": region or DEFAULT_REGION}


def scoped_credentials_on() -> bool:
    """`[sat] scoped_credentials`: `on` (the default) or `off`; anything else is refused naming the setting."""
    value = sat_setting(SETTING).strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise ScopedCredentialsError(f"[sat] {SETTING} = {value!r}: must be 'on' or 'off'")


def run_policy(layout: RunLayout) -> dict[str, Any]:
    """The session policy of the run's attempts: its data and script read-only, `TRAINING_WRITES` read-write.

    Nothing else of the results prefix is writable (SAT's records: attempts, status, stop
    request, warm state, report), and only its `status.json` readable (`RunState`).
    """
    job = layout.job
    read_only = {"data.source": job.data.source}
    if job.storage.script_url:
        read_only["storage.script_url"] = job.storage.script_url
    read_write = {f"results.{folder.rstrip('/')}": layout.results_uri + folder for folder in TRAINING_WRITES}
    try:
        return run_session_policy(read_only=read_only, read_write=read_write, run_records=layout.results_uri)
    except PolicyInputError as exc:
        raise ScopedCredentialsError(f"job {job.name}: {exc}") from None


def session_name(layout: RunLayout, attempt: int) -> str:
    """`RoleSessionName` (2-64 of `[\\w+=,.@-]`): it names the job and attempt in the store's audit log."""
    return _SESSION_NAME_UNSAFE.sub("-", f"sat-{layout.job.name}")[:54] + f"-a{attempt}"


def session_seconds() -> int:
    """`[sat] scoped_credentials_seconds`, at least STS's minimum."""
    raw = sat_setting("scoped_credentials_seconds")
    try:
        return max(STS_MIN_SECONDS, int(raw))
    except ValueError:
        raise ScopedCredentialsError(f"[sat] scoped_credentials_seconds = {raw!r}: must be a whole number of "
                                     "seconds") from None


def assume_run_role(sts: Any, layout: RunLayout, attempt: int) -> TemporaryCredentials:
    """Ask STS (`sts`: a boto3 STS client with the service's keys) for the attempt's scoped credentials."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = sts.assume_role(RoleArn=sat_setting("scoped_credentials_role_arn"),
                                 RoleSessionName=session_name(layout, attempt),
                                 Policy=policy_json(run_policy(layout)), DurationSeconds=session_seconds())
        issued = answer["Credentials"]
        return TemporaryCredentials(issued["AccessKeyId"], issued["SecretAccessKey"], issued["SessionToken"],
                                    issued.get("Expiration"))
    except (BotoCoreError, ClientError, KeyError, TypeError) as exc:
        reason = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else type(exc).__name__
        raise ScopedCredentialsError(
            f"the Object Storage did not issue scoped credentials for job {layout.job.name} (STS AssumeRole: "
            f"{reason}). Configure STS on the store and [sat] scoped_credentials_role_arn, or set "
            f"[sat] {SETTING} = off to give trainings the service's own keys (every job can then read and "
            "write every other's objects)") from None


def training_credentials(layout: RunLayout, hook: Any, attempt: int, log: Log) -> dict[str, str]:
    """The `AWS_*` variables of an attempt's training process (never logged, recorded or rendered).

    `hook` is SAT's S3Hook (the service's keys): it calls STS at the connection's endpoint.
    With `[sat] scoped_credentials = off`, the connection's own keys, and a warning in `log`.
    """
    conn = hook.conn_config
    if not scoped_credentials_on():
        log(f"[sat] WARNING: [sat] {SETTING} = off: attempt {attempt} gets the service's Object Storage keys "
            "and can read and write every job's data and results")
        return service_keys(conn)
    region = conn.region_name or DEFAULT_REGION
    sts = hook.get_session(region_name=region).client(
        "sts", endpoint_url=conn.get_service_endpoint_url("sts"), region_name=region)
    credentials = assume_run_role(sts, layout, attempt)
    writable = ", ".join(TRAINING_WRITES)
    log(f"[sat] attempt {attempt}: Object Storage credentials scoped to {writable} of {layout.results_uri} "
        f"(read-write) and {layout.job.data.source} (read-only), valid {session_seconds()} s")
    return credentials.env(region)


def service_keys(conn: Any) -> dict[str, str]:
    """The connection's keys as the standard AWS variables (none when it relies on a role or profile)."""
    keys = {
        "AWS_ACCESS_KEY_ID": conn.aws_access_key_id,
        "AWS_SECRET_ACCESS_KEY": conn.aws_secret_access_key,
        "AWS_SESSION_TOKEN": conn.aws_session_token,
        "AWS_DEFAULT_REGION": conn.region_name,
    }
    return {name: value for name, value in keys.items() if value}


# ---- revocation (ADR 0039) -----------------------------------------------------------------------
def revocation_key(results_key: str) -> str:
    """The marker's key in the results bucket for the run whose results key prefix is `results_key`."""
    return REVOKED_PREFIX + results_key + REVOKED_NAME


def revoke_run_credentials(hook: Any, layout: RunLayout, *, why: str, by: str = "SAT") -> str:
    """Mark the run's credentials revoked (a deleted run: its status history may be gone or say Running).

    Written with the service's keys beside, not inside, the results prefix: deleting the results
    keeps it. Returns the marker's URI.
    """
    from sat_tasks.io import object_storage as storage

    bucket, _, key = layout.results_uri[len("s3://"):].partition("/")
    uri = f"s3://{bucket}/{revocation_key(key)}"
    at = datetime.datetime.now(datetime.UTC).isoformat()
    storage.write_json(hook, uri, {"why": why, "by": by, "at": at})
    return uri


def ended_grace_seconds() -> float:
    """How long after its terminal status a run's credentials still work: a stopped pod's final checkpoint."""
    try:
        final = float(sat_setting("final_checkpoint_grace_seconds"))
    except ValueError:
        final = 60.0
    return max(final, 0.0) + ENDED_GRACE_MARGIN_SECONDS


def revoked_because(policy: Mapping[str, Any] | str | None, read: Callable[[str, str], bytes | None], *,
                    now: datetime.datetime | None = None, grace_seconds: float | None = None) -> str | None:
    """Why a session with `policy` must be refused now (its run was deleted or has ended), or None.

    `read(bucket, key)`: the object's bytes, None when there is none (the store's own view, no
    policy). A policy that names no run (`RunState`: sessions issued before ADR 0039) is not
    revoked here; its lifetime bounds it.
    """
    named = run_records_of(policy)
    if named is None:
        return None
    bucket, prefix = named
    raw = read(bucket, revocation_key(prefix))
    if raw is not None:  # any marker revokes, even one that does not read as JSON
        marker = _json(raw)
        why = marker.get("why") if isinstance(marker, dict) else None
        return f"the run's credentials were revoked ({why or 'revoked'})"
    history = _json(read(bucket, prefix + contract.STATUS_NAME))
    if not isinstance(history, list) or not history or not isinstance(history[-1], dict):
        return None
    last = history[-1]
    if last.get("status") not in {status.value for status in TERMINAL}:
        return None
    try:
        ended = datetime.datetime.fromisoformat(str(last.get("at")))
    except ValueError:
        return f"the run ended ({last.get('status')})"
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=datetime.UTC)
    now = now or datetime.datetime.now(datetime.UTC)
    grace = ended_grace_seconds() if grace_seconds is None else grace_seconds
    if (now - ended).total_seconds() < grace:
        return None
    return f"the run ended ({last.get('status')} at {last.get('at')})"


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None
