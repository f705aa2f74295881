"""Regular expressions that come from users: one rule for every filter a user's pattern drives
(the jobs API's ``tasks.id_regex``, an inline task's ``where.<field>.regex``, and any future
one).

A user's pattern runs in RE2 (``google-re2``), whose matching time is linear in the text: no
pattern makes it backtrack (Python's ``re`` takes seconds on ``^(?:.|.){0,22}!`` and doubles
per repetition). It is compiled within a memory limit, at most :data:`MAX_CHARS` characters,
or refused with the reason, :class:`PatternError` naming the field. What RE2 does not run
(backreferences, lookaround, Python-only syntax) is refused, not handed to ``re``. Otherwise
a pattern means what it means in ``re``, except that RE2's ``\d``, ``\w`` and ``\s`` are ASCII
(``\pN``, ``\pL`` for other scripts) and ``$`` is the end of the text only.
"""
from __future__ import annotations

import re

import re2

from consolerl.errors import ConsoleRLError

MAX_CHARS = 200
# RE2's memory for one compiled pattern (its program and DFA cache). 1 MiB compiles any
# pattern of catalogue-id filters in a few ms; \pL{1000} needs more and is refused.
MAX_MEM = 1 << 20


class PatternError(ConsoleRLError, ValueError):
    """A user's pattern that is not run: too long, too large once compiled, or not RE2 syntax
    (the message names the field and says why)."""


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_MEM
    options.log_errors = False           # the reason goes into PatternError, not to stderr
    return options


_OPTIONS = _options()
# What RE2 refuses that users write, by the text of the pattern: the reason in words.
_UNSUPPORTED = (
    (re.compile(r"\\[1-9]|\(\?P=|\\g<|\\k<"), "backreferences (\\1, (?P=name)) are not "
     "supported: RE2 matches in linear time and has none"),
    (re.compile(r"\(\?<?[=!]"), "lookaround ((?=...), (?!...), (?<=...), (?<!...)) is not "
     "supported: RE2 matches in linear time and has none"),
    (re.compile(r"\\Z"), "\\Z is Python's; RE2 writes the end of the text as \\z"),
    (re.compile(r"\(\?[imsU-]*[aLux]"), "the flags a, L, u and x are Python's; RE2 has i, m, "
     "s and U"),
)


def compile_pattern(pattern: str, field: str, max_chars: int = MAX_CHARS) -> re2._Regexp:
    """``pattern`` compiled by RE2 within :data:`MAX_MEM` (RE2 caches compiled patterns);
    :class:`PatternError` naming ``field`` when it is longer than ``max_chars``, not RE2
    syntax, or too large. Use the result's ``search`` / ``fullmatch`` as ``re``'s."""
    if not isinstance(pattern, str):
        raise PatternError(f"{field}: must be a string, got {type(pattern).__name__}")
    if len(pattern) > max_chars:
        raise PatternError(f"{field}: at most {max_chars} characters, got {len(pattern)}")
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise PatternError(f"{field}: not valid Unicode (a lone surrogate)") from None
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        said = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(
            exc.args[0], bytes) else str(exc)
        raise PatternError(f"{field}: {_why(pattern, said)}") from None


def _why(pattern: str, said: str) -> str:
    if "pattern too large" in said:
        return (f"the pattern is too large once compiled (over {MAX_MEM // 1024} KiB; RE2: "
                f"{said}): use fewer or smaller repetitions")
    for construct, reason in _UNSUPPORTED:
        if construct.search(pattern):
            return f"{reason} (RE2: {said})"
    return f"not an RE2 regular expression: {said}"


def _subject(text: str) -> str | bytes:
    # RE2 reads UTF-8: a lone surrogate (JSON allows "\ud800") goes as its bytes, never
    # matching a character class, instead of failing the encoding.
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def search(pattern: re2._Regexp, text: str) -> bool:
    """Whether ``pattern`` (from :func:`compile_pattern`) matches somewhere in ``text``."""
    return pattern.search(_subject(text)) is not None


def fullmatch(pattern: re2._Regexp, text: str) -> bool:
    """Whether ``pattern`` (from :func:`compile_pattern`) matches all of ``text``."""
    return pattern.fullmatch(_subject(text)) is not None
