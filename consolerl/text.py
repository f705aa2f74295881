"""Text checks shared by every parser of outside input."""
from __future__ import annotations


def ascii_digits(text: str) -> bool:
    """True for a non-empty run of ASCII digits 0-9 only. ``str.isdigit`` (and ``\\d`` in a
    regular expression) also accept other scripts' digits and superscripts ('٣', '²'), some
    of which ``int()`` then refuses: a 500 where a 400 was due."""
    return text.isascii() and text.isdigit()
