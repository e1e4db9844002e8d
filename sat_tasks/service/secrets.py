"""The deployment's secrets, generated once and kept (mode 0600) under the Airflow home.

Every Airflow component must share the same JWT secret (the scheduler's task tokens are
checked by the API server's execution API), the same Fernet key (connections are encrypted
with it), the same admin password and the embedded Object Storage's service secret (its gate
checks every request's signature with it, ADR 0037) and the embedded registry's login (ADR 0042), across restarts: generated on the first `make up`,
read back on every later one. Nothing here prints or logs a secret.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

SECRETS_FILE = "sat-secrets.json"
PASSWORDS_FILE = "simple_auth_manager_passwords.json"
ADMIN_USER = "admin"


@dataclass(frozen=True)
class DeploymentSecrets:
    """What the components share. `repr` shows no value."""

    jwt_secret: str
    fernet_key: str
    api_secret_key: str
    admin_password: str
    db_password: str = ""  # the metadata DB's role, when `sat up --db postgres` runs the cluster (service.postgres)
    object_storage_secret: str = ""  # the embedded Object Storage's service key secret (io.local_s3, ADR 0037)
    registry_password: str = ""  # the embedded registry's login (service.registry, ADR 0042)

    def __repr__(self) -> str:
        return "DeploymentSecrets(<hidden>)"


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (created 0600, never world-readable in between)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner may enter (0700), tightened if it already exists looser."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


_GENERATORS = {
    "jwt_secret": lambda: secrets.token_urlsafe(48),
    "fernet_key": lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    "api_secret_key": lambda: secrets.token_urlsafe(32),
    "admin_password": lambda: secrets.token_urlsafe(18),
    "db_password": lambda: secrets.token_urlsafe(24),
    "object_storage_secret": lambda: secrets.token_urlsafe(30),
    "registry_password": lambda: secrets.token_urlsafe(24),
}


def load_or_create(home: Path) -> DeploymentSecrets:
    """The secrets kept in `<home>/sat-secrets.json`, created (0600) when missing; the passwords file too.

    `home` itself is made private (0700): it holds these files, the metadata DB and the logs.
    """
    private_dir(home)
    path = home / SECRETS_FILE
    values: dict[str, str] = {}
    if path.exists():
        values = json.loads(path.read_text(encoding="utf-8"))
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)  # someone loosened it: tighten again
    missing = {k: make() for k, make in _GENERATORS.items() if k not in values}
    if missing:  # a new deployment, or one made before a secret was added: the kept ones stay
        values = {**values, **missing}
        _write_private(path, json.dumps(values, indent=1))
    kept = DeploymentSecrets(**{k: values[k] for k in _GENERATORS})
    _write_private(home / PASSWORDS_FILE, json.dumps({ADMIN_USER: kept.admin_password}))
    return kept


def component_env(kept: DeploymentSecrets, home: Path) -> dict[str, str]:
    """The environment every Airflow component gets: the shared secrets and authentication on."""
    return {
        "AIRFLOW__API_AUTH__JWT_SECRET": kept.jwt_secret,
        "AIRFLOW__CORE__FERNET_KEY": kept.fernet_key,
        "AIRFLOW__API__SECRET_KEY": kept.api_secret_key,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / PASSWORDS_FILE),
    }
