"""SQLite settings for the metadata DB of `make up`: writers wait for the lock instead of failing.

The API server, the scheduler, the DAG processor and every task's supervisor write to the
one SQLite file. SQLite lets one writer in at a time and, by default, gives up after 5 s
("database is locked"): a REST call or a task's heartbeat then fails with a 500 while the
DAG processor writes a batch of serialised DAGs. Waiting up to a minute turns those
failures into short waits. Production uses PostgreSQL (the Helm chart), where this does not
arise. `[database] sql_alchemy_connect_args(_async)` name these dicts.
"""

from __future__ import annotations

CONNECT_ARGS = {"timeout": 60}
CONNECT_ARGS_ASYNC = {"timeout": 60}
