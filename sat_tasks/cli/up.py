"""`sat up` and `sat down`: SAT as a service on this host (what `make up` / `make down` run)."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from sat_tasks.cli.common import EXIT_FAILED, EXIT_OK, configure_airflow_env


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("up", help="run SAT as a service here: API server and UI, scheduler, DAG processor, "
                                         "Object Storage (Ctrl-C or `sat down` stops it)")
    p.add_argument("--host", default=os.environ.get("SAT_HOST", "127.0.0.1"),
                   help="address the API server binds (default 127.0.0.1: this host only; env SAT_HOST)")
    p.add_argument("--port", type=int, default=int(os.environ.get("SAT_PORT", "8080")),
                   help="the API server's port (default 8080; env SAT_PORT)")
    p.add_argument("--storage-port", type=int, default=int(os.environ.get("SAT_STORAGE_PORT", "9000")),
                   help="the embedded Object Storage's port (default 9000; env SAT_STORAGE_PORT)")
    p.add_argument("--storage-dir", default=os.environ.get("SAT_STORAGE_DIR"),
                   help="where the embedded Object Storage keeps its objects between runs "
                        "(default .sat/object-storage in the project; env SAT_STORAGE_DIR)")
    p.add_argument("--db", choices=("sqlite", "postgres"), default=os.environ.get("SAT_DB") or None,
                   help="the metadata DB: postgres (the default: a private cluster from Debian's postgresql "
                        "package, which `make system-deps` installs, its password generated beside the other "
                        "secrets) or sqlite (<AIRFLOW_HOME>/airflow.db: one person, a few jobs at a time); env "
                        "SAT_DB. A [database] sql_alchemy_conn the operator set is used unchanged")
    p.add_argument("--db-port", type=int, default=int(os.environ.get("SAT_DB_PORT", "0")),
                   help="the PostgreSQL cluster's loopback port (default: a free one; env SAT_DB_PORT)")
    p.set_defaults(func=cmd_up)
    p = subparsers.add_parser("down", help="stop what `sat up` started")
    p.set_defaults(func=cmd_down)


def _home() -> Path:
    configure_airflow_env()
    return Path(os.environ["AIRFLOW_HOME"])


def cmd_up(args: argparse.Namespace) -> int:
    from sat_tasks.config import PROJECT_ROOT
    from sat_tasks.service.database import SERVICE_DEFAULT, DatabaseChoiceError
    from sat_tasks.service.secrets import private_dir
    from sat_tasks.service.stack import ServiceStack

    home = _home()
    private_dir(PROJECT_ROOT / ".sat")  # the kept objects and the work dir: this user's only
    storage_dir = Path(args.storage_dir) if args.storage_dir else PROJECT_ROOT / ".sat" / "object-storage"
    stack = ServiceStack(home=home, host=args.host, port=args.port, storage_port=args.storage_port,
                         storage_dir=storage_dir, work_dir=PROJECT_ROOT / ".sat" / "work",
                         db=args.db, default_db=SERVICE_DEFAULT, db_port=args.db_port, log=lambda line: print(line, flush=True),
                         **registry_options())
    try:
        stack.database_choice()  # a --db that contradicts a configured URL: said before anything starts
    except DatabaseChoiceError as exc:
        print(f"[sat] {exc}")
        return EXIT_FAILED
    return stack.run()


def registry_options() -> dict:
    """The embedded registry's `ServiceStack` arguments from `[sat] embedded_registry(_port)` (ADR 0042)."""
    from sat_tasks.config import sat_setting
    from sat_tasks.service import registry

    if sat_setting("embedded_registry") == "off":
        return {"registry": False}
    if not registry.installed():
        print(f"[sat] no embedded container registry: {registry.INSTALL_HINT}")
        return {"registry": False}
    from sat_tasks.backends.local.image_build import TRAINING_IMAGE

    return {"registry": True, "registry_port": int(sat_setting("embedded_registry_port") or 0),
            "registry_images": (TRAINING_IMAGE,) if shutil.which("podman") else ()}


def cmd_down(args: argparse.Namespace) -> int:
    from sat_tasks.service.stack import ServiceError, stop_running

    try:
        stopped = stop_running(_home())
    except ServiceError as exc:
        print(f"[sat] {exc}")
        return EXIT_FAILED
    print("[sat] stopped" if stopped else "[sat] nothing to stop: no `sat up` runs for this project")
    return EXIT_OK
