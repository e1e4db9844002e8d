"""SQLite settings for the metadata DB of `make up`: write-ahead logging, and writers that wait a while for the lock.

The API server, the scheduler, the DAG processor and every task's supervisor (through the
API server) write to the one SQLite file, which lets one writer in at a time.

- WAL (`use_wal`, kept in the file): readers no longer block a writer's commit, nor
  writers a reader, so only two writers at once contend. In the default rollback journal,
  every open read held a commit up.
- A busy timeout of 20 s instead of 5 s, for a writer of one process waiting for another's.

One contention remains that no timeout cures: the API server writes its audit log
(`log` table) from an async dependency, on the event loop, through the blocking SQLite
driver. If another request of the same server holds the write lock and needs the loop to
commit, the loop waits out the busy timeout and that REST call fails with "Database
error" (seen in the service tests on this 2-core machine: a trigger that failed after
the timeout); a client retries it. SQLite is the embedded
default of a single-host deployment; the Helm chart's PostgreSQL has no such lock.
`[database] sql_alchemy_connect_args(_async)` name the dicts below.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

CONNECT_ARGS = {"timeout": 20}
CONNECT_ARGS_ASYNC = {"timeout": 20}


def use_wal(db: Path) -> None:
    """Switch the SQLite file `db` to write-ahead logging (a property of the file: set once, kept)."""
    with sqlite3.connect(db, timeout=60) as connection:
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise RuntimeError(f"{db}: SQLite refused write-ahead logging (journal_mode is {mode})")
