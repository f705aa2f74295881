"""Text checks shared by every parser of outside input."""
from __future__ import annotations

import hmac
import reprlib


def ascii_digits(text: str) -> bool:
    """True for a non-empty run of ASCII digits 0-9 only. ``str.isdigit`` (and ``\\d`` in a
    regular expression) also accept other scripts' digits and superscripts ('٣', '²'), some
    of which ``int()`` then refuses: a 500 where a 400 was due."""
    return text.isascii() and text.isdigit()


def same_secret(given: str | bytes | None, expected: str | bytes | None) -> bool:
    """Constant-time equality of a secret someone sent (signature, hash, token, password) and
    the expected one. Compares UTF-8 bytes, so it never raises: ``hmac.compare_digest`` on two
    ``str`` raises TypeError when either holds a non-ASCII character (a 500 where a refusal was
    due). Lone surrogates (from JSON ``"\\ud800"``) are encoded as such; ``None`` or any other
    type is never equal."""
    def raw(value: str | bytes | None) -> bytes | None:
        if isinstance(value, str):
            return value.encode("utf-8", "surrogatepass")
        return bytes(value) if isinstance(value, (bytes, bytearray)) else None
    a, b = raw(given), raw(expected)
    return a is not None and b is not None and hmac.compare_digest(a, b)


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxtuple, _BRIEF.maxdict = 2, 4, 4, 4
_BRIEF.maxset = _BRIEF.maxfrozenset = 4
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 60, 60, 40


def brief(value: object) -> str:
    """A short ``repr`` of outside input for an error message, in bounded time: at most a few
    items of a few levels. ``repr`` itself walks the whole value, and a YAML document can alias
    one list ten times per level (a "billion laughs" of a few hundred bytes)."""
    try:
        return _BRIEF.repr(value)
    except ValueError:   # an int of more than 4,300 digits has no repr
        return f"<{type(value).__name__}>"
