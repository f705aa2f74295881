"""The action space of the browser env workers: a strict parser for actions written by an LLM.

Grammar, one action per model output::

    click(bid) | fill(bid, "text") | select(bid, "option") | press("Key")
    | scroll("down"|"up") | goto("url") | go_back() | stop("answer") | report_infeasible("reason")

Arguments
    ``bid`` is an element id as shown in observations (``a12``, ``b3``, ``17``): 1-16 characters
    from ``A-Z a-z 0-9 _ -``, bare or quoted. Every other argument is a string in double or
    single quotes; the only escapes are ``\\" \\' \\\\ \\n \\t`` (anything else is an error).
    Spaces and tabs are allowed around arguments; raw control characters are not.

Finding the action in the model output (the model may reason first)
    The output is split into lines on ``\\n`` (a trailing ``\\r`` is dropped). A *candidate* is

    * a line outside code blocks that starts (after spaces/tabs) with a known action name and
      ``(`` -- e.g. ``click(a12)`` -- or with ``Action:`` -- e.g. ``Action: click(a12)``;
    * a fenced code block (an opening line starting with three backticks, an info string such
      as ``python`` allowed, up to a line that is only three backticks; or one line
      ```click(a12)``` ), whose content must be exactly one action line.

    The LAST candidate in the output is the action; earlier candidates and any other lines (prose
    after the action included) are ignored. The action line must be exactly one call: anything
    other than whitespace after its closing parenthesis is an error, never silently dropped
    (``click(a12); import os`` is refused). A code block left open is an error.

The parser never evaluates model text (no eval/exec/literal_eval): it is a hand tokenizer whose
work is linear and bounded -- outputs longer than ``MAX_OUTPUT_CHARS`` are refused before
anything else is looked at, action lines longer than ``MAX_ACTION_CHARS`` before tokenizing.
:func:`parse_action` never raises on text: a bad action comes back as an :class:`ActionError`
value, which the worker shows to the agent as ``last_action_error``; a ``goto`` refused for
where its URL points (not http/https, credentials, no host) carries the URL in
``ActionError.refused_url``, so the worker counts it as a blocked navigation. Host
allow-listing of ``goto`` is the worker's job, with :func:`host_allowed`.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import ClassVar
from urllib.parse import SplitResult, urlsplit

from consolerl.errors import ConsoleRLError

# A whole model reply. Replies are max_new_tokens long at most: 12 to 256 in the configs, 512
# the jobs API's ceiling; even at 32 characters a token that is 16,384. The longest valid
# action line (a fill of 2,000 escaped characters, about 4,030) fits four times. Parsing is
# linear: the slowest reply of this size (all newlines) takes about 10 ms on a busy core.
MAX_OUTPUT_CHARS = 16_384
MAX_ACTION_CHARS = 8_192   # the longest valid action (2,000 escaped chars) fits with room
MAX_TEXT_CHARS = 2_000
MAX_OPTION_CHARS = 500
MAX_ANSWER_CHARS = 2_000
MAX_REASON_CHARS = 2_000
MAX_URL_CHARS = 2_048

NAMED_KEYS = ("Enter", "Tab", "Escape", "Backspace", "Delete", "ArrowUp", "ArrowDown",
              "ArrowLeft", "ArrowRight", "Home", "End", "PageUp", "PageDown", "Space")
MODIFIER_KEYS = ("Control", "Shift", "Alt", "Meta", "ControlOrMeta")
SCROLL_DIRECTIONS = ("down", "up")

ACTION_HELP = """\
End your reply with exactly one action on its own line (or alone in a ``` code block):
  click(bid)                   click the element with that id, e.g. click(12)
  fill(bid, "text")            replace the content of an input with text
  select(bid, "option")        choose an option of a select element
  press("Key")                 Enter Tab Escape Backspace Delete ArrowUp ArrowDown ArrowLeft
                               ArrowRight Home End PageUp PageDown Space; modifiers: Control+a
  scroll("down")               scroll the page "down" or "up"
  goto("https://host/path")    open an http(s) URL on an allowed host
  go_back()                    go back one page
  stop("answer")               finish the task, with the answer if the task asks for one
  report_infeasible("reason")  give up: the task cannot be done here
Strings take double or single quotes; escapes: \\" \\' \\\\ \\n \\t."""


class InvalidActionError(ConsoleRLError, ValueError):
    """An action value breaks the grammar. Raised by the action constructors;
    :func:`parse_action` returns an :class:`ActionError` value instead."""


class RefusedURLError(InvalidActionError):
    """A ``goto`` URL refused for where it points: not http/https (``javascript:``,
    ``file:``, ``data:``), user credentials, no host, a malformed host or port, spaces or
    backslashes. ``url``: the refused URL."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url

    def __reduce__(self):
        return (type(self), (str(self), self.url))


@dataclass(frozen=True)
class ActionError:
    """Why a model output is not a valid action (data for ``last_action_error``, not raised).
    ``refused_url``: set when the output was a ``goto`` refused for where it points (see
    :class:`RefusedURLError`); the worker counts those as blocked navigations."""

    message: str
    refused_url: str = ""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Action:
    """Base of every action. Field names are argument kinds (``bid``, ``text``, ...); the
    constructor validates every field, so an action that exists always renders with
    :meth:`to_text` to the canonical text that parses back to an equal action."""

    name: ClassVar[str] = ""
    usage: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _CHECKS[f.name](getattr(self, f.name))
            if problem:
                raise InvalidActionError(f"{self.name}: {problem}; usage: {self.usage}")

    def to_text(self) -> str:
        """The canonical form: bare bid, double-quoted strings, ``", "`` between arguments."""
        args = [getattr(self, f.name) if f.name == "bid" else _quote(getattr(self, f.name))
                for f in fields(self)]
        return f"{self.name}({', '.join(args)})"


@dataclass(frozen=True)
class Click(Action):
    """Click the element ``bid``."""

    bid: str
    name: ClassVar[str] = "click"
    usage: ClassVar[str] = "click(bid)"


@dataclass(frozen=True)
class Fill(Action):
    """Replace the content of the input ``bid`` with ``text`` (``""`` clears it)."""

    bid: str
    text: str
    name: ClassVar[str] = "fill"
    usage: ClassVar[str] = 'fill(bid, "text")'


@dataclass(frozen=True)
class Select(Action):
    """Choose ``option`` in the select element ``bid``."""

    bid: str
    option: str
    name: ClassVar[str] = "select"
    usage: ClassVar[str] = 'select(bid, "option")'


@dataclass(frozen=True)
class Press(Action):
    """Press ``key`` (a Playwright key name, maybe with modifiers) on the focused element."""

    key: str
    name: ClassVar[str] = "press"
    usage: ClassVar[str] = 'press("Enter")'


@dataclass(frozen=True)
class Scroll(Action):
    """Scroll the page ``direction`` (``"down"`` or ``"up"``)."""

    direction: str
    name: ClassVar[str] = "scroll"
    usage: ClassVar[str] = 'scroll("down") or scroll("up")'


@dataclass(frozen=True)
class Goto(Action):
    """Open ``url`` (http/https; the worker checks the host with :func:`host_allowed`)."""

    url: str
    name: ClassVar[str] = "goto"
    usage: ClassVar[str] = 'goto("https://host/path")'

    def __post_init__(self) -> None:
        # A string that is a string (type, length, control characters) but not a URL the
        # sandbox lets through is a refused navigation, not a grammar slip.
        if _check_string("url", self.url, MAX_URL_CHARS, allow_empty=False) is None:
            problem = _url_problem(self.url)
            if problem:
                raise RefusedURLError(f"{self.name}: {problem}; usage: {self.usage}", self.url)
        super().__post_init__()


@dataclass(frozen=True)
class GoBack(Action):
    """Go back one page in the browser history."""

    name: ClassVar[str] = "go_back"
    usage: ClassVar[str] = "go_back()"


@dataclass(frozen=True)
class Stop(Action):
    """End the episode; ``answer`` is the agent's answer (may be empty)."""

    answer: str
    name: ClassVar[str] = "stop"
    usage: ClassVar[str] = 'stop("answer")'


@dataclass(frozen=True)
class ReportInfeasible(Action):
    """End the episode declaring the task impossible, with a ``reason``."""

    reason: str
    name: ClassVar[str] = "report_infeasible"
    usage: ClassVar[str] = 'report_infeasible("reason")'


ACTION_TYPES: tuple[type[Action], ...] = (
    Click, Fill, Select, Press, Scroll, Goto, GoBack, Stop, ReportInfeasible)
_BY_NAME = {cls.name: cls for cls in ACTION_TYPES}
ALLOWED_FORMS = ('click(bid) | fill(bid, "text") | select(bid, "option") | press("Key") | '
                 'scroll("down"|"up") | goto("url") | go_back() | stop("answer") | '
                 'report_infeasible("reason")')


def parse_action(text: str) -> Action | ActionError:
    """Find the one action in a model output (rule in the module docstring) and parse it.

    Returns the action, or an :class:`ActionError` naming what was wrong and the allowed
    forms. Never raises on any string; work is bounded by ``MAX_OUTPUT_CHARS``.
    """
    if not isinstance(text, str):
        return ActionError(f"the model output is not text; expected one of: {ALLOWED_FORMS}")
    try:
        return _parse_line(_find_action_line(text))
    except RefusedURLError as e:
        return ActionError(str(e), refused_url=e.url)
    except InvalidActionError as e:
        return ActionError(str(e))


# -- validation (shared by the constructors and the parser) ------------------------------------

_BID_RE = re.compile(r"[A-Za-z0-9_-]{1,16}")
# In an action line, only tab is allowed; in a value, escapes can also put in a newline.
# Surrogates are refused because the browser cannot type a lone half of a pair.
_LINE_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
_VALUE_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _check_bid(bid: object) -> str | None:
    if not isinstance(bid, str) or not _BID_RE.fullmatch(bid):
        return f"bid {_show(bid)} must be 1-16 characters from A-Z a-z 0-9 _ -, e.g. 12 or a12"
    return None


def _check_string(field: str, value: object, limit: int, allow_empty: bool = True
                  ) -> str | None:
    if not isinstance(value, str):
        return f"{field} must be a string"
    if not value and not allow_empty:
        return f"{field} must not be empty"
    if len(value) > limit:
        return f"{field} is {len(value):,} characters, at most {limit:,} allowed"
    bad = _VALUE_CONTROL_RE.search(value)
    if bad:
        return f"{field} contains control character U+{ord(bad.group()):04X}"
    return None


def _check_key(key: object) -> str | None:
    allowed = (f"one of {', '.join(NAMED_KEYS)}, optionally after modifiers "
               f"({', '.join(MODIFIER_KEYS)}) joined by + as in Control+a or Shift+Tab")
    if not isinstance(key, str) or len(key) > 64:
        return f"key must be {allowed}"
    *mods, last = key.split("+")
    # A bare letter would be typing, which is fill's job; with a modifier it is a shortcut.
    key_ok = last in NAMED_KEYS or (len(mods) > 0 and len(last) == 1 and last.isascii()
                                    and last.isalnum())
    mods_ok = all(m in MODIFIER_KEYS for m in mods) and len(set(mods)) == len(mods)
    if not (key_ok and mods_ok):
        return f"key {_show(key)} is not allowed; use {allowed}"
    return None


def _check_direction(direction: object) -> str | None:
    if direction not in SCROLL_DIRECTIONS:
        return f"direction {_show(direction)} is not allowed; use \"down\" or \"up\""
    return None


def _check_url(url: object) -> str | None:
    """Syntax only: an absolute http(s) URL with a host, no credentials, no tricks."""
    problem = _check_string("url", url, MAX_URL_CHARS, allow_empty=False)
    if problem or not isinstance(url, str):
        return problem
    return _url_problem(url)


def _url_problem(url: str) -> str | None:
    """What is wrong with where a string (checked by :func:`_check_string`) points."""
    if any(ch.isspace() for ch in url) or "\\" in url:
        return "url must not contain spaces or backslashes"
    try:
        parts = urlsplit(url)
        parts.port   # raises ValueError on a bad port
    except ValueError:
        return f"url {_show(url)} is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return f"only http:// and https:// URLs are allowed, not {_show(parts.scheme + ':')}"
    if "@" in parts.netloc:
        return "url must not contain user credentials (user@host)"
    if not parts.hostname:
        return f"url {_show(url)} has no host"
    return None


_CHECKS: dict[str, Callable[[object], str | None]] = {
    "bid": _check_bid,
    "text": lambda v: _check_string("text", v, MAX_TEXT_CHARS),
    "option": lambda v: _check_string("option", v, MAX_OPTION_CHARS, allow_empty=False),
    "key": _check_key,
    "direction": _check_direction,
    "url": _check_url,
    "answer": lambda v: _check_string("answer", v, MAX_ANSWER_CHARS),
    "reason": lambda v: _check_string("reason", v, MAX_REASON_CHARS, allow_empty=False),
}


def _quote(value: str) -> str:
    return '"' + (value.replace("\\", "\\\\").replace('"', '\\"')
                  .replace("\n", "\\n").replace("\t", "\\t")) + '"'


def _show(value: object, limit: int = 40) -> str:
    """A short, repr-quoted excerpt of model text for error messages."""
    s = value if isinstance(value, str) else str(type(value).__name__)
    return repr(s if len(s) <= limit else s[:limit] + "...")


# -- locating the action line --------------------------------------------------------------------

_NAMES_ALT = "|".join(_BY_NAME)
_CANDIDATE_RE = re.compile(rf"[ \t]*(?:Action:|(?:{_NAMES_ALT})[ \t]*\()")
_CALL_LIKE_RE = re.compile(r"[ \t]*([A-Za-z_][A-Za-z0-9_.]*)\(")   # for "unknown action" hints
_HEAD_RE = re.compile(r"[ \t]*(?:Action:[ \t]*)?([A-Za-z_][A-Za-z0-9_]*)?[ \t]*")
_FENCE = "```"


def _find_action_line(text: str) -> str:
    """Return the line holding the action, per the rule in the module docstring."""
    if len(text) > MAX_OUTPUT_CHARS:
        raise InvalidActionError(
            f"the output is {len(text):,} characters, more than {MAX_OUTPUT_CHARS:,}; "
            f"end a short reply with one action: {ALLOWED_FORMS}")
    last: list[str] | None = None   # the last candidate: one line, or a code block's lines
    unknown_call = ""               # last call-like line with an unknown name, for the hint
    block: list[str] | None = None  # lines of the code block being read, if inside one
    block_start = 0
    for number, line in enumerate(text.split("\n"), 1):
        line = line[:-1] if line.endswith("\r") else line
        stripped = line.strip(" \t")
        if block is not None:
            if stripped == _FENCE:
                last, block = block, None
            else:
                block.append(line)
        elif stripped.startswith(_FENCE):
            rest = stripped[len(_FENCE):]
            if len(rest) >= len(_FENCE) and rest.endswith(_FENCE):   # ```click(a12)```
                last = [rest[:-len(_FENCE)]]
            else:                                                   # ```python: info string
                block, block_start = [], number
        elif _CANDIDATE_RE.match(line):
            last = [line]
        elif (m := _CALL_LIKE_RE.match(line)) is not None:
            unknown_call = m.group(1)
    if block is not None:
        raise InvalidActionError(f"the code block opened on line {block_start} is not closed")
    if last is None:
        if unknown_call:
            raise InvalidActionError(
                f"unknown action {_show(unknown_call)}; allowed: {ALLOWED_FORMS}")
        raise InvalidActionError(
            f"no action found; end your reply with one action on its own line: {ALLOWED_FORMS}")
    content = [line for line in last if line.strip(" \t")]
    if len(content) != 1:
        what = "is empty" if not content else f"has {len(content)} lines"
        raise InvalidActionError(
            f"the last code block {what}; it must hold exactly one action: {ALLOWED_FORMS}")
    return content[0]


# -- tokenizing one action line ----------------------------------------------------------------

_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "n": "\n", "t": "\t"}
_BARE_RE = re.compile(r"""[^ \t,()'"\\]+""")
_BRACKETED_BID_RE = re.compile(r"\[([A-Za-z0-9_-]{1,16})\]")


def _parse_line(line: str) -> Action:
    if len(line) > MAX_ACTION_CHARS:
        raise InvalidActionError(
            f"the action line is {len(line):,} characters, at most {MAX_ACTION_CHARS:,}")
    bad = _LINE_CONTROL_RE.search(line)
    if bad:
        raise InvalidActionError(f"control character U+{ord(bad.group()):04X} in the action; "
                                 "inside strings write \\n or \\t")
    head = _HEAD_RE.match(line)
    assert head is not None   # every part of the pattern is optional
    cls = _BY_NAME.get(head.group(1) or "")
    if cls is None:
        what = head.group(1) or line.strip(" \t")
        raise InvalidActionError(f"unknown action {_show(what)}; allowed: {ALLOWED_FORMS}")

    def fail(problem: str) -> InvalidActionError:
        return InvalidActionError(f"{cls.name}: {problem}; usage: {cls.usage}")

    pos = head.end()
    if not line.startswith("(", pos):
        raise fail(f"expected '(' after {cls.name}")
    args, pos = _read_args(line, pos + 1, fail)
    rest = line[pos:].strip(" \t")
    if rest:
        raise fail(f"unexpected text after the closing parenthesis: {_show(rest)}; "
                   "write exactly one action")
    kinds = [f.name for f in fields(cls)]
    if len(args) != len(kinds):
        raise fail(f"expected {len(kinds)} argument{'s' * (len(kinds) != 1)}, got {len(args)}")
    for kind, (value, quoted) in zip(kinds, args):
        if kind != "bid" and not quoted:
            raise fail(f"{kind} must be a quoted string, not {_show(value)}")
    return cls(*(value for value, _ in args))   # the constructor validates each value


def _read_args(line: str, pos: int, fail: Callable[[str], InvalidActionError]
               ) -> tuple[list[tuple[str, bool]], int]:
    """Read ``arg, arg)`` from ``line[pos:]``: ([(value, was_quoted)], index after ``)``)."""
    args: list[tuple[str, bool]] = []
    pos = _skip_blanks(line, pos)
    if line.startswith(")", pos):
        return args, pos + 1
    while True:
        pos = _skip_blanks(line, pos)
        if pos >= len(line):
            raise fail("missing closing parenthesis")
        if line[pos] in "\"'":
            value, pos = _read_string(line, pos, fail)
            args.append((value, True))
        elif (bracketed := _BRACKETED_BID_RE.match(line, pos)) is not None:
            # Observations show bids as "[17]"; a model copying the brackets means bid 17.
            args.append((bracketed.group(1), False))
            pos = bracketed.end()
        elif (bare := _BARE_RE.match(line, pos)) is not None:
            args.append((bare.group(), False))
            pos = bare.end()
        else:
            raise fail(f"expected an argument at column {pos + 1}, got {_show(line[pos])}")
        pos = _skip_blanks(line, pos)
        if pos >= len(line):
            raise fail("missing closing parenthesis")
        if line[pos] == ")":
            return args, pos + 1
        if line[pos] == "(":
            raise fail("nested calls are not allowed")
        if line[pos] != ",":
            raise fail(f"expected ',' or ')' at column {pos + 1}, got {_show(line[pos])}")
        pos += 1


def _read_string(line: str, pos: int, fail: Callable[[str], InvalidActionError]
                 ) -> tuple[str, int]:
    """Read the quoted string starting at ``line[pos]``: (value, index after closing quote)."""
    quote, start = line[pos], pos
    out: list[str] = []
    pos += 1
    while pos < len(line):
        ch = line[pos]
        if ch == quote:
            return "".join(out), pos + 1
        if ch == "\\":
            escape = line[pos + 1: pos + 2]
            if escape not in _ESCAPES:
                if not escape:   # a backslash ends the line: the string never closes
                    break
                raise fail(f"unknown escape \\{escape} at column {pos + 1}; "
                           "allowed escapes: \\\" \\' \\\\ \\n \\t")
            out.append(_ESCAPES[escape])
            pos += 2
        else:
            out.append(ch)
            pos += 1
    raise fail(f"unterminated string starting at column {start + 1}")


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


# -- goto host allow-listing ---------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


def host_allowed(url: str, allowed_hosts: Iterable[str]) -> bool:
    """True when ``url`` is a valid goto URL whose host and port equal an allowed entry.

    An entry is ``host`` (the scheme's default port only) or ``host:port``; IPv6 as
    ``[::1]:8080``. Hostnames compare case-insensitively and exactly (no subdomains); IP
    addresses compare by value. URLs with credentials (``http://allowed@evil/``), backslashes,
    whitespace or a non-ASCII host never match, and a malformed entry matches nothing.
    """
    if _check_url(url) is not None:
        return False
    parts = urlsplit(url)
    host = _normal_host(parts)
    if host is None:
        return False
    port = parts.port if parts.port is not None else _DEFAULT_PORTS[parts.scheme]
    for entry in allowed_hosts:
        if not isinstance(entry, str) or not entry or any(c in entry for c in "/?#@\\ \t"):
            continue
        try:
            allowed = urlsplit("//" + entry)
            entry_port = allowed.port
        except ValueError:
            continue
        if entry_port is None:
            entry_port = _DEFAULT_PORTS[parts.scheme]
        if _normal_host(allowed) == host and entry_port == port:
            return True
    return False


def _normal_host(parts: SplitResult) -> str | None:
    """Lower-cased ASCII hostname, or an IP address in canonical form (``::1``)."""
    host = parts.hostname   # urlsplit lower-cases it and drops IPv6 brackets
    # Non-ASCII is refused: str.lower() maps some letters to ASCII (U+212A KELVIN SIGN -> k).
    if not host or not parts.netloc.isascii():
        return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host
