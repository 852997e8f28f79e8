"""RFC 3161 timestamps of anchors: a third party (a time-stamping authority) signs that an
anchor's Merkle root existed at a time, so neither the store's operator nor the anchor
destination's can backdate or rewrite it unnoticed.

The message imprint is SHA-256 over the 32 raw bytes of the Merkle root. A stamp is asked
for with a nonce and the TSA's certificate; its answer must be granted and echo the
imprint and the nonce, and, given the TSA's CA, be signed by a time-stamping certificate
chaining to it. The token (the DER TimeStampToken, base64) goes into the anchor line as
``"rfc3161": {"tsa": URL, "token": ...}``.

Requests, responses and signature checks use the ``rfc3161-client`` package (the
``audit`` extra). One part is by hand: that package parses only whole responses, so a
stored token is wrapped back into a granted TimeStampResp (a few DER bytes) to be read.
"""

from __future__ import annotations

import base64
import hashlib
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from jobledger.audit.anchors import AnchorLog, AnchorSink, StampCheck, TimeStamp, parse_line
from jobledger.audit.errors import TimeStampError
from jobledger.domain.errors import ConfigError

if TYPE_CHECKING:
    from cryptography.x509 import Certificate
    from rfc3161_client import TimeStampResponse

QUERY_TYPE: Final = "application/timestamp-query"
SHA256_OID: Final = "2.16.840.1.101.3.4.2.1"
GRANTED_STATUS: Final = b"\x30\x03\x02\x01\x00"
"""DER of PKIStatusInfo { status granted(0) }."""


def imprint(merkle_root: str) -> bytes:
    """The message imprint of an anchor: SHA-256 of the root's 32 raw bytes."""
    return hashlib.sha256(bytes.fromhex(merkle_root)).digest()


@dataclass(frozen=True)
class TsaTrust:
    """The certificates a token's signature must chain to (a PEM file: self-signed ones
    are roots, the others intermediates)."""

    roots: tuple[Certificate, ...]
    intermediates: tuple[Certificate, ...]

    @classmethod
    def load(cls, path: Path) -> TsaTrust:
        from cryptography.x509 import load_pem_x509_certificates

        try:
            certificates = load_pem_x509_certificates(path.read_bytes())
        except (OSError, ValueError) as error:
            raise ConfigError(f"TSA CA file {str(path)!r}: {error}") from None
        roots = tuple(c for c in certificates if c.issuer == c.subject)
        if not roots:
            raise ConfigError(f"TSA CA file {str(path)!r} holds no self-signed (root) certificate")
        return cls(roots, tuple(c for c in certificates if c.issuer != c.subject))

    def check(self, response: TimeStampResponse, digest: bytes, nonce: int | None = None) -> None:
        """Raise VerificationError unless ``response`` is granted, signed by a
        time-stamping certificate chaining to these roots, for ``digest`` (and ``nonce``)."""
        from rfc3161_client import VerifierBuilder

        builder = VerifierBuilder(
            roots=list(self.roots), intermediates=list(self.intermediates), nonce=nonce
        )
        builder.build().verify(response, digest)


def require_client() -> None:
    """Refuse clearly when the ``audit`` extra is not installed."""
    try:
        import rfc3161_client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "RFC 3161 timestamps need the rfc3161-client package: pip install 'jobledger[audit]'"
        ) from None


class TimeStampAuthority:
    """An RFC 3161 TSA reached over HTTP."""

    def __init__(self, url: str, trust: TsaTrust | None = None, timeout: float = 30) -> None:
        require_client()
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"TSA URL {url!r} must start with http:// or https://")
        self.url = url
        self.trust = trust
        self.timeout = timeout

    def stamp(self, merkle_root: str) -> TimeStamp:
        """A checked token over ``merkle_root``, or TimeStampError."""
        from rfc3161_client import (
            HashAlgorithm,
            TimestampRequestBuilder,
            VerificationError,
            decode_timestamp_response,
        )

        request = (
            TimestampRequestBuilder()
            .data(bytes.fromhex(merkle_root))
            .hash_algorithm(HashAlgorithm.SHA256)
            .nonce(nonce=True)
            .cert_request(cert_request=True)
            .build()
        )
        answer = self._post(request.as_bytes())
        try:
            response = decode_timestamp_response(answer)
        except ValueError as error:
            raise TimeStampError(f"TSA {self.url} answered with no timestamp: {error}") from None
        if response.status != 0:
            why = "; ".join(response.status_string) or "no reason given"
            raise TimeStampError(f"TSA {self.url} refused (status {response.status}): {why}")
        info = response.tst_info
        if info.message_imprint.message != imprint(merkle_root):
            raise TimeStampError(f"TSA {self.url} stamped another imprint than the one asked")
        if info.nonce != request.nonce:
            raise TimeStampError(f"TSA {self.url} answered with another nonce (a replay?)")
        if self.trust is not None:
            try:
                self.trust.check(response, imprint(merkle_root), request.nonce)
            except VerificationError as error:
                raise TimeStampError(
                    f"TSA {self.url}: its token does not verify: {error}"
                ) from None
        token = base64.b64encode(response.time_stamp_token()).decode()
        return TimeStamp(self.url, token)

    def _post(self, body: bytes) -> bytes:
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": QUERY_TYPE}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return bytes(answer.read())
        except urllib.error.HTTPError as error:
            raise TimeStampError(f"TSA {self.url} answered HTTP {error.code}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TimeStampError(f"cannot reach TSA {self.url}: {reason}") from None


class StampingSink:
    """Stamps each anchor line's Merkle root at a TSA, then hands the line (with its
    ``rfc3161`` token) to the destination: a line the TSA would not stamp goes nowhere."""

    def __init__(self, inner: AnchorSink, tsa: TimeStampAuthority) -> None:
        self.inner = inner
        self.tsa = tsa
        self.name = inner.name
        self.last_stamp: TimeStamp | None = None

    def last_line(self) -> str | None:
        return self.inner.last_line()

    def lines(self) -> list[str]:
        return self.inner.lines()

    def append(self, line: str) -> None:
        anchor = parse_line(line)
        stamp = self.tsa.stamp(anchor.merkle_root)
        self.inner.append(replace(anchor, rfc3161=stamp).to_line())
        self.last_stamp = stamp


# ---- checking the tokens of an anchor log ------------------------------------------------


def check_stamps(log: AnchorLog, trust: TsaTrust | None) -> AnchorLog:
    """Check every anchor's token: its imprint is the root beside it, and (given
    ``trust``) its signature chains to the TSA's CA. Each failure is an anchor problem."""
    if any(anchor.rfc3161 is not None for anchor in log.anchors):
        require_client()
    checks = tuple(
        _check(anchor.line_number, anchor.merkle_root, anchor.rfc3161, trust)
        for anchor in log.anchors
        if anchor.rfc3161 is not None
    )
    problems = tuple(
        f"{log.source} line {check.line_number}: RFC 3161 token: {check.problem}"
        for check in checks
        if check.problem is not None
    )
    return replace(log, problems=log.problems + problems, stamps=checks)


def _check(number: int, root: str, stamp: TimeStamp, trust: TsaTrust | None) -> StampCheck:
    from rfc3161_client import VerificationError, decode_timestamp_response

    def failed(problem: str, gen_time: datetime | None = None) -> StampCheck:
        return StampCheck(number, stamp.tsa, gen_time, trust is not None, problem)

    try:
        token = base64.b64decode(stamp.token, validate=True)
        response = decode_timestamp_response(_granted_response(token))
        info = response.tst_info
        algorithm, message, gen_time = (
            info.message_imprint.hash_algorithm.dotted_string,
            info.message_imprint.message,
            info.gen_time,
        )
    except ValueError as error:
        return failed(f"does not parse ({error}): it was edited")
    if algorithm != SHA256_OID or message != imprint(root):
        return failed("stamps another Merkle root than this anchor's", gen_time)
    if trust is not None:
        try:
            trust.check(response, message)
        except VerificationError as error:
            return failed(f"its signature does not verify against the TSA CA: {error}", gen_time)
    return StampCheck(number, stamp.tsa, gen_time, trust is not None)


def _granted_response(token: bytes) -> bytes:
    """TimeStampResp { status granted, token }: what rfc3161-client can parse."""
    body = GRANTED_STATUS + token
    return b"\x30" + _der_length(len(body)) + body


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    octets = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets
