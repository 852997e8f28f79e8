"""A local RFC 3161 time-stamping authority for the tests: a throwaway CA, a TSA
certificate (extendedKeyUsage timeStamping, critical) signed by it, and a small HTTP
server answering each timestamp query with ``openssl ts -reply``. No outside service is
reachable here, and a real TSA's answer is what the anchors must hold up against.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.services import REQUIRE_SERVICES

OPENSSL_TS_CONFIG = """\
[ tsa ]
default_tsa = tsa_config

[ tsa_config ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.pem
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = 1.3.6.1.4.1.99999.1
digests = sha256, sha384, sha512
accuracy = secs:1
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""
"""No ``certs`` line: only the signer's certificate goes into a token. OpenSSL does not
sort a SignedData's certificate SET, and rfc3161-client's strict DER reader refuses an
unsorted one (InvalidSetOrdering)."""


@dataclass(frozen=True)
class LocalTsa:
    url: str
    ca_file: Path
    """The CA's certificate (PEM): what ``--tsa-ca`` is given."""
    other_ca_file: Path
    """A CA that did not sign the TSA's certificate."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    else:
        usage = x509.KeyUsage(True, True, False, False, False, False, False, False, False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True
        )
    builder = builder.add_extension(usage, critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def make_tsa_files(directory: Path) -> Path:
    """CA, TSA key and certificate, serial and the openssl config; returns the config."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    tsa_key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("jobledger test CA", ca_key, "jobledger test CA", ca_key, ca=True)
    tsa = _certificate("jobledger test TSA", tsa_key, "jobledger test CA", ca_key, ca=False)
    other = _certificate("another CA", other_key, "another CA", other_key, ca=True)
    (directory / "ca.pem").write_bytes(_pem(ca))
    (directory / "other-ca.pem").write_bytes(_pem(other))
    (directory / "tsa.pem").write_bytes(_pem(tsa))
    (directory / "tsa.key").write_bytes(
        tsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "serial").write_text("01\n")
    config = directory / "openssl-ts.cnf"
    config.write_text(OPENSSL_TS_CONFIG.format(dir=directory))
    return config


def _handler(directory: Path, config: Path) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # openssl ts bumps the serial file: one reply at a time

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.headers.get("Content-Type") != "application/timestamp-query":
                self.send_error(415, "expected application/timestamp-query")
                return
            query = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                (directory / "query.tsq").write_bytes(query)
                replied = subprocess.run(
                    [
                        *("openssl", "ts", "-reply", "-config", str(config)),
                        *("-queryfile", str(directory / "query.tsq")),
                        *("-out", str(directory / "reply.tsr")),
                    ],
                    capture_output=True,
                )
                reply = (directory / "reply.tsr").read_bytes() if replied.returncode == 0 else b""
            if replied.returncode != 0:
                self.send_error(500, replied.stderr.decode(errors="replace")[-200:])
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/timestamp-reply")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="session")
def local_tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTsa]:
    if shutil.which("openssl") is None:
        message = "the local TSA needs the openssl command (OpenSSL 3)"
        if REQUIRE_SERVICES:
            pytest.fail(message)
        pytest.skip(message)
    directory = tmp_path_factory.mktemp("tsa")
    config = make_tsa_files(directory)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(directory, config))
    thread = threading.Thread(target=server.serve_forever, name="test-tsa", daemon=True)
    thread.start()
    try:
        yield LocalTsa(
            url=f"http://127.0.0.1:{server.server_address[1]}/tsa",
            ca_file=directory / "ca.pem",
            other_ca_file=directory / "other-ca.pem",
        )
    finally:
        server.shutdown()
        server.server_close()
