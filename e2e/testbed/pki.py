"""Certificates, keys and kubeconfigs for the local control plane.

One CA signs everything: the API server's serving certificate, the admin client certificate
(``O=system:masters``) and the serving certificate Kueue's webhooks present on 127.0.0.1. The
service-account signing key is a separate RSA key, as kube-apiserver requires.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)
LOCAL_IPS = ("127.0.0.1",)
LOCAL_NAMES = ("localhost",)


@dataclass(frozen=True)
class CertPair:
    """A certificate and its key on disk (PEM)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPki:
    """Every credential file the test bed writes, under one folder."""

    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    webhook: CertPair
    sa_key: Path
    sa_pub: Path


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _make_ca(folder: Path) -> tuple[CertPair, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("specdeploy-testbed-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(folder / "ca.crt", folder / "ca.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair, key, cert


def _issue(
    folder: Path,
    stem: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    common_name: str,
    organization: str | None = None,
    server: bool = False,
    client: bool = False,
) -> CertPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOCAL_IPS
        ]
        sans += [x509.DNSName(n) for n in (*LOCAL_NAMES, common_name)]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(folder / f"{stem}.crt", folder / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def create_cluster_pki(folder: Path) -> ClusterPki:
    """Write a fresh CA, the serving and client certificates and the service-account key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, ca_cert = _make_ca(folder)
    apiserver = _issue(
        folder,
        "apiserver",
        ca_key,
        ca_cert,
        common_name="kubernetes",
        server=True,
    )
    admin = _issue(
        folder,
        "admin",
        ca_key,
        ca_cert,
        common_name="specdeploy-admin",
        organization="system:masters",
        client=True,
    )
    webhook = _issue(folder, "webhook", ca_key, ca_cert, common_name="kueue-webhook", server=True)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key = folder / "sa.key"
    sa_pub = folder / "sa.pub"
    _write_key(sa, sa_key)
    sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return ClusterPki(
        ca=ca, apiserver=apiserver, admin=admin, webhook=webhook, sa_key=sa_key, sa_pub=sa_pub
    )


def write_kubeconfig(path: Path, server: str, ca: Path, client: CertPair, user: str) -> None:
    """Write a kubeconfig with absolute paths to the CA and the client certificate."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "specdeploy-testbed",
                "cluster": {"server": server, "certificate-authority": str(ca.resolve())},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(client.cert.resolve()),
                    "client-key": str(client.key.resolve()),
                },
            }
        ],
        "contexts": [
            {
                "name": "specdeploy-testbed",
                "context": {"cluster": "specdeploy-testbed", "user": user},
            }
        ],
        "current-context": "specdeploy-testbed",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
