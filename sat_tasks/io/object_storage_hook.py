"""The S3Hook SAT talks to Object Storage with, shared within a process while its connection stays the same.

Two costs of the Amazon provider's hook were most of a short task's time on a 2-core host
(profiled: a three-attempt job under `dag.test` made 17 clients, 12.8 s of its 71 s):

- each client's User-Agent names its caller, found with two `inspect.stack()` walks of the whole
  call stack (0.2-0.4 s per client here); SAT names itself instead (`CALLER`);
- each hook builds a boto3 session and client, which parses botocore's service models anew
  (~0.3 s). A process now keeps one hook per connection *content*: `object_storage_hook` looks the
  connection up each time (cheap) and reuses the hook made for the same fields, so an edited or
  rotated connection gets a new hook and client at once. boto3 clients are thread-safe.

The processes that gain are the ones that run many tasks or requests: `dag.test` (`sat run`,
`make demo`, the tests), the API server's views. A task under the scheduler is a process of its
own and still makes its one client, without the stack walks.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from airflow.providers.amazon.aws.hooks.s3 import S3Hook

#: What the hook's User-Agent says made the call (`Caller/<this>`), instead of the provider's stack walk.
CALLER = "SAT"
#: Connections (by content) whose hooks a process keeps; the oldest goes first.
MAX_KEPT = 8
TRANSFER_CONFIG = {"max_concurrency": 4}

_kept: OrderedDict[tuple[str, str], ObjectStorageHook] = OrderedDict()
_lock = threading.Lock()


class ObjectStorageHook(S3Hook):
    """S3Hook whose User-Agent names SAT as the caller without walking the stack (see the module)."""

    def _get_caller(self, target_function_name: str = "execute") -> str:
        return CALLER


def new_hook(conn_id: str | None) -> ObjectStorageHook:
    """A hook of its own for `conn_id` (None: boto3's credential chain, as in a staging pod), not kept."""
    return ObjectStorageHook(aws_conn_id=conn_id, transfer_config_args=dict(TRANSFER_CONFIG))


def connection_fingerprint(conn_id: str) -> str | None:
    """A digest of the connection's fields (its secret among them, never kept itself); None when it cannot be read."""
    try:
        conn = ObjectStorageHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - not found or unreadable: the hook resolves it and says why
        return None
    fields = [conn.conn_type, conn.host, conn.login, conn.password, conn.port, conn.schema, conn.extra]
    return hashlib.sha256(json.dumps(fields, default=str).encode()).hexdigest()


def shared_hook(conn_id: str) -> ObjectStorageHook:
    """The process's hook for `conn_id` as the connection reads now: made once per content, then reused."""
    fingerprint = connection_fingerprint(conn_id)
    if fingerprint is None:
        return new_hook(conn_id)
    key = (conn_id, fingerprint)
    with _lock:
        hook = _kept.get(key)
        if hook is None:
            hook = _kept[key] = new_hook(conn_id)
            while len(_kept) > MAX_KEPT:
                _kept.popitem(last=False)
        else:
            _kept.move_to_end(key)
        return hook


def forget_hooks() -> None:
    """Drop the kept hooks (a process that forked, or a test that wants fresh clients)."""
    with _lock:
        _kept.clear()
