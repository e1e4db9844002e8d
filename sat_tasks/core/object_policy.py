"""The Object Storage policy of one training attempt (read its data, read-write its results) and its evaluation.

`run_session_policy` builds the IAM policy document SAT passes to STS `AssumeRole` as the
session policy (ADR 0020): the temporary credentials it returns can do what the policy allows
and nothing else. `is_allowed` evaluates such a document for one request, the part of IAM's
rules these documents use (the embedded Object Storage enforces them with it, `io.s3_gate`):
an explicit Deny wins, then any Allow, else denied; `Action`/`Resource` with `*` and `?`
wildcards; `StringEquals` / `StringLike` / `StringNotLike` conditions. An element it does not
know makes its statement deny, never allow.

Prefixes are folders: `s3://b/results/job-1/` grants `results/job-1/*` and never
`results/job-10/...`; a URI without a trailing `/` grants that one object and the folder of
that name (`data/train.jsonl` and `data/train.jsonl/*`), never a sibling with a longer name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_engine.contract import STATUS_NAME
from sat_tasks.errors import SatError

POLICY_VERSION = "2012-10-17"
# What the engine's mirror and metrics recorder (and a script reading its data) do with objects.
READ_ACTIONS = ("s3:GetObject",)
WRITE_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                 "s3:ListMultipartUploadParts")
LIST_ACTION = "s3:ListBucket"
PREFIX_KEY = "s3:prefix"
_CONDITION_OPERATORS = ("StringEquals", "StringLike", "StringNotLike")
RUN_STATE_SID = "RunState"
RUN_STATE_NAME = STATUS_NAME  # the run's status history, the one object of its records a session may read


class PolicyInputError(SatError, ValueError):
    """A prefix for a session policy is not an `s3://bucket/key` URI (the message names it and the rule)."""


@dataclass(frozen=True)
class Grant:
    """One bucket's objects a policy grants: exact `keys` and folder `prefixes` (each ends with `/`)."""

    bucket: str
    keys: tuple[str, ...]
    prefixes: tuple[str, ...]


def object_arn(bucket: str, key: str = "") -> str:
    """`arn:aws:s3:::<bucket>/<key>` (a pattern when `key` ends with `*`); the bucket's ARN without a key."""
    return f"arn:aws:s3:::{bucket}/{key}" if key else f"arn:aws:s3:::{bucket}"


def grant_of(uri: str, field: str) -> Grant:
    """What `uri` (an `s3://bucket/key` URI, the value of spec `field`) grants: see the module docstring."""
    if not uri.startswith("s3://"):
        raise PolicyInputError(f"{field}: {uri!r} is not an s3://bucket/key URI")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key.strip("/"):
        raise PolicyInputError(f"{field}: {uri!r} must name a key or prefix inside a bucket, not a whole bucket")
    if any(char in key for char in "*?") or any(part in (".", "..") for part in key.split("/")):
        raise PolicyInputError(f"{field}: {uri!r} may not hold '*', '?' or '.'/'..' parts (a policy reads them "
                               "as wildcards or they name another folder)")
    if key.endswith("/"):
        return Grant(bucket, (), (key,))
    return Grant(bucket, (key,), (key + "/",))


def run_session_policy(*, read_only: Mapping[str, str], read_write: Mapping[str, str],
                       run_records: str | None = None) -> dict[str, Any]:
    """The session policy of one attempt: `read_only` and `read_write` map a spec field's name to its URI.

    Objects: `s3:GetObject` on every grant; writes, deletes and multipart uploads on the
    `read_write` ones. Listing: `s3:ListBucket` on each bucket, only with an `s3:prefix`
    inside a granted folder (listing the whole bucket, or a sibling's prefix, is denied).
    `run_records`: the run's results prefix (a folder URI), named by a `RunState` statement
    (read of its `status.json` only) so that a gate can tell which run a session belongs to.
    """
    statements: list[dict[str, Any]] = []
    listing: dict[str, list[str]] = {}
    for sid, fields, actions in (("Read", read_only, READ_ACTIONS), ("ReadWrite", read_write, WRITE_ACTIONS)):
        grants = [grant_of(uri, field) for field, uri in fields.items()]
        resources = sorted({object_arn(g.bucket, key) for g in grants for key in g.keys}
                           | {object_arn(g.bucket, prefix + "*") for g in grants for prefix in g.prefixes})
        if resources:
            statements.append({"Sid": f"{sid}Objects", "Effect": "Allow", "Action": list(actions),
                               "Resource": resources})
        for grant in grants:
            listing.setdefault(grant.bucket, []).extend(prefix + "*" for prefix in grant.prefixes)
    for index, (bucket, patterns) in enumerate(sorted(listing.items())):
        statements.append({"Sid": f"List{index}", "Effect": "Allow", "Action": [LIST_ACTION],
                           "Resource": [object_arn(bucket)],
                           "Condition": {"StringLike": {PREFIX_KEY: sorted(set(patterns))}}})
    if run_records is not None:
        grant = grant_of(run_records, "results")
        if not grant.prefixes or grant.keys:
            raise PolicyInputError(f"results: {run_records!r} must be a folder (end with '/')")
        statements.append({"Sid": RUN_STATE_SID, "Effect": "Allow", "Action": list(READ_ACTIONS),
                           "Resource": [object_arn(grant.bucket, grant.prefixes[0] + RUN_STATE_NAME)]})
    return {"Version": POLICY_VERSION, "Statement": statements}


def run_records_of(policy: Mapping[str, Any] | str | None) -> tuple[str, str] | None:
    """The (bucket, results key prefix) a run's policy names in its `RunState` statement; None without one."""
    try:
        document = json.loads(policy) if isinstance(policy, str) else policy
        statements = document["Statement"] if document else []
    except (ValueError, KeyError, TypeError):
        return None
    for statement in statements if isinstance(statements, list) else ():
        if not isinstance(statement, Mapping) or statement.get("Sid") != RUN_STATE_SID:
            continue
        resources = statement.get("Resource")
        resource = resources[0] if isinstance(resources, list) and len(resources) == 1 else resources
        if not isinstance(resource, str) or not resource.startswith("arn:aws:s3:::"):
            return None
        bucket, _, key = resource[len("arn:aws:s3:::"):].partition("/")
        if not bucket or not key.endswith("/" + RUN_STATE_NAME):
            return None
        return bucket, key[: -len(RUN_STATE_NAME)]
    return None


def policy_json(policy: Mapping[str, Any]) -> str:
    """The document as STS takes it (compact: `AssumeRole` limits a session policy's packed size)."""
    return json.dumps(policy, separators=(",", ":"), sort_keys=True)


# ---- evaluation ------------------------------------------------------------------------------
def is_allowed(policy: Mapping[str, Any] | str | None, action: str, resource: str,
               context: Mapping[str, str] | None = None) -> bool:
    """Whether `policy` allows `action` on `resource` with the condition keys in `context`.

    No policy, or one that cannot be read, allows nothing.
    """
    try:
        document = json.loads(policy) if isinstance(policy, str) else policy
        statements = document["Statement"] if document else []
    except (ValueError, KeyError, TypeError):
        return False
    if isinstance(statements, Mapping):
        statements = [statements]
    allowed = False
    for statement in statements if isinstance(statements, list) else ():
        effect = _applies(statement, action, resource, context or {})
        if effect == "Deny":
            return False
        allowed = allowed or effect == "Allow"
    return allowed


def _applies(statement: Any, action: str, resource: str, context: Mapping[str, str]) -> str | None:
    """The statement's effect when it applies to the request; an unknown element counts as Deny."""
    if not isinstance(statement, Mapping):
        return "Deny"
    effect = statement.get("Effect")
    known = {"Sid", "Effect", "Action", "Resource", "Condition"}
    if effect not in ("Allow", "Deny") or set(statement) - known or "Action" not in statement:
        return "Deny"
    if not _matches_any(statement["Action"], action, case_sensitive=False):
        return None
    if not _matches_any(statement.get("Resource", "*"), resource, case_sensitive=True):
        return None
    condition = _conditions_hold(statement.get("Condition") or {}, context)
    if condition is None:
        return "Deny"
    return effect if condition else None


def _matches_any(patterns: Any, value: str, *, case_sensitive: bool) -> bool:
    if isinstance(patterns, str):
        patterns = [patterns]
    return any(isinstance(p, str) and wildcard_match(p, value, case_sensitive=case_sensitive)
               for p in patterns or ())


def _conditions_hold(conditions: Any, context: Mapping[str, str]) -> bool | None:
    """Whether every condition holds (None: an operator this evaluator does not know)."""
    if not isinstance(conditions, Mapping):
        return None
    for operator, keys in conditions.items():
        if operator not in _CONDITION_OPERATORS or not isinstance(keys, Mapping):
            return None
        for key, expected in keys.items():
            values = [expected] if isinstance(expected, str) else list(expected)
            actual = context.get(key)
            if operator == "StringNotLike":
                if actual is not None and any(wildcard_match(v, actual) for v in values):
                    return False
                continue
            if actual is None:
                return False  # a key the request does not carry fails every positive operator
            like = operator == "StringLike"
            if not any(wildcard_match(v, actual) if like else v == actual for v in values):
                return False
    return True


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM's `*` (any run, empty too) and `?` (one character); nothing else is special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL if case_sensitive else re.DOTALL | re.IGNORECASE) is not None

