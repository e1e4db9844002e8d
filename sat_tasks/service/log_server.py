"""The deployment's task-log server, bound where the API server is (issue 45.6).

    python -m sat_tasks.service.log_server --host 127.0.0.1 --port 41793

Airflow's scheduler and triggerer each start a log server of their own on all interfaces
(`0.0.0.0:8793` and `:8794`, whatever `--host` says), so two deployments on one host collide,
and a deployment bound to loopback serves its task logs to the network. `sat up` starts them
with `--skip-serve-logs` and runs this one instead: Airflow's own log-server app (the API
server asks it, with its JWT, for a running task's log), on the deployment's host, on a port
chosen free at start (or the operator's `[logging] worker_log_server_port`), which both
`worker_log_server_port` and `trigger_log_server_port` name: it serves the one log folder.

The API server reaches it at the task's hostname: `hostname` (the `[core] hostname_callable`
the stack sets) is the host it binds, unless that is every interface.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence

HOST_ENV = "SAT_LOG_SERVER_HOST"  # the host the log server binds (the deployment's `--host`)
EVERY_INTERFACE = ("", "0.0.0.0", "::")  # the names of binding every interface


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host if host not in EVERY_INTERFACE else "", 0))
        return probe.getsockname()[1]


def hostname() -> str:
    """The name tasks record as their host (`[core] hostname_callable`): the address the log server binds, where
    the API server finds it; this host's name when it binds every interface."""
    host = os.environ.get(HOST_ENV, "")
    return socket.getfqdn() if host in EVERY_INTERFACE else host


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sat_tasks.service.log_server")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    print(f"[sat] log server on {args.host}:{args.port}", flush=True)
    uvicorn.run("airflow.utils.serve_logs.log_server:get_app", factory=True, host=args.host, port=args.port,
                log_level="warning", log_config=None, access_log=False)


if __name__ == "__main__":
    main()
