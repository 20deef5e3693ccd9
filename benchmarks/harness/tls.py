"""The TLS workloads' certificates and contexts: TLS 1.3, an RSA-2048 key.

The certificates come from trustme (a CA and a certificate for
``localhost`` and ``127.0.0.1`` it signs), RSA-2048
(trustme's default is ECDSA, whose handshake costs the server less).  A run
makes them once (:func:`ensure`: RSA key generation takes a fraction of a
second, and under valgrind far longer) into a temporary folder named by
``BENCHMARKS_TLS_DIR``, which every child inherits through
benchmarks.harness.processes; the servers and clients load them from there
(:func:`server_context`, :func:`client_context`).

Both sides allow TLS 1.3 only, so every loop and floor negotiates the same
cipher suite (OpenSSL's first, TLS_AES_256_GCM_SHA384).  The server keeps
OpenSSL's default of two session tickets per handshake, as a deployed server
does; the clients never resume a session (asyncio's create_connection passes
no session), so ``tls-churn`` makes a full handshake per connection.
"""

from __future__ import annotations

import atexit
import os
import shutil
import ssl
import sys
import tempfile
from pathlib import Path

#: The environment variable naming the folder of the certificates.
ENV = "BENCHMARKS_TLS_DIR"
#: The name the server's certificate is for, and the clients check.
HOSTNAME = "localhost"
CA_FILE = "ca.pem"
SERVER_FILE = "server.pem"  # the private key, then the certificate chain


def ensure() -> Path:
    """The folder of the certificates, made (and named in ``os.environ`` for
    the children) on the first call of the process; removed at exit."""
    folder = os.environ.get(ENV)
    if folder and (Path(folder) / SERVER_FILE).is_file():
        return Path(folder)
    made = Path(tempfile.mkdtemp(prefix="benchmarks-tls-"))
    atexit.register(shutil.rmtree, made, True)
    make(made)
    os.environ[ENV] = str(made)
    return made


def make(folder: Path) -> None:
    """Write a CA and a server certificate it signs, RSA-2048, to *folder*."""
    import trustme  # the bench extra; imported here: the plaintext workloads do not need it

    ca = trustme.CA(key_type=trustme.KeyType.RSA)  # RSA-2048
    cert = ca.issue_cert(HOSTNAME, "127.0.0.1", key_type=trustme.KeyType.RSA)
    ca.cert_pem.write_to_path(str(folder / CA_FILE))
    cert.private_key_and_cert_chain_pem.write_to_path(str(folder / SERVER_FILE))


def missing() -> str | None:
    """Why the TLS workloads cannot run here, or None."""
    try:
        import trustme  # noqa: F401
    except ImportError:
        if sys.implementation.name != "cpython":  # pyproject.toml's bench extra
            return ("the TLS workloads need trustme for their certificates; the bench extra "
                    f"leaves it out on {sys.implementation.name}, where the cryptography it "
                    "needs has no wheel")
        return "the TLS workloads need trustme for their certificates (pip install trustme)"
    return None


def _folder() -> Path:
    folder = os.environ.get(ENV)
    if not folder:
        raise LookupError(f"{ENV} is not set: the runner makes the certificates "
                          "(benchmarks.harness.tls.ensure) before it starts a TLS child")
    return Path(folder)


def server_context() -> ssl.SSLContext:
    """The servers' context: TLS 1.3 only, the RSA-2048 certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(str(_folder() / SERVER_FILE))
    return ctx


def client_context() -> ssl.SSLContext:
    """The clients' context: TLS 1.3 only, verifying the server against the CA."""
    ctx = ssl.create_default_context(cafile=str(_folder() / CA_FILE))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx
