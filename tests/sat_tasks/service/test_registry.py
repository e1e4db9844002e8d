"""The embedded registry's files (ADR 0042): config, htpasswd, CA and certificate, the kept port, the login's
connection, and no password in any file but the secrets, any log line or any error.

Needs `htpasswd` (apache2-utils, `make system-deps`) for what hashes the login; the rest is plain files.
"""

from __future__ import annotations

import json
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from sat_tasks.service import registry as reg
from sat_tasks.service import secrets as service_secrets
from sat_tasks.service.registry import CONN_ID, USER, EmbeddedRegistry, RegistryError, config_text, htpasswd_line
from sat_tasks.service.tls import ensure_ca

PASSWORD = "reg-s3cr3t-Zq9"
needs_htpasswd = pytest.mark.skipif(shutil.which("htpasswd") is None or shutil.which("docker-registry") is None,
                                    reason="htpasswd/docker-registry not installed: `make system-deps`")


def _made(tmp_path: Path, lines: list[str], port: int = 0) -> EmbeddedRegistry:
    return EmbeddedRegistry(folder=tmp_path / "registry", password=PASSWORD, port=port,
                            certs_dir=tmp_path / "containers" / "certs.d", log=lines.append).prepare()


def _everything_written(root: Path) -> str:
    return "\n".join(p.read_bytes().decode(errors="replace") for p in root.rglob("*") if p.is_file())


def test_config_serves_loopback_with_tls_and_htpasswd(tmp_path):
    text = config_text(tmp_path, 5123, "httpsecret")
    assert "  addr: 127.0.0.1:5123" in text
    assert f'certificate: "{tmp_path / "tls" / "registry.crt"}"' in text
    assert f'key: "{tmp_path / "tls" / "registry.key"}"' in text
    assert f'path: "{tmp_path / "htpasswd"}"' in text and "htpasswd:" in text
    assert f'rootdirectory: "{tmp_path / "storage"}"' in text


@needs_htpasswd
def test_htpasswd_line_is_bcrypt_and_verifies(tmp_path):
    line = htpasswd_line(USER, PASSWORD)
    user, _, digest = line.strip().partition(":")
    assert user == USER and digest.startswith("$2") and PASSWORD not in line
    path = tmp_path / "htpasswd"
    path.write_text(line)
    right = subprocess.run(["htpasswd", "-v", "-i", str(path), USER], input=PASSWORD, capture_output=True, text=True)
    wrong = subprocess.run(["htpasswd", "-v", "-i", str(path), USER], input="nope", capture_output=True, text=True)
    assert right.returncode == 0, right.stderr
    assert wrong.returncode != 0


@needs_htpasswd
def test_prepare_writes_private_files_and_a_certificate_the_ca_signs(tmp_path):
    lines: list[str] = []
    made = _made(tmp_path, lines)
    folder = made.folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("htpasswd", "config.yml", "ca/ca.key", "tls/registry.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    config = (folder / "config.yml").read_text()
    assert f"addr: 127.0.0.1:{made.port}" in config and made.port > 0
    ca = x509.load_pem_x509_certificate((folder / "ca" / "ca.crt").read_bytes())
    served = x509.load_pem_x509_certificate((folder / "tls" / "registry.crt").read_bytes())
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    # podman trusts the CA through the project's own containers config, per registry host:port
    assert made.trust_dir == tmp_path / "containers" / "certs.d" / f"127.0.0.1:{made.port}"
    assert made.ca_file.read_bytes() == (folder / "ca" / "ca.crt").read_bytes()
    assert not list(made.trust_dir.glob("*.key"))
    # the password is in no file the registry reads, and in no log line
    assert PASSWORD not in _everything_written(tmp_path)
    assert not any(PASSWORD in line for line in lines)


@needs_htpasswd
def test_the_port_is_kept_and_moves_only_when_taken(tmp_path):
    lines: list[str] = []
    first = _made(tmp_path, lines).port
    again = _made(tmp_path, lines)
    assert again.port == first
    assert ensure_ca(again.folder / "ca").certificate.read_bytes() == again.ca_file.read_bytes()  # the CA is kept
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        holder.listen()
        moved = _made(tmp_path, lines)
    assert moved.port != first
    assert any(f"port {first} is taken" in line for line in lines)
    assert not any(PASSWORD in line for line in lines)
    assert _made(tmp_path, lines, port=first).port == first  # a configured port is used as given


@needs_htpasswd
def test_connection_env_shares_the_login_and_the_ca(tmp_path):
    made = _made(tmp_path, [])
    env = made.connection_env(shared="team_pull, other")
    conn = json.loads(env["AIRFLOW_CONN_SAT_EMBEDDED_REGISTRY"])
    assert conn["host"] == f"127.0.0.1:{made.port}" and conn["login"] == USER and conn["password"] == PASSWORD
    assert env["AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS"] == f"team_pull,other,{CONN_ID}"
    assert env["AIRFLOW__SAT__REGISTRY_CA_FILE"] == str(made.ca_file)
    assert made.connection_env(shared=CONN_ID)["AIRFLOW__SAT__SHARED_REGISTRY_CONNECTIONS"] == CONN_ID
    # an operator's own CA stays trusted: one bundle of both
    theirs = ensure_ca(tmp_path / "operator-ca", name="operator CA").certificate
    bundle = Path(made.connection_env(ca_file=str(theirs))["AIRFLOW__SAT__REGISTRY_CA_FILE"])
    assert theirs.read_bytes() in bundle.read_bytes() and made.ca_file.read_bytes() in bundle.read_bytes()
    assert PASSWORD not in repr(made)


def test_served_name_keeps_repository_and_tag():
    made = EmbeddedRegistry(folder=Path("/nonexistent"), password=PASSWORD, port=5123)
    assert made.served_name("registry.sat.local/sat/training:0.1.0") == "127.0.0.1:5123/sat/training:0.1.0"
    assert made.served_name("localhost/sat/x:2") == "127.0.0.1:5123/sat/x:2"
    assert made.served_name("team/app") == "127.0.0.1:5123/team/app:latest"
    with pytest.raises(RegistryError):
        made.served_name("registry.sat.local/sat/training@sha256:" + "0" * 64)


@needs_htpasswd
def test_a_failed_push_names_podman_words_without_the_password(tmp_path):
    lines: list[str] = []
    made = _made(tmp_path, lines)
    seen: list[list[str]] = []

    def fake_podman(args, **kwargs):
        seen.append(list(args))
        if args[0] == "image":
            return subprocess.CompletedProcess(args, 0, stdout="sha256:abc\n", stderr="")
        authfile = Path(args[args.index("--authfile") + 1])
        assert stat.S_IMODE(authfile.stat().st_mode) == 0o600
        return subprocess.CompletedProcess(args, 125, stdout="", stderr=f"Error: denied for sat:{PASSWORD}\n")

    with pytest.raises(RegistryError) as failed:
        made.push("registry.sat.local/sat/training:0.1.0", podman=fake_podman)
    assert PASSWORD not in str(failed.value) and "***" in str(failed.value)
    push = seen[-1]
    assert push[-1] == f"docker://127.0.0.1:{made.port}/sat/training:0.1.0"
    assert push[push.index("--cert-dir") + 1] == str(made.trust_dir)
    assert not any(PASSWORD in arg for arg in push)  # the login is in the 0600 auth file, not on the command line
    assert not any(PASSWORD in line for line in lines)


def test_push_without_the_image_in_the_store_pushes_nothing(tmp_path):
    made = EmbeddedRegistry(folder=tmp_path, password=PASSWORD, port=5123)

    def fake_podman(args, **kwargs):
        assert args[0] == "image", args
        return subprocess.CompletedProcess(args, 125, stdout="", stderr="image not known")

    assert made.push("registry.sat.local/sat/training:0.1.0", podman=fake_podman) is None


def test_prepare_names_what_to_install_when_the_server_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(reg.shutil, "which", lambda name: None)
    with pytest.raises(RegistryError, match="make system-deps"):
        EmbeddedRegistry(folder=tmp_path, password=PASSWORD).prepare()


def test_the_login_is_generated_once_and_kept_with_the_other_secrets(tmp_path):
    home = tmp_path / "home"
    first = service_secrets.load_or_create(home)
    assert len(first.registry_password) >= 24
    assert service_secrets.load_or_create(home).registry_password == first.registry_password
    kept = json.loads((home / service_secrets.SECRETS_FILE).read_text())
    del kept["registry_password"]  # a deployment made before the registry: the others stay, the login is added
    (home / service_secrets.SECRETS_FILE).write_text(json.dumps(kept))
    later = service_secrets.load_or_create(home)
    assert later.jwt_secret == first.jwt_secret and later.registry_password
    assert stat.S_IMODE((home / service_secrets.SECRETS_FILE).stat().st_mode) == 0o600
    assert later.registry_password not in repr(later)


def test_sat_up_runs_the_registry_unless_it_is_off_or_not_installed(monkeypatch, capsys):
    from sat_tasks.cli.up import registry_options

    monkeypatch.setenv("AIRFLOW__SAT__EMBEDDED_REGISTRY", "off")
    assert registry_options() == {"registry": False}
    monkeypatch.setenv("AIRFLOW__SAT__EMBEDDED_REGISTRY", "auto")
    monkeypatch.setenv("AIRFLOW__SAT__EMBEDDED_REGISTRY_PORT", "5123")
    monkeypatch.setattr(reg, "installed", lambda: True)
    options = registry_options()
    assert options["registry"] is True and options["registry_port"] == 5123
    monkeypatch.setattr(reg, "installed", lambda: False)
    assert registry_options() == {"registry": False}
    assert "make system-deps" in capsys.readouterr().out
