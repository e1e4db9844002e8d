"""The service stack `make up` runs: Object Storage, the metadata DB, the API server, the scheduler, the DAG processor, the triggerer.

Call order: `ServiceStack(...)` -> `start()` (storage, the metadata DB's server when it runs
one, `airflow db migrate`, the components, waits until the API answers) -> `wait()` (until a stop
is asked, or a component keeps failing) -> `stop()` (every component's process group, then the
DB's server, then the storage's last copy). `run()` does all
three and stops on SIGINT/SIGTERM, which is what `make up` / `sat up` and `make down` /
`sat down` (SIGTERM to the pid in `<home>/sat-up.pid`) use.

The metadata DB is what `service.database` chooses: the operator's own `[database]
sql_alchemy_conn` unchanged, else SQLite in the home (`db="sqlite"`), or a private PostgreSQL
cluster (`db="postgres"`, `service.postgres`). The components share one environment: the
project's config, the secrets of
`service.secrets` (so the execution API accepts the scheduler's task tokens, and a restart
keeps working), the Object Storage connection, and the API server's own URL for the
execution API. The API server binds `host` (127.0.0.1 by default) with authentication on.

The embedded registry (`registry=True`, what `sat up` asks for where docker-registry is installed;
`service.registry`, ADR 0042) starts right after the storage, as a supervised component of its own
(`registry`): TLS from the deployment's CA, the login kept with the other secrets and handed to the
components as the shared connection `sat_embedded_registry` and `[sat] registry_ca_file`. Once the
components run, a thread pushes `registry_images` (SAT's training image) from the project's store
when the registry does not serve that image id yet.

Supervision (issue 48.2): once the service is up, a component that exits is restarted with its
own command and environment, after a backoff that doubles with each crash of it in the window
(`restart_backoff_s` .. `restart_backoff_max_s`), and each crash and restart is logged. The
service stops only when the operator asks, or when one component exits `crash_limit` times
within `crash_window_s` (5 in 5 minutes): then it keeps failing, and restarting hides that. A
component that dies while the service starts fails the start, as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.config import PROJECT_ROOT
from sat_tasks.core import procs
from sat_tasks.errors import SatError
from sat_tasks.service import concurrency, log_server
from sat_tasks.service import secrets as service_secrets
from sat_tasks.service.database import (
    CONFIGURED,
    DatabaseChoice,
    choose_database,
    sqlite_env,
)
from sat_tasks.service.preload import FORKING_COMPONENTS
from sat_tasks.service.sqlite import use_wal

PID_FILE = "sat-up.pid"
SERVICE_MARK_ENV = "SAT_SERVICE_HOME"  # every process the deployment starts inherits it
# In start order. SAT's sensors reschedule rather than defer, but without a triggerer the UI's
# health panel shows it red on a person's first login, and deferrable operators of users' own
# DAGs would wait forever: it runs too (mostly idle).
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
# Airflow's own log servers bind every interface on fixed ports: these run without them, and `service.log_server`
# serves the task logs on the deployment's host and a port of its own (issue 45.6).
LOG_SERVER = "log-server"
REGISTRY = "registry"  # the embedded container registry (service.registry): a component with its own command
SKIP_SERVE_LOGS = {"scheduler": ["--skip-serve-logs"], "triggerer": ["--skip-serve-logs"]}
LOG_PORT_KEYS = ("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT")
# Supervision: a component that exits this often within the window keeps failing, and the service stops.
CRASH_LIMIT = 5
CRASH_WINDOW_S = 300.0


class ServiceError(SatError):
    """A component did not start or stopped; the message names it and where its log is."""


def component_command(component: str, args: list[str]) -> list[str]:
    """The command of one Airflow component: those that fork their work start through `service.preload`; the
    log server is SAT's (`service.log_server`)."""
    if component == LOG_SERVER:
        return [sys.executable, "-m", "sat_tasks.service.log_server", *args]
    if component == REGISTRY:
        from sat_tasks.service.registry import BINARY

        return [shutil.which(BINARY) or BINARY, "serve", *args]
    if component in FORKING_COMPONENTS:
        return [sys.executable, "-m", "sat_tasks.service.preload", component, *args]
    return [sys.executable, "-m", "airflow", component, *args]


@dataclass
class ServiceStack:
    """The processes of one deployment on this host.

    Args:
        home: the Airflow home (metadata DB, logs, secrets, pid file).
        host / port: where the API server (UI and REST API) listens; 127.0.0.1 unless configured.
        storage_port: the embedded Object Storage's port (0: a free one).
        storage_dir: where the Object Storage keeps its objects between runs.
        dags_folder / jobs_dir / work_dir: the project's by default (tests use their own).
        extra_env: more environment for every component (tests: short intervals).
        db: the metadata DB, `sqlite` or `postgres` (None: `default_db`, unless the operator configured one).
        default_db: the metadata DB when `db` is None: SQLite here (tests, benchmarks); `sat up` asks for
            `database.SERVICE_DEFAULT` (PostgreSQL).
        db_port: the PostgreSQL cluster's loopback port (0: a free one).
        log_server_port: the task-log server's port on `host` (0: the operator's `[logging]
            worker_log_server_port` from the environment, else a free one chosen at start).
        restart_backoff_s / restart_backoff_max_s: the wait before restarting a component that exited,
            doubled with each of its crashes in the window, at most the second.
        crash_limit / crash_window_s: that many exits of one component within the window stop the service.
        registry: run the embedded registry (`service.registry`); `sat up` asks for it where it is installed.
        registry_port: its port on 127.0.0.1 (0: the one kept for the deployment, else a free one).
        registry_images: the images of the project's store it serves (pushed at start; SAT's training image).
        registry_dir: its files (default `<home>/registry`); certs_dir: the project's podman per-registry CA
            folders (default `<containers_dir>/certs.d`).
    """

    home: Path
    host: str = "127.0.0.1"
    port: int = 8080
    storage_port: int = 0
    storage_dir: Path | None = None
    dags_folder: Path = PROJECT_ROOT / "dags"
    jobs_dir: Path = PROJECT_ROOT / "include" / "jobs"
    work_dir: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    db: str | None = None
    default_db: str = "sqlite"
    db_port: int = 0
    log_server_port: int = 0
    log: object = print
    processes: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    storage: object = field(default=None, repr=False)
    database: object = field(default=None, repr=False)  # the PostgreSQL cluster, when it runs one
    first_answer_s: float | None = None
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    crash_limit: int = CRASH_LIMIT
    crash_window_s: float = CRASH_WINDOW_S
    restarts: dict[str, int] = field(default_factory=dict)  # how many times each component was restarted
    registry: bool = False
    registry_port: int = 0
    registry_images: tuple[str, ...] = ()
    registry_dir: Path | None = None
    certs_dir: Path | None = None
    embedded_registry: object = field(default=None, repr=False)  # service.registry.EmbeddedRegistry, when it runs
    registry_push: threading.Thread | None = field(default=None, repr=False)
    registry_served: dict[str, str] = field(default_factory=dict)  # image -> the name the registry serves it as
    _stopping: bool = field(default=False, repr=False)
    _commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict, repr=False)
    _crashes: dict[str, deque] = field(default_factory=dict, repr=False)
    _restart_at: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs" / "service"

    def environment(self) -> dict[str, str]:
        """The environment of every component (holds secrets: never printed)."""
        kept = service_secrets.load_or_create(self.home)
        env = {**os.environ}
        env.update({
            "AIRFLOW_HOME": str(self.home),
            SERVICE_MARK_ENV: str(self.home),
            "AIRFLOW_CONFIG": str(PROJECT_ROOT / "airflow.cfg"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__SAT__JOBS_DIR": str(self.jobs_dir),
            "AIRFLOW__SAT__WORK_DIR": str(self.work_dir or self.home / "work"),
            "GX_ANALYTICS_ENABLED": "false",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(service_secrets.component_env(kept, self.home))
        if self.log_server_port:  # every component: the API server asks the log server at this port
            env.update({key: str(self.log_server_port) for key in LOG_PORT_KEYS})
            env.update({log_server.HOST_ENV: self.host,
                        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "sat_tasks.service.log_server.hostname"})
        kind = self.database_choice().kind
        if kind == "sqlite":
            env.update(sqlite_env(self.home))
        elif kind == "postgres":
            if self.database is None:
                raise ServiceError("the PostgreSQL cluster is not started: start() starts it before the components")
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.database.url()
        if self.storage is not None:
            env.update(self.storage.connection_env())
        env.update(concurrency.sized_env({**env, **self.extra_env}))  # from the local pool (issue 45.5)
        env.update(concurrency.scheduler_env({**env, **self.extra_env}))  # one scheduler (issue 48)
        env.update(self.extra_env)
        if self.embedded_registry is not None:  # the operator's shared logins and CA kept, the registry's added
            from sat_tasks.config import sat_setting

            shared = self.extra_env.get("AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS",
                                        sat_setting("shared_registry_connections"))
            ca_file = self.extra_env.get("AIRFLOW__SAT__REGISTRY_CA_FILE", sat_setting("registry_ca_file"))
            env.update(self.embedded_registry.connection_env(shared=shared, ca_file=ca_file))
        return env

    def database_choice(self) -> DatabaseChoice:
        return choose_database(self.db, os.environ, PROJECT_ROOT / "airflow.cfg", default=self.default_db)

    # ---- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 180) -> ServiceStack:
        """Start everything; returns once the API server answers (`first_answer_s` says after how long).

        A start that fails stops what it had started (the PostgreSQL server runs in a session of
        its own: it would outlive the caller) and raises.
        """
        try:
            return self._start(timeout)
        except BaseException:
            self.stop(grace=10)
            raise

    def _start(self, timeout: float) -> ServiceStack:
        from sat_tasks.io.local_s3 import PersistentS3Server, seed_demo_bucket

        started = time.monotonic()
        service_secrets.private_dir(self.home)
        service_secrets.private_dir(self.work_dir or self.home / "work")  # staged data and run outputs
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.storage = PersistentS3Server(port=self.storage_port,
                                          state_dir=self.storage_dir or self.home / "object-storage",
                                          secret_key=service_secrets.load_or_create(self.home).object_storage_secret,
                                          ).start()
        self.log(f"[sat] Object Storage (moto S3, kept in {self.storage.state_dir}) on {self.storage.endpoint_url}")
        seed_demo_bucket(_Client(self.storage))
        if self.registry:
            self._start_registry(timeout)
        self._start_database()
        self.log_server_port = (self.log_server_port or int(os.environ.get(LOG_PORT_KEYS[0]) or 0)
                                or log_server.free_port(self.host))
        env = self.environment()
        self.log("[sat] migrating the metadata DB ...")
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.database_choice().kind == "sqlite":
            use_wal(self.home / "airflow.db")
        # The API server first: the scheduler's tasks report to its execution API from their
        # first second, and a task that finds no API server fails after a few retries.
        self._start_component("api-server", ["--host", self.host, "--port", str(self.port)], env)
        self.await_api(timeout)
        self._start_component(LOG_SERVER, ["--host", self.host, "--port", str(self.log_server_port)], env)
        self.log(f"[sat] task logs served on {self.host}:{self.log_server_port}")
        for component in COMPONENTS[1:]:
            self._start_component(component, SKIP_SERVE_LOGS.get(component, []), env)
        self.first_answer_s = time.monotonic() - started
        (self.home / PID_FILE).write_text(str(os.getpid()))
        if self.embedded_registry is not None and self.registry_images:
            self.registry_push = threading.Thread(target=self._push_images, name="sat-registry-push", daemon=True)
            self.registry_push.start()
        return self

    def _start_registry(self, timeout: float) -> None:
        """The embedded registry, as a supervised component; returns once it answers with its login over TLS."""
        from sat_tasks.service.registry import CONN_ID, USER, EmbeddedRegistry, RegistryError

        if self.certs_dir is None:
            from sat_tasks.backends.local.containers import containers_dir

            self.certs_dir = containers_dir() / "certs.d"
        kept = service_secrets.load_or_create(self.home)
        registry = EmbeddedRegistry(folder=self.registry_dir or self.home / "registry", password=kept.registry_password,
                                    port=self.registry_port, certs_dir=self.certs_dir, log=self.log)
        try:
            registry.prepare()
            env = {**registry.process_env(dict(os.environ)), SERVICE_MARK_ENV: str(self.home)}
            self._start_component(REGISTRY, [str(registry.config_path)], env)
            registry.wait_ready(timeout, alive=self.check_alive)
        except RegistryError as exc:
            raise ServiceError(f"{exc}; see {self.logs_dir / (REGISTRY + '.log')}") from None
        self.embedded_registry = registry
        self.log(f"[sat] container registry (docker-registry, TLS) on {registry.address}: login {USER} as the "
                 f"connection {CONN_ID}, its password in {self.home / service_secrets.SECRETS_FILE} (key "
                 f"registry_password); podman trusts its CA from {registry.trust_dir}")

    def _push_images(self) -> None:
        """Push `registry_images` to the embedded registry (the thread `start` runs); each outcome logged."""
        from sat_tasks.service.registry import RegistryError

        registry = self.embedded_registry
        for image in self.registry_images:
            if self._stopping or registry is None:
                return
            try:
                served = registry.push(image)
            except (RegistryError, OSError, subprocess.SubprocessError) as exc:
                self.log(f"[sat] the embedded registry does not serve {image}: {exc}")
                continue
            if served is None:
                self.log(f"[sat] {image} is not in the project's image store (`make image` builds it): the "
                         "embedded registry does not serve it")
            else:
                self.registry_served[image] = served

    def _start_database(self) -> None:
        """The PostgreSQL cluster when `db` is `postgres`; a line saying which metadata DB it is."""
        from sat_tasks.service.postgres import PostgresCluster, PostgresError

        choice = self.database_choice()
        if choice.kind == CONFIGURED:
            self.log(f"[sat] metadata DB: the one configured in {choice.source}, unchanged")
        elif choice.kind == "sqlite":
            self.log(f"[sat] metadata DB: SQLite in {self.home / 'airflow.db'}")
        else:
            kept = service_secrets.load_or_create(self.home)
            cluster = PostgresCluster(home=self.home, password=kept.db_password, logs_dir=self.logs_dir,
                                      port=self.db_port, log=self.log)
            self.database = cluster
            try:
                cluster.start()
            except PostgresError as exc:
                raise ServiceError(str(exc)) from None
            self.log(f"[sat] metadata DB: {cluster.describe()}")
            note = sqlite_runs_note(self.home)
            if note:
                self.log(note)

    def _start_component(self, component: str, args: list[str], env: dict[str, str]) -> None:
        self._commands[component] = (args, env)
        with open(self.logs_dir / f"{component}.log", "ab") as out:
            self.processes[component] = subprocess.Popen(
                component_command(component, args), env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def await_api(self, timeout: float) -> float:
        """Wait until the API server answers its health check; seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise ServiceError(f"the API server did not answer on {self.url} within {timeout:.0f}s; "
                           f"see {self.logs_dir / 'api-server.log'}")

    def check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None and not self._stopping:
                raise ServiceError(f"the {name} exited with status {proc.returncode}; "
                                   f"see {self.logs_dir / (name + '.log')}")

    # ---- supervision ----------------------------------------------------------------------------
    def supervise(self, now: float | None = None) -> None:
        """One look at the components: note each that exited and restart it once its backoff has passed.

        Raises ServiceError when a component exited `crash_limit` times within `crash_window_s`.
        """
        if self._stopping:
            return
        now = time.monotonic() if now is None else now
        for name, proc in list(self.processes.items()):
            if proc.poll() is None or name in self._restart_at:
                continue
            crashes = self._crashes.setdefault(name, deque())
            crashes.append(now)
            while crashes and now - crashes[0] > self.crash_window_s:
                crashes.popleft()
            where = self.logs_dir / f"{name}.log"
            if len(crashes) >= self.crash_limit:
                raise ServiceError(f"the {name} exited {len(crashes)} times within {self.crash_window_s:.0f}s "
                                   f"(last status {proc.returncode}): it keeps failing; see {where}")
            delay = min(self.restart_backoff_max_s, self.restart_backoff_s * 2 ** (len(crashes) - 1))
            self._restart_at[name] = now + delay
            _signal_group(proc, signal.SIGKILL)  # what it left in its group (parse or task processes)
            self.log(f"[sat] the {name} exited with status {proc.returncode} ({len(crashes)} in the last "
                     f"{self.crash_window_s:.0f}s): restarting it in {delay:g}s; see {where}")
        for name, at in list(self._restart_at.items()):
            if now < at or self._stopping:
                continue
            del self._restart_at[name]
            args, env = self._commands[name]
            self._start_component(name, args, env)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            self.log(f"[sat] restarted the {name} (pid {self.processes[name].pid}, restart {self.restarts[name]})")

    # ---- run and stop ---------------------------------------------------------------------------
    def wait(self, poll_s: float = 1.0) -> None:
        """Until a stop is asked (SIGINT/SIGTERM) or a component keeps failing (`supervise`)."""
        while not self._stopping:
            self.supervise()
            time.sleep(poll_s)

    def stop(self, grace: float = 30) -> None:
        """Stop every component (SIGTERM to its process group, SIGKILL after `grace`), then the storage.

        Training processes run in sessions of their own (the local runner's), so besides the
        components' groups every process that carries this deployment's mark
        (`SAT_SERVICE_HOME`) in its environment is stopped too: none is left behind. They get
        their SIGTERM with the components (a training writes its final checkpoint meanwhile), not
        after: a scheduler waits for its tasks, and they for their training. Whatever still runs
        at `grace` is killed, so the components and training are gone within it (issue 45.6).
        """
        self._stopping = True
        began = time.monotonic()
        for proc in self.processes.values():
            _signal_group(proc, signal.SIGTERM)
        for pid in processes_of(self.home):
            _signal(pid, signal.SIGTERM)
        deadline = began + grace
        for name, proc in self.processes.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"[sat] the {name} did not stop within {grace:.0f}s: killing it")
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            _signal_group(proc, signal.SIGKILL)  # whatever a component left in its group (task processes)
        left = processes_of(self.home)
        if left:
            self.log(f"[sat] stopping {len(left)} more processes of this deployment (tasks, training)")
            procs.terminate(left, grace=max(0.0, deadline - time.monotonic()))
        self.log(f"[sat] components stopped ({time.monotonic() - began:.0f} s)")
        if self.database is not None:
            self.database.stop()
            self.database = None
            self.log("[sat] PostgreSQL stopped, its data kept")
        if self.storage is not None:
            began = time.monotonic()
            self.storage.stop()
            self.storage = None
            self.log(f"[sat] Object Storage stopped, its objects kept ({time.monotonic() - began:.0f} s)")
        (self.home / PID_FILE).unlink(missing_ok=True)

    def run(self) -> int:
        """start, print how to log in, wait, stop; SIGINT and SIGTERM stop it."""
        def ask_stop(signum, frame):
            self._stopping = True

        signal.signal(signal.SIGINT, ask_stop)
        signal.signal(signal.SIGTERM, ask_stop)
        try:
            self.start()
            self.log(f"[sat] SAT is up ({self.first_answer_s:.0f} s): {self.url}  (log in as {service_secrets.ADMIN_USER}; the password is in "
                     f"{self.home / service_secrets.SECRETS_FILE}, key admin_password, readable by you only)")
            self.log("[sat] Ctrl-C or `make down` stops it")
            self.wait()
            return 0
        except ServiceError as exc:
            self.log(f"[sat] {exc}")
            return 1
        finally:
            self.log("[sat] stopping ...")
            self.stop()
            self.log("[sat] stopped")


def sqlite_runs_note(home: Path) -> str | None:
    """What to say when this home's SQLite metadata DB holds runs that the PostgreSQL one now started does not show
    (issue 45.6: the list was empty with no word on it); None when there is none, or it holds no run."""
    import sqlite3

    path = home / "airflow.db"
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            runs = db.execute("SELECT count(*) FROM dag_run").fetchone()[0]
    except sqlite3.Error:
        return None
    if not runs:
        return None
    return (f"[sat] note: {path} holds {runs} DAG run(s) of this deployment's earlier SQLite metadata DB; the "
            "PostgreSQL one does not show them (SAT does not copy runs between metadata DBs). To see them, start "
            "with `sat up --db sqlite` (`make up DB=sqlite`); their results stay in Object Storage either way")


def processes_of(home: Path) -> list[int]:
    """Pids of the processes this deployment started (they carry `SAT_SERVICE_HOME=<home>`), but this one.

    A dedicated variable, not `AIRFLOW_HOME`: `make down` itself, or a person's shell, may
    carry the same `AIRFLOW_HOME` and must not be stopped.
    """
    return procs.marked(SERVICE_MARK_ENV, str(home))


def running_env(home: Path) -> dict[str, str] | None:
    """The connections (`AIRFLOW_CONN_*`) and SAT settings (`AIRFLOW__SAT__*`) the running deployment of `home`
    gave its components, read from a component's environment (this user's own process); None when none runs.

    For operator commands run beside the service (`sat nodes`, `sat warm-pool`, `sat report`): they reach
    its Object Storage with its keys, as its components do. Read-only. Holds secrets: never printed.
    """
    for pid in processes_of(home):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        # A component as `component_command` starts it, not a task's or a training process's (scoped keys).
        if argv[1:3] not in ([b"-m", b"airflow"], [b"-m", b"sat_tasks.service.preload"]) or len(argv) < 4 \
                or argv[3].decode(errors="replace") not in COMPONENTS:
            continue
        env = dict(entry.split("=", 1) for entry in raw.decode(errors="replace").split("\0") if "=" in entry)
        if env.get(SERVICE_MARK_ENV) == str(home):
            return {k: v for k, v in env.items() if k.startswith(("AIRFLOW_CONN_", "AIRFLOW__SAT__"))}
    return None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Client:
    """Just enough of an S3Hook for `seed_demo_bucket` (the stack seeds before Airflow runs)."""

    def __init__(self, storage) -> None:
        self._client = storage.client()

    def check_for_bucket(self, bucket: str) -> bool:
        return any(b["Name"] == bucket for b in self._client.list_buckets().get("Buckets", []))

    def create_bucket(self, bucket_name: str, region_name: str | None = None) -> None:
        self._client.create_bucket(Bucket=bucket_name)

    def load_file(self, filename, key: str, bucket_name: str, replace: bool = True) -> None:
        self._client.upload_file(str(filename), bucket_name, key)


def _is_sat_up(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return b"up" in argv and any(arg.endswith(b"sat") or b"sat_tasks" in arg for arg in argv)


def stop_running(home: Path, timeout: float = 90) -> bool:
    """`sat down`: SIGTERM to the `sat up` of `home` and wait until it is gone; False when none runs."""
    pid_file = home / PID_FILE
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text().strip())
    if not _is_sat_up(pid):  # the pid file outlived its `sat up` (a crash, a reboot): the pid may be another's
        pid_file.unlink(missing_ok=True)
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.state_of(pid) is None:  # gone, or a zombie its parent has not reaped yet
            return True
        time.sleep(0.5)
    raise ServiceError(f"sat up (pid {pid}) did not stop within {timeout:.0f}s")

