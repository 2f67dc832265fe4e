"""Prediction records bound to the service whose replica wrote them: request ids that name their
service, and batches signed with the service's key, so the Tracker refuses what another service's
replica forges.

Why: the Tracker keeps the first record per `request_id`. Every replica holds the
`predictions:write` scope, so a compromised replica that learned another service's request id (from
a log, a client, a shared gateway) could post a forged record first; the real one, arriving later
from the replica's spool, would be dropped as a re-send. With a record key, an id carries a keyed
tag: 128 random bits, then the first 64 bits of HMAC-SHA256(service key, random bits). The service
key is derived from the stack's record key and the service name, so a replica holds only its own
service's key. A replica also signs each batch it posts (HMAC of the body, its service named in a
header). The Tracker, holding the record key, checks the signature against the named service, that
every record in the batch is that service's, and that each id was issued for it: another service's
replica can neither claim an id under the victim's service (it cannot sign for it) nor under its own
(the id's tag is the victim service's). The tag adds nothing guessable: the random part is still
128 bits. Replicas of one service share its key: the binding is per service, not per replica.

Who holds what: the Tracker and the Executor hold the record key (`SCANFLOW_RECORD_KEY`, hex); the
Executor's platform gives each replica its service's key (`SCANFLOW_SERVICE_RECORD_KEY`) and never
the record key itself. Without a record key ids are 128 random bits, as before, and the Tracker
checks nothing (a setup that has not minted one keeps working).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

RECORD_KEY_ENV = "SCANFLOW_RECORD_KEY"  # the Tracker's and the Executor's (hex)
SERVICE_RECORD_KEY_ENV = "SCANFLOW_SERVICE_RECORD_KEY"  # a replica's: its service's key (hex)
_RANDOM_BYTES = 16
_TAG_BYTES = 8
TAGGED_LENGTH = 2 * (_RANDOM_BYTES + _TAG_BYTES)  # hex characters of a tagged id


class RecordKeyError(ValueError):
    """A record key that is not hex, or too short (the message never holds the key)."""


def parse_key(text: str, name: str) -> bytes:
    """A key from its hex form; RecordKeyError naming the variable when it is not 32+ bytes of hex."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise RecordKeyError(f"{name} must be hex") from None
    if len(key) < 32:
        raise RecordKeyError(f"{name} must hold at least 32 bytes (64 hex digits)")
    return key


def new_record_key() -> str:
    """A fresh record key, hex (what a stack mints at start)."""
    return secrets.token_hex(32)


def service_key(record_key: bytes, service: str) -> bytes:
    """The key of `service`'s replicas, derived from the record key (one-way: it reveals neither the
    record key nor another service's key)."""
    return hmac.new(record_key, b"scanflow-record-id\0" + service.encode(), hashlib.sha256).digest()


def _tag(key: bytes, random_part: bytes) -> bytes:
    return hmac.new(key, random_part, hashlib.sha256).digest()[:_TAG_BYTES]


def new_request_id(key: bytes | None) -> str:
    """A fresh unguessable id: 128 random bits, tagged with `key` (a service key) when given."""
    random_part = secrets.token_bytes(_RANDOM_BYTES)
    if key is None:
        return random_part.hex()
    return (random_part + _tag(key, random_part)).hex()


def issued_for(request_id: str, service: str, record_key: bytes) -> bool:
    """Whether `request_id` was issued by a replica holding `service`'s key. Constant-time compare."""
    if len(request_id) != TAGGED_LENGTH:
        return False
    try:
        raw = bytes.fromhex(request_id)
    except ValueError:
        return False
    random_part, tag = raw[:_RANDOM_BYTES], raw[_RANDOM_BYTES:]
    return hmac.compare_digest(tag, _tag(service_key(record_key, service), random_part))


SERVICE_HEADER = "X-Scanflow-Service"  # the service a signed batch of records belongs to
SIGNATURE_HEADER = "X-Scanflow-Record-Signature"  # hex HMAC-SHA256(service key, body)


def sign_batch(key: bytes, body: bytes) -> str:
    """The signature a replica holding `key` (its service's) sends with a batch `body`."""
    return hmac.new(key, b"scanflow-records\0" + body, hashlib.sha256).hexdigest()


def batch_signed_by(record_key: bytes, service: str, body: bytes, signature: str) -> bool:
    """Whether `signature` over `body` was made with `service`'s key. Constant-time compare."""
    return hmac.compare_digest(signature.encode(), sign_batch(service_key(record_key, service), body).encode())
