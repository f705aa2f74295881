"""The domain of what reaches the jobs store's Redis from outside: a key part (job, rollout,
artifact ids, team names, cursors) never holds the ``:`` separator or a glob character, and a
stream id is what Redis reads as one (it refuses one past 2^64 mid-stream, after an answer has
begun). :class:`~.store.JobStore` and the API's parameter types check against these."""
from __future__ import annotations

import re

from consolerl.errors import ConsoleRLError


class OutOfDomain(ConsoleRLError, ValueError):
    """A value from outside that Redis would refuse, or read as something else (a stream id
    past 2^64, a key part with a separator); the message says what the domain is."""


U64_MAX = 2 ** 64 - 1          # a stream id's parts: Redis reads each as an unsigned 64-bit


def at_most(n: int) -> str:
    """A regular expression (no anchors) for the decimal integers 0..``n``, leading zeros
    allowed: what Redis' ``string2ull`` reads as at most ``n``."""
    digits = str(n)
    # Fewer digits than n, or as many and smaller at the first digit that differs, or n.
    branches = [f"[0-9]{{1,{len(digits) - 1}}}"] if len(digits) > 1 else []
    for i, d in enumerate(digits):
        if d != "0" and (i or d != "1" or len(digits) == 1):  # else: fewer digits
            rest = len(digits) - i - 1
            branches.append(digits[:i] + (f"[0-{int(d) - 1}]" if d != "1" else "0")
                            + {0: "", 1: "[0-9]"}.get(rest, f"[0-9]{{{rest}}}"))
    return "0*(?:" + "|".join([*branches, digits]) + ")"


STREAM_ID_MAX_CHARS = 64
# <ms>-<seq> or <ms> (read as <ms>-0), each part at most 2^64-1; not "$", "+", "-", ">" nor "*":
# a client resumes after an id the stream gave it.
STREAM_ID = f"^{at_most(U64_MAX)}(?:-{at_most(U64_MAX)})?$"
_STREAM_ID = re.compile(STREAM_ID.strip("^$"))
KEY_PART_MAX_CHARS = 64
KEY_PART = f"^[A-Za-z0-9_-]{{1,{KEY_PART_MAX_CHARS}}}$"
_KEY_PART = re.compile(KEY_PART.strip("^$"))


def stream_id(text: str) -> str:
    """``text`` as the stream id Redis reads (``<ms>-<seq>``, canonical: no leading zeros,
    ``<ms>`` alone is ``<ms>-0``); :class:`OutOfDomain` for anything Redis would refuse or
    read otherwise."""
    if len(text) > STREAM_ID_MAX_CHARS or not _STREAM_ID.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise OutOfDomain(f"{shown} is not an event id: <ms>-<seq> or <ms>, each a decimal "
                          f"integer at most {U64_MAX} (2^64-1), at most "
                          f"{STREAM_ID_MAX_CHARS} characters")
    ms, _, seq = text.partition("-")
    return f"{int(ms)}-{int(seq or 0)}"


def key_part(text: str) -> str:
    """``text`` when it may be one part of a key name (an id or a team): 1-64 ASCII letters,
    digits, ``_`` or ``-``; :class:`OutOfDomain` otherwise."""
    if not _KEY_PART.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise OutOfDomain(f"{shown} is not an id: 1-{KEY_PART_MAX_CHARS} of the letters "
                          "A-Z a-z, digits, '_' and '-'")
    return text
