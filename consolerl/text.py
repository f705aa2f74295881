"""Text checks shared by every parser of outside input."""
from __future__ import annotations

import hmac
import re
import reprlib
import string


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


# A field's "(required)" / "(optional)" mark is the page's typography, not part of its label.
_MARKS = re.compile(r"\((?:required|optional)\)", re.IGNORECASE)
# Punctuation that may stand around a word: ASCII, typographic quotes, ellipsis, emphasis.
_EDGE = string.punctuation + "\u2018\u2019\u201c\u201d\u2026\u00b7"
_NUMBERED = re.compile(r"^\s*(\d+)[.)]\s+(.*)$")


def norm(text: str) -> str:
    """A label, name or phrase as compared, the one normalisation of the project: case, spacing
    (no-break spaces too), a "(required)" or "(optional)" mark and punctuation around words
    (quotes, emphasis, a trailing colon or full stop, brackets) do not count; punctuation inside
    a word does (``10.0.0.0/8``, ``e-mail``, ``my_bucket``, ``Ram:CreateUser``)."""
    text = _MARKS.sub(" ", text.replace("\u00a0", " ")).casefold()
    return " ".join(w for w in (word.strip(_EDGE) for word in text.split()) if w)


def numbered_step(line: str) -> tuple[int, str] | None:
    """``(number, text)`` of a line that starts a numbered step (``3. Click OK`` or
    ``3) Click OK``), None for any other line: the one rule for what a step number is."""
    m = _NUMBERED.match(line)
    if m is None or not ascii_digits(m[1]):
        return None
    return int(m[1]), m[2]
