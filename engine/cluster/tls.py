"""TLS between nodes, pinned through the cluster secret: no CA, nothing to manage.

Every member derives the same Ed25519 key from the secret and the same self-signed
certificate from that key (Ed25519 signatures are deterministic, the fields are fixed),
and trusts that one certificate and nothing else, as a server and as a client. So a
connection completes only between two holders of the secret: a host without it can't
pose as a member to a node that dials it (its certificate isn't the cluster's), nor
complete a handshake with a node's cluster port (it has no client certificate the node
trusts), and nothing between members crosses the network in clear. A new secret is a
new certificate; the pairing code still names the secret."""

from __future__ import annotations

import datetime
import functools
import os
import secrets
import ssl
import tempfile

CN = "Shoal cluster"


@functools.lru_cache(maxsize=4)
def cluster_certificate(secret: str) -> tuple[bytes, bytes]:
    """(certificate PEM, private key seed) for `secret`, the same on every member."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.x509.oid import NameOID

    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"shoal cluster tls",
                info=b"ed25519 key v1").derive(secret.encode())
    key = Ed25519PrivateKey.from_private_bytes(seed)
    public = key.public_key().public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(public)  # a serial from the public half: nothing of the seed shows
    serial = int.from_bytes(digest.finalize()[:16], "big") >> 1 or 1
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CN)])
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
            .not_valid_after(datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, None))
    return cert.public_bytes(serialization.Encoding.PEM), seed


def _load_identity(ctx: ssl.SSLContext, secret: str) -> None:
    """Give `ctx` the cluster's certificate and key. Python's ssl loads a key only from a
    file, so it goes through one encrypted under a one-time password that never leaves
    this process, and the file is removed at once."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem, seed = cluster_certificate(secret)
    password = secrets.token_bytes(32)
    key = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password))
    fd, path = tempfile.mkstemp(prefix="shoal-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem + key)
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)
    ctx.load_verify_locations(cadata=pem.decode())


def server_context(secret: str) -> ssl.SSLContext:
    """The cluster port's: it serves only clients that present the cluster's certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    _load_identity(ctx, secret)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(secret: str) -> ssl.SSLContext:
    """A node's, dialling another: the other side must show the cluster's certificate
    (pinned; host names play no part, a member may be reached at any address)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    _load_identity(ctx, secret)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def user_api_context(cert: str, key: str) -> ssl.SSLContext:
    """The user API's, from the user's own certificate and key files (--tls-cert/-key)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx
