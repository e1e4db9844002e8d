"""A node ledger of a test's own: a fresh prefix in a bucket of the embedded store, set as `[sat] node_ledger_uri`."""

from __future__ import annotations

import uuid


def fresh_ledger_root(s3_hook, monkeypatch, bucket: str) -> str:
    """A new, empty ledger prefix in `bucket` (made if missing), which every ledger read and write of the test uses."""
    if not s3_hook.check_for_bucket(bucket):
        s3_hook.create_bucket(bucket_name=bucket, region_name="us-east-1")
    uri = f"s3://{bucket}/ledger-{uuid.uuid4().hex[:8]}/"
    monkeypatch.setenv("AIRFLOW__SAT__NODE_LEDGER_URI", uri)
    return uri
