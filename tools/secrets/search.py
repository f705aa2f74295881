"""What the secrets check searches for: each secret in every encoding that could carry it
(:func:`secret_forms`), the shapes of the credentials stored only as hashes (:data:`PATTERNS`),
and the streaming search that records a :class:`Finding` per secret, form and location
(:class:`Check`, :class:`Search`)."""
from __future__ import annotations

import base64
import html
import json
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, quote_plus

from infra.console_sim.console.sessions import COOKIE
from jobsapi.auth import TOKEN_PREFIX, hash_token

CHUNK_BYTES = 8 << 20
MIN_SECRET_CHARS = 8            # shorter ones would match by chance; listed as not searched
MAX_OFFSETS = 5                 # offsets kept per finding (all are counted)
MAX_INFLATE_BYTES = 1 << 30     # per compressed value: a zlib bomb is searched this far
_URLSAFE = b"A-Za-z0-9_-"
_URLSAFE_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# (kind, regex whose group 1 is the credential) for the secrets that are stored only hashed.
# No look-behind: it would cost the regex its literal-prefix scan, which is what keeps it fast
# on binary data; the byte before a match is checked in code instead.
PATTERNS = (
    ("api_token", re.compile(rb"(%s[%s]{43})(?![%s])"
                             % (TOKEN_PREFIX.encode(), _URLSAFE, _URLSAFE))),
    ("console_session", re.compile(rb"%s=([%s]{43})(?![%s])"
                                   % (COOKIE.encode(), _URLSAFE, _URLSAFE))),
)


@dataclass(frozen=True)
class Secret:
    """One value that must not appear: ``kind`` (password, access_key_secret, api_token,
    extra) and ``owner`` (the account id, ``api token #n``), never shown with its value."""

    kind: str
    owner: str
    value: str = field(repr=False)


@dataclass
class Finding:
    kind: str
    owner: str
    form: str           # raw, percent, json, html, base64 (or "shape" for a hashed credential)
    place: str          # run, logs, redis, sqlite, metrics
    location: str
    offsets: list[int] = field(default_factory=list)
    count: int = 0


def secret_forms(value: str) -> dict[bytes, str]:
    """The byte strings that betray ``value``, each with its form's name."""
    forms: dict[bytes, str] = {}

    def add(text: str | bytes, form: str) -> None:
        data = text.encode() if isinstance(text, str) else text
        if len(data) >= MIN_SECRET_CHARS:
            forms.setdefault(data, form)

    add(value, "raw")
    for encoded in (quote(value, safe=""), quote_plus(value, safe="")):
        add(encoded, "percent")
        add(re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), encoded), "percent")
    for ascii_only in (True, False):
        escaped = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        add(escaped, "json")
        add(escaped.replace("/", "\\/"), "json")
    add(html.escape(value, quote=True), "html")
    raw = value.encode()
    for k in range(3):  # the secret after k other bytes: keep the characters it alone fixes
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b"\0" * k + raw).rstrip(b"=")
            add(text[-(-8 * k // 6):8 * (k + len(raw)) // 6], "base64")
    return forms


class Check:
    """The needles, the credential shapes and the findings of one run of the check."""

    def __init__(self, secrets: list[Secret], known_hashes: dict[str, str] | None = None):
        self.secrets = secrets
        self.needles: list[tuple[bytes, int, str]] = []
        for i, secret in enumerate(secrets):
            self.needles += [(data, i, form) for data, form in secret_forms(secret.value).items()]
        self.needles.sort(key=lambda n: -len(n[0]))
        self.known_hashes = dict(known_hashes or {})    # sha256 -> who (token id, account)
        self.overlap = max([len(n[0]) for n in self.needles] + [128]) - 1
        self.findings: dict[tuple, Finding] = {}
        self.scanned: dict[str, dict[str, int]] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []

    def count(self, place: str, what: str, n: int = 1) -> None:
        counts = self.scanned.setdefault(place, {})
        counts[what] = counts.get(what, 0) + n

    def hit(self, kind: str, owner: str, form: str, place: str, location: str,
            offset: int) -> None:
        finding = self.findings.setdefault((kind, owner, form, place, location),
                                           Finding(kind, owner, form, place, location))
        finding.count += 1
        if len(finding.offsets) < MAX_OFFSETS:
            finding.offsets.append(offset)

    def search(self, place: str, location: str) -> Search:
        return Search(self, place, location)

    def search_value(self, chunks: Iterable[bytes], place: str, location: str) -> int:
        """Search one stored value (given in pieces), and its inflated bytes when it is zlib
        or gzip data; returns its stored size."""
        raw = self.search(place, location)
        inflate: Search | None = None
        inflater = zlib.decompressobj(wbits=47)     # 47: zlib or gzip header, told apart
        inflated = 0
        for chunk in chunks:
            raw.feed(chunk)
            if raw.size == len(chunk) and _looks_compressed(chunk):
                inflate = self.search(place, location + " (inflated)")
            if inflate is None or inflated > MAX_INFLATE_BYTES:
                continue
            try:
                data = inflater.decompress(chunk, CHUNK_BYTES)
                while data:
                    inflate.feed(data)
                    inflated += len(data)
                    if inflated > MAX_INFLATE_BYTES or not inflater.unconsumed_tail:
                        break
                    data = inflater.decompress(inflater.unconsumed_tail, CHUNK_BYTES)
            except zlib.error:
                inflate = None          # not compressed after all: the raw search stands
        if inflate is not None and inflate.size:
            self.count(place, "values inflated")
            if inflated > MAX_INFLATE_BYTES:
                self.notes.append(f"{place}: {location} inflates past {MAX_INFLATE_BYTES} "
                                  "bytes; searched that far")
        return raw.size

    def shape_owner(self, kind: str, credential: bytes) -> str:
        # API tokens and console session tokens are both kept as their hex SHA-256.
        who = self.known_hashes.get(hash_token(credential.decode("ascii")))
        if who:
            return who
        return ("api token not in the tokens file" if kind == "api_token"
                else "console session not in the cloud's state")


def _looks_compressed(data: bytes) -> bool:
    if data[:2] == b"\x1f\x8b":
        return True
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class Search:
    """One byte stream searched for every needle and credential shape. Chunks come in order;
    the last ``overlap`` bytes are kept, so a match across two chunks is found exactly once."""

    def __init__(self, check: Check, place: str, location: str):
        self.check, self.place, self.location = check, place, location
        self.tail = b""
        self.start = 0          # stream offset of tail[0]
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        check = self.check
        buf = self.tail + chunk
        done = len(self.tail)   # bytes of buf already searched
        self.size += len(chunk)
        for data, i, form in check.needles:
            at = buf.find(data, max(0, done - len(data) + 1))
            while at >= 0:
                secret = check.secrets[i]
                check.hit(secret.kind, secret.owner, form, self.place, self.location,
                          self.start + at)
                at = buf.find(data, at + 1)
        for kind, pattern in PATTERNS:
            for m in pattern.finditer(buf, max(0, done - 128)):
                start = m.start(1)
                if m.end() > done and not (start and buf[start - 1] in _URLSAFE_BYTES):
                    check.hit(kind, check.shape_owner(kind, m[1]), "shape", self.place,
                              self.location, self.start + start)
        keep = min(len(buf), check.overlap)
        self.start += len(buf) - keep
        self.tail = buf[len(buf) - keep:]


