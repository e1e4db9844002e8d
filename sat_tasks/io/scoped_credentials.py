"""Object Storage credentials for one training attempt: STS `AssumeRole` with the run's session policy (ADR 0020).

SAT's own tasks (staging, upload, status, verdicts, the ledger) keep the service's keys (the
`sat_object_storage` connection). A training process gets instead a temporary triple (key id,
secret, session token) that STS issued for `run_policy`: read-only on `data.source` and
`storage.script_url`, read-write on the run's results prefix (`RunLayout.results_uri`),
nothing else. Settings (`[sat]`):

- `scoped_credentials` (`on`): `off` gives trainings the service's keys, with a warning in
  the job log (an Object Storage without STS; every job can then touch every other's objects);
- `scoped_credentials_role_arn`: the role SAT's keys assume (MinIO ignores it; on AWS or
  Ceph RGW a role whose own policy covers the data and results buckets);
- `scoped_credentials_seconds` (`43200`): how long the credentials live (STS's minimum is
  900; the role's maximum session duration must allow it). An attempt that runs longer loses
  its mirror: raise it for such jobs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sat_tasks.config import sat_setting
from sat_tasks.core.contracts import Log
from sat_tasks.core.object_policy import (
    PolicyInputError,
    policy_json,
    run_session_policy,
)
from sat_tasks.errors import SatError

if TYPE_CHECKING:  # pragma: no cover
    from sat_tasks.io.run_layout import RunLayout

SETTING = "scoped_credentials"
STS_MIN_SECONDS = 900
DEFAULT_REGION = "us-east-1"
_SESSION_NAME_UNSAFE = re.compile(r"[^\w+=,.@-]")


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
    """The session policy of the run's attempts: its data and script read-only, its results prefix read-write."""
    job = layout.job
    read_only = {"data.source": job.data.source}
    if job.storage.script_url:
        read_only["storage.script_url"] = job.storage.script_url
    try:
        return run_session_policy(read_only=read_only, read_write={"results.destination": layout.results_uri})
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
    log(f"[sat] attempt {attempt}: Object Storage credentials scoped to {layout.results_uri} (read-write) and "
        f"{layout.job.data.source} (read-only), valid {session_seconds()} s")
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
