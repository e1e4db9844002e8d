"""A certificate authority of the deployment's own, and server certificates it signs (the embedded registry's TLS).

`ensure_ca(folder)` makes the CA once (a 0600 key beside its certificate, in a 0700 folder),
`server_certificate(folder, ca, hosts)` signs a certificate for loopback names. podman trusts
the CA through a `--cert-dir` folder (`[sat] registry_ca_file`), never through the machine's
trust store: nothing global is edited.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

CA_DAYS = 3650
SERVER_DAYS = 825  # what browsers and Go's TLS stack accept for a server certificate


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    certificate: Path
    key: Path


def _private_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _write_certificate(path: Path, certificate) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


def ensure_ca(folder: Path, name: str = "SAT deployment CA") -> KeyPair:
    """The deployment's CA under `folder` (made on the first call, kept after)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    pair = KeyPair(folder / "ca.crt", folder / "ca.key")
    if pair.certificate.exists() and pair.key.exists():
        return pair
    key = _private_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .sign(key, _sha256()))
    _write_key(pair.key, key)
    _write_certificate(pair.certificate, certificate)
    return pair


def server_certificate(folder: Path, ca: KeyPair, hosts: list[str], name: str = "server") -> KeyPair:
    """A server certificate for `hosts` (DNS names or IP addresses), signed by `ca`, under `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    ca_certificate = x509.load_pem_x509_certificate(ca.certificate.read_bytes())
    key = _private_key()
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
                   .issuer_name(ca_certificate.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .sign(ca_key, _sha256()))
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    _write_key(pair.key, key)
    _write_certificate(pair.certificate, certificate)
    return pair


def _sha256():
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()
