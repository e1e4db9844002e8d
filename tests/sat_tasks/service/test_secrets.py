"""The deployment's secrets: generated once, kept 0600, the same on every restart, never shown."""

from __future__ import annotations

import json
import stat

from sat_tasks.service import secrets as service_secrets


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_once_private_and_kept_across_restarts(tmp_path):
    home = tmp_path / "home"
    first = service_secrets.load_or_create(home)
    kept = home / service_secrets.SECRETS_FILE
    passwords = home / service_secrets.PASSWORDS_FILE
    assert _mode(kept) == 0o600 and _mode(passwords) == 0o600
    assert json.loads(passwords.read_text()) == {"admin": first.admin_password}
    assert len({first.jwt_secret, first.fernet_key, first.api_secret_key, first.admin_password}) == 4

    again = service_secrets.load_or_create(home)
    assert again == first  # a restart reads them back: task tokens and encrypted connections stay valid

    other = service_secrets.load_or_create(tmp_path / "other")
    assert other.jwt_secret != first.jwt_secret  # random per deployment, not a shipped constant


def test_fernet_key_encrypts(tmp_path):
    from cryptography.fernet import Fernet

    kept = service_secrets.load_or_create(tmp_path)
    f = Fernet(kept.fernet_key.encode())
    assert f.decrypt(f.encrypt(b"registry password")) == b"registry password"


def test_loosened_file_is_tightened_again(tmp_path):
    service_secrets.load_or_create(tmp_path)
    kept = tmp_path / service_secrets.SECRETS_FILE
    kept.chmod(0o644)
    service_secrets.load_or_create(tmp_path)
    assert _mode(kept) == 0o600


def test_repr_and_env_show_no_value_in_repr(tmp_path):
    kept = service_secrets.load_or_create(tmp_path)
    assert kept.admin_password not in repr(kept) and kept.jwt_secret not in repr(kept)
    env = service_secrets.component_env(kept, tmp_path)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"  # authentication stays on
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == kept.jwt_secret
    assert env["AIRFLOW__CORE__FERNET_KEY"] == kept.fernet_key


def test_the_object_storage_secret_is_generated_kept_and_added_to_an_older_deployment(tmp_path):
    """ADR 0037: the embedded store's service secret is one of the kept secrets, random per deployment."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    older = {"jwt_secret": "j", "fernet_key": "f", "api_secret_key": "a", "admin_password": "p", "db_password": "d"}
    (home / service_secrets.SECRETS_FILE).write_text(json.dumps(older))  # made before the store's secret existed
    first = service_secrets.load_or_create(home)
    assert len(first.object_storage_secret) >= 32 and first.jwt_secret == "j"  # added; the kept ones stay
    assert json.loads((home / service_secrets.SECRETS_FILE).read_text())["object_storage_secret"] == \
        first.object_storage_secret
    assert service_secrets.load_or_create(home).object_storage_secret == first.object_storage_secret
    assert service_secrets.load_or_create(tmp_path / "other").object_storage_secret != first.object_storage_secret
    assert first.object_storage_secret not in repr(first)
