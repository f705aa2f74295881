"""Console sign-in: the form's CSRF token, and lockout after repeated wrong passwords.

CSRF (:class:`SigninTokens`). The sign-in form has no session yet, so its token is bound to a
pre-session: a GET of the form sets ``consolerl_console_signin`` (a random pre-session id,
HttpOnly, SameSite=Strict, path ``/console/signin``; an existing well-formed one is kept, so
two open tabs both work) and puts ``<issued>.<HMAC-SHA256(server secret, pre-session id,
issued)>`` in the form's hidden ``_csrf`` field; a POST must carry a token the server signed
for the pre-session id its cookie names, issued within the last 24 hours. A plain
double-submit cookie is not enough: cookies ignore ports, so a page on another port of the
same host can set the cookie (``Path=/console/signin``) and post the same value in the body.
Here a made-up cookie and token fail, because only the server can sign. A pair the attacker
fetched from the console itself could still be tossed into a victim's browser: that is what
the same-origin check on every state-changing console request stops (``origin.py``; browsers
always send ``Origin`` on a POST). The secret is random per server process and never leaves
it: a restart makes sign-in forms open at that moment answer 403 with a fresh form.

Lockout (:class:`SigninLimits`; by default 5 wrong passwords for a name, or 100 from an
address, within 5 minutes lock it for 5 minutes, then 10, 20, ... up to an hour for locks in
a row). Wrong passwords are counted per login name (existing or not, so a lock tells nothing
about which names exist) and per client address, in a sliding window: ``account_failures``
for one name within ``window_s`` lock the name, ``address_failures`` from one address lock
the address. A lock lasts ``lockout_s``, doubled for each further lock in a row up to
``max_lockout_s``; while it lasts every attempt is refused (429 and Retry-After), the right
password too, without being checked. A successful sign-in ends the name's streak; an
address's failures only age out.

Training never trips it: each episode signs in with its leased account's right password.
Wrong passwords come from an attacker, or from an agent that signed out and typed one; that
locks the agent's own account for a while (the env worker reports ``signin_locked``, which
does not quarantine the account). The address threshold is high because every env worker of
a node signs in from the same address.

The state is in memory, in the one server process, not in the SQLite store: it lives
minutes, and a restart forgets it (failures and locks), which only an operator can cause.
Handlers run on the server's event loop only, so no lock is needed. At most ``max_tracked``
names and addresses are kept; the least recently failed go first.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

from consolerl.text import same_secret

from ..config import SigninLimits

CSRF_COOKIE = "consolerl_console_signin"       # holds the pre-session id
_PRE_SESSION = re.compile(r"[A-Za-z0-9_-]{32}")
_TOKEN = re.compile(r"([0-9]{1,12})\.([A-Za-z0-9_-]{43})")


@dataclass
class _Record:
    failures: deque[float] = field(default_factory=deque)
    locked_until: float = 0.0
    strikes: int = 0            # locks in a row


@dataclass(frozen=True)
class Lock:
    """Why sign-in is refused: ``scope`` is "account" or "address"; ``seconds`` left."""

    scope: str
    seconds: float

    def message(self) -> str:
        minutes = max(1, math.ceil(self.seconds / 60))
        who = "this account" if self.scope == "account" else "your network address"
        return (f"Too many failed sign-in attempts for {who}. Sign-in is locked; try again in "
                f"{minutes} minute{'s' if minutes > 1 else ''}.")


class SigninGuard:
    """Counts wrong passwords and answers whether sign-in is locked (see the module doc)."""

    def __init__(self, limits: SigninLimits, clock: Callable[[], float] = time.monotonic,
                 on_lock: Callable[[str], None] | None = None):
        self.limits = limits
        self.clock = clock
        self.on_lock = on_lock
        self._records: OrderedDict[tuple[str, str], _Record] = OrderedDict()

    def locked(self, login_name: str, address: str) -> Lock | None:
        now = self.clock()
        for scope, key in (("account", login_name), ("address", address)):
            record = self._records.get((scope, key))
            if record is not None and record.locked_until > now:
                return Lock(scope, record.locked_until - now)
        return None

    def failed(self, login_name: str, address: str) -> Lock | None:
        """Count a wrong password; the lock it caused, if any."""
        now = self.clock()
        lock = None
        for scope, key, limit in (("account", login_name, self.limits.account_failures),
                                  ("address", address, self.limits.address_failures)):
            record = self._touch(scope, key)
            failures = record.failures
            while failures and failures[0] <= now - self.limits.window_s:
                failures.popleft()
            failures.append(now)
            if len(failures) >= limit:
                if now - record.locked_until > self.limits.max_lockout_s:
                    record.strikes = 0      # quiet since the last lock: start over
                seconds = min(self.limits.max_lockout_s,
                              self.limits.lockout_s * 2 ** min(record.strikes, 30))
                record.strikes += 1
                record.locked_until = now + seconds
                failures.clear()
                lock = lock or Lock(scope, seconds)
                if self.on_lock is not None:
                    self.on_lock(scope)
        self._prune()
        return lock

    def succeeded(self, login_name: str) -> None:
        self._records.pop(("account", login_name), None)

    def _touch(self, scope: str, key: str) -> _Record:
        record = self._records.pop((scope, key), None) or _Record()
        self._records[(scope, key)] = record       # most recently used last
        return record

    def _prune(self) -> None:
        # Least recently failed first. Flooding names to push a locked one out costs an
        # attacker more wrong passwords than its address may make.
        while len(self._records) > self.limits.max_tracked:
            self._records.popitem(last=False)


class SigninTokens:
    """Issues and checks the sign-in form's CSRF tokens (see the module doc)."""

    def __init__(self, secret: bytes | None = None, ttl_s: float = 24 * 3600,
                 clock: Callable[[], float] = time.time):
        self._secret = secret or secrets.token_bytes(32)
        self.ttl_s = ttl_s
        self.clock = clock

    def __repr__(self) -> str:          # never the secret
        return f"SigninTokens(ttl_s={self.ttl_s})"

    def pre_session(self, request: Request) -> str:
        """The browser's pre-session id when its cookie holds a well-formed one, else a new
        one; :func:`set_pre_session_cookie` sends it."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return cookie if _PRE_SESSION.fullmatch(cookie) else secrets.token_urlsafe(24)

    def issue(self, pre_session: str) -> str:
        issued = str(int(self.clock()))
        return f"{issued}.{self._mac(pre_session, issued)}"

    def valid(self, request: Request, form: Mapping[str, str]) -> bool:
        """Whether the POST's ``_csrf`` was signed by this server for the pre-session its
        cookie names, and is neither expired nor from the future."""
        pre_session = request.cookies.get(CSRF_COOKIE, "")
        match = _TOKEN.fullmatch(form.get("_csrf", ""))
        if match is None or not _PRE_SESSION.fullmatch(pre_session):
            return False
        issued, mac = match[1], match[2]
        age = self.clock() - int(issued)
        if not -60 <= age <= self.ttl_s:
            return False
        return same_secret(mac, self._mac(pre_session, issued))

    def _mac(self, pre_session: str, issued: str) -> str:
        digest = hmac.new(self._secret, f"console-signin\0{pre_session}\0{issued}".encode(),
                          hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def set_pre_session_cookie(response: Response, pre_session: str) -> None:
    response.set_cookie(CSRF_COOKIE, pre_session, max_age=24 * 3600, httponly=True,
                        samesite="strict", path="/console/signin")
