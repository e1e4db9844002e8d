"""A private PostgreSQL cluster as the metadata DB of `sat up --db postgres`, from Debian's `postgresql` package.

Call order: `PostgresCluster(...)` -> `start()` (initdb on the first start, a leftover
server of a crashed `sat up` stopped, the server started and waited for, the `airflow`
database created) -> `url()` for Airflow's `[database] sql_alchemy_conn` -> `stop()`.

The server listens on 127.0.0.1 only, on `port` (0: a free one at each start), with no
unix socket, and asks for a password (scram-sha-256) of its one role `sat`: the
deployment's generated `db_password` (`service.secrets`, kept 0600 with the others). The
password reaches initdb through a 0600 file removed at once, and the components through
their environment (`url()`); it is never logged, and `repr` hides it.

Where the cluster lives: `<home>/postgres/data`, made by the user who runs `sat up`. The
server refuses to run as root, so when `sat up` runs as root the server runs as Debian's
`postgres` account, whose files cannot live under a home only root may enter (`<home>` is
0700): the cluster is then `<postgres account home>/sat/<digest of home>/data`
(`/var/lib/postgresql/sat/...`), named in the server's log line, one per deployment home.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from sat_tasks.core import procs
from sat_tasks.errors import SatError

DB_NAME = "airflow"
DB_USER = "sat"
SERVER_ACCOUNT = "postgres"  # Debian's account for the server, used when `sat up` runs as root
SERVER_LOG = "postgres.log"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")


class PostgresError(SatError):
    """The cluster could not be made, started or reached; the message says why and where its log is."""


def server_binaries(root: Path = DEBIAN_BINARIES) -> Path:
    """The directory holding `initdb` and `postgres`: Debian's newest `/usr/lib/postgresql/<v>/bin`, else PATH's."""
    versions = sorted((p for p in root.glob("*/bin") if (p / "initdb").is_file() and (p / "postgres").is_file()),
                      key=lambda p: _version_key(p.parent.name))
    if versions:
        return versions[-1]
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").is_file():
        return Path(found).resolve().parent
    raise PostgresError("PostgreSQL's server is not installed (no initdb/postgres in /usr/lib/postgresql/*/bin "
                        "or on PATH): `make system-deps` installs Debian's postgresql package")


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit()) or (0,)


def cluster_dir(home: Path, as_root: bool | None = None) -> Path:
    """Where the cluster of the deployment at `home` lives (see the module docstring)."""
    if not (os.geteuid() == 0 if as_root is None else as_root):
        return home / "postgres"
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
    return Path(pwd.getpwnam(SERVER_ACCOUNT).pw_dir) / "sat" / digest


@dataclass
class PostgresCluster:
    """One deployment's PostgreSQL server.

    Args:
        home: the deployment's Airflow home (its cluster: `cluster_dir(home)`).
        password: the role's password (`DeploymentSecrets.db_password`); never shown.
        logs_dir: where `postgres.log` goes (the service's log folder).
        port: the loopback port (0: a free one, chosen at each start).
    """

    home: Path
    password: str = field(repr=False)
    logs_dir: Path
    port: int = 0
    log: object = print
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def directory(self) -> Path:
        return cluster_dir(self.home)

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_file(self) -> Path:
        return self.logs_dir / SERVER_LOG

    def url(self) -> str:
        """Airflow's `sql_alchemy_conn` for this cluster (holds the password: never printed)."""
        secret = urllib.parse.quote(self.password, safe="")
        return f"postgresql+psycopg2://{DB_USER}:{secret}@127.0.0.1:{self.port}/{DB_NAME}"

    def describe(self) -> str:
        """Where it is, for a log line (no password)."""
        return f"PostgreSQL on 127.0.0.1:{self.port}, database {DB_NAME}, cluster in {self.data_dir}"

    # ---- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 120) -> PostgresCluster:
        """Make the cluster if it is new, start its server and wait until the `airflow` database answers."""
        binaries = server_binaries()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(binaries)
        self._stop_leftover()
        if not self.port:
            from sat_tasks.io.local_s3 import free_port

            self.port = free_port()
        args = [str(binaries / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                "-c", "max_connections=200", "-c", "logging_collector=off"]
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self._server_env(), start_new_session=True, **self._account())
        self._await_ready(timeout)
        self._ensure_database()
        return self

    def _account(self) -> dict:
        """Popen's user/group when the server cannot run as this user (root)."""
        if os.geteuid() != 0:
            return {}
        return {"user": SERVER_ACCOUNT, "group": pwd.getpwnam(SERVER_ACCOUNT).pw_gid, "extra_groups": []}

    def _server_env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        if os.geteuid() == 0:
            env["HOME"] = pwd.getpwnam(SERVER_ACCOUNT).pw_dir
        return env

    def _own(self, path: Path) -> None:
        """`path` private to the account the server runs as."""
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_ACCOUNT)
            os.chown(path, account.pw_uid, account.pw_gid)

    def _initdb(self, binaries: Path) -> None:
        self._own(self.directory)
        if os.geteuid() == 0:
            (self.directory / "deployment").write_text(f"the metadata DB of the SAT deployment at {self.home}\n")
        pwfile = self.directory / ".initdb-password"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(self.password + "\n")
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_ACCOUNT)
            os.chown(pwfile, account.pw_uid, account.pw_gid)
        self.log(f"[sat] creating the metadata DB's PostgreSQL cluster in {self.data_dir} ...")
        try:
            with open(self.log_file, "ab") as out:
                done = subprocess.run(
                    [str(binaries / "initdb"), "-D", str(self.data_dir), "-U", DB_USER, f"--pwfile={pwfile}",
                     "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C"],
                    check=False, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self._server_env(), **self._account())
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise PostgresError(f"initdb failed (status {done.returncode}); see {self.log_file}")

    def _stop_leftover(self) -> None:
        """A server a crashed `sat up` left running on this cluster: stopped (fast shutdown) before ours starts."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().splitlines()[0])
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if b"postgres" not in handle.read().split(b"\0")[0]:
                    return
        except (OSError, ValueError, IndexError):
            return  # none, or its pid is gone: the server removes a stale lock file itself
        self.log(f"[sat] stopping a PostgreSQL server left running on {self.data_dir} (pid {pid})")
        _stop_pid(pid, grace=30)

    def _await_ready(self, timeout: float) -> None:
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise PostgresError(f"the PostgreSQL server exited with status {self.process.returncode}; "
                                    f"see {self.log_file}")
            try:
                psycopg2.connect(**self._connect_args("postgres"), connect_timeout=2).close()
                return
            except psycopg2.OperationalError as exc:
                if "password authentication failed" in str(exc):
                    raise PostgresError(f"the cluster in {self.data_dir} refuses the deployment's db_password "
                                        "(was the secrets file replaced?)") from None
                if time.monotonic() > deadline:
                    raise PostgresError(f"the PostgreSQL server did not answer on 127.0.0.1:{self.port} within "
                                        f"{timeout:.0f}s; see {self.log_file}") from None
            time.sleep(0.2)

    def _connect_args(self, dbname: str) -> dict:
        return {"host": "127.0.0.1", "port": self.port, "user": DB_USER, "password": self.password, "dbname": dbname}

    def _ensure_database(self) -> None:
        import psycopg2

        connection = psycopg2.connect(**self._connect_args("postgres"))
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{DB_NAME}" ENCODING \'UTF8\'')
        finally:
            connection.close()

    # ---- stop -----------------------------------------------------------------------------------
    def stop(self, grace: float = 30) -> None:
        """Fast shutdown (SIGINT: clients disconnected, a clean checkpoint); SIGKILL after `grace`."""
        if self.process is None:
            return
        _stop_pid(self.process.pid, grace, self.process)
        self.process = None

    def remove(self) -> None:
        """Delete the cluster's files (tests; the server must be stopped)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _stop_pid(pid: int, grace: float, process: subprocess.Popen | None = None) -> None:
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if (process.poll() is not None) if process is not None else procs.state_of(pid) is None:
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process is not None:
        process.wait(timeout=10)
