"""The evidence channel: an agent's infeasibility claim (``report_infeasible(reason)``) checked
against what really happened, deterministically and in milliseconds.

A documentation checker exists to say "this procedure cannot be done as written, because ...";
an agent that simply failed says the same thing. The claim is believed only when evidence backs
it:

- **missing** (``confirmed``): the reason names a control, menu, tab, field or option that the
  procedure names (its *anchors*: the capitalised phrases and option codes of its steps), and
  that name is on no page the agent saw and, where the console's UI inventory is known, nowhere
  in the console. Without an inventory the agent must also have followed the procedure up to
  the step that names it (acted on what the earlier steps name, or seen their pages), so that
  it looked where the thing should be.
- **refused** (``refused``): the agent's own console write was refused (an audit event with an
  ``errorCode``), with values the procedure documents (every parameter value with a digit in it
  is one the procedure or the episode's placeholders give), and the reason quotes the error
  code or the console's message.

In both cases the audit log must show that nothing the procedure's operation would do happened
(no required event of the task's rule matched) and nothing forbidden.

The claim is **contradicted** (a failure) when every anchor the reason names is on a page the
agent saw or in the inventory, or when the operation happened after all; **unsupported** (a
failure) when the reason names nothing the procedure names ("the page took too long"). On a
task known not to work as written, an episode that did not report it infeasible is
``not_reported`` (a failure). Anything else is ``unchecked`` (undetermined). How these become a
reward is :mod:`reward_service.fusion`'s policy.

The pages are observation texts as the agent saw them (``url`` on the first line, then the
accessibility text with ``[bid] role "label"`` lines); nothing here fetches or runs anything.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from consolerl.audit import AuditEvent
from consolerl.page import Page, parse
from consolerl.resources import fill
from consolerl.rewards import EvidenceOutcome
from consolerl.tasks import Task
from consolerl.text import norm, numbered_step

from .rules import assign, forbidden

# Words that start a step's sentence (or glue one) without being part of a control's name.
_LEAD_WORDS = frozenset("""
a an the and then to on in at under from for of or by with into onto via go open click choose
select enter type fill set find save confirm navigate switch use return log sign next first
finally optionally also when if after before this that it its your you
""".split())
# Names of products and the console itself: they name where, not what is missing.
_NOT_ANCHORS = frozenset("""
ram ecs oss vpc console alibaba alibaba cloud cloud china hangzhou
""".split())
_CONNECTORS = ("and", "for", "of", "&", "/")
_WORD = r"(?:[A-Z][A-Za-z0-9]*|[a-z]+[A-Z][A-Za-z0-9]*|[A-Z0-9]{2,})(?:['\-][A-Za-z0-9]+)*"
_PHRASE = re.compile(rf"{_WORD}(?:\s+(?:(?:and|for|of|&|/)\s+)?{_WORD})*")
_QUOTED = re.compile(r"\*\*([^*]{1,80})\*\*|\"([^\"]{1,80})\"|'([^']{2,80})'|`([^`]{1,80})`")
_CODE = re.compile(r"(?<![\w./-])[a-z][a-z0-9]*(?:[.-][a-z0-9]+)+(?![\w/])")
_IP = re.compile(r"^\d+(\.\d+)*(/\d+)?$")
_ACTION_BID = re.compile(r'^\s*(?:click|fill|select)\(\s*"?(\d+)"?')
# Request parameters the console adds on its own (never what a user types or chooses).
_CONSOLE_PARAMS = frozenset({"clienttoken", "regionid", "pagenumber", "pagesize",
                             "maxresults", "nexttoken", "dryrun"})


def _contains(haystack: str, needle: str) -> bool:
    """``needle`` (normalised) as a whole phrase in ``haystack`` (already lower-cased): not
    inside a longer word or number on either side."""
    if not needle:
        return False
    start = haystack.find(needle)
    while start >= 0:
        end = start + len(needle)
        if not (start and _alnum(haystack[start - 1])) and not (
                end < len(haystack) and _alnum(haystack[end])):
            return True
        start = haystack.find(needle, start + 1)
    return False


def _alnum(char: str) -> bool:
    return "a" <= char <= "z" or "0" <= char <= "9"


def _strip_lead(phrase: str) -> str:
    words = phrase.split()
    while words and words[0].lower() in _LEAD_WORDS:
        words.pop(0)
    while words and words[-1].lower() in (*_LEAD_WORDS, *_CONNECTORS):
        words.pop()
    return " ".join(words)


def anchors_of(text: str, placeholder_values: Collection[str] = ()) -> list[str]:
    """The names a procedure step (or any text) gives to things of the console: bold, quoted or
    capitalised phrases (``Create AccessKey``, ``Network and Security Group``, ``vSwitch``) and
    option codes (``cn-hangzhou-z``, ``ecs.g9.huge``), normalised, in order, without duplicates.
    Product names, addresses and the episode's own values (resource names) are left out."""
    values = {norm(v) for v in placeholder_values if v}
    found: list[str] = []
    spans: list[tuple[int, int]] = []
    for m in _QUOTED.finditer(text):
        found.append(next(g for g in m.groups() if g))
        spans.append(m.span())
    rest = text
    for a, b in reversed(spans):
        rest = rest[:a] + " | " + rest[b:]
    for part in re.split(r"\s*(?:>|›|→|\||,|;|:|\(|\)|\.(?=\s|$))\s*", rest):
        for m in _PHRASE.finditer(part):
            found.append(_strip_lead(m[0]))
        for m in _CODE.finditer(part):
            found.append(m[0])
    out: list[str] = []
    for name in found:
        n = norm(name)
        if not n or n in out or n in values or n in _NOT_ANCHORS or _IP.match(n) \
                or any(n in v for v in values if len(n) >= 4):
            continue
        if len(n) < 2 or n in _LEAD_WORDS:
            continue
        out.append(n)
    return out


@dataclass(frozen=True)
class Step:
    number: int
    text: str
    anchors: tuple[str, ...]
    targets: tuple[str, ...]          # the episode's values the step names (resource names)


def steps_of(procedure: str, values: Mapping[str, str]) -> list[Step]:
    """The numbered steps of a task's procedure, placeholders filled, with their anchors."""
    filled_values = [v for v in values.values() if v]
    steps: list[Step] = []
    for line in procedure.splitlines():
        m = numbered_step(line)
        if m is None:
            if steps and line.strip():         # a continuation line
                last = steps[-1]
                text = f"{last.text} {line.strip()}"
                steps[-1] = Step(last.number, text, tuple(anchors_of(text, filled_values)),
                                 last.targets)
            continue
        number, raw = m
        text = fill(raw, values) if "{" in raw else raw
        targets = tuple(norm(values[k]) for k in re.findall(r"\{(\w+)\}", raw)
                        if values.get(k))
        steps.append(Step(number, text, tuple(anchors_of(text, filled_values)), targets))
    return steps


# ---- what the agent saw and did ----------------------------------------------------------------
def page_url(page: str) -> str:
    return page.split("\n", 1)[0].strip()


def _page(page: str) -> Page:
    """The typed page of a page as a trajectory keeps it (its URL on the first line)."""
    url, _, text = page.partition("\n")
    return parse(text, url.strip())


def acted_labels(pages: Sequence[str], actions: Sequence[str]) -> list[str]:
    """The labels of the elements the agent clicked, filled or selected: ``actions[i]`` ran on
    ``pages[i]`` (the observation before it)."""
    out = []
    for i, action in enumerate(actions):
        m = _ACTION_BID.match(action or "")
        if m is None or i >= len(pages):
            continue
        node = _page(pages[i]).by_bid(m[1])
        if node is None:
            continue
        out.append(norm(node.label))
        # a row's control: the row's text says which resource it acted on
        if node.row:
            out.append(norm(node.row))
    return out


def _headings(page: str) -> str:
    return "\n".join(n.label.lower() for n in _page(page).headings())


# ---- the check ---------------------------------------------------------------------------------
def _refusal(events: Sequence[AuditEvent], reason: str, documented: str
             ) -> tuple[AuditEvent | None, str]:
    """The first refused write of the agent the reason quotes, with its values documented;
    and, when there is a refused write the reason does not match, why."""
    why = ""
    low = reason.lower()
    for e in events:
        code = e.error_code
        if not code:
            continue
        words = [w for w in re.findall(r"[a-z]{4,}", e.error_message.lower())]
        quoted = code.lower() in low or (
            words and sum(w in low for w in words) >= max(2, (len(words) + 1) // 2))
        if not quoted:
            why = f"the console refused {e.event_name} with {code}, which the reason " \
                  "does not quote"
            continue
        odd = [f"{k}={v}" for k, v in e.parameters.items()
               if isinstance(v, (str, int, float)) and re.search(r"\d", str(v))
               and str(k).lower() not in _CONSOLE_PARAMS
               and str(v).lower() not in documented]
        if odd:
            why = (f"the refused {e.event_name} sent values the procedure does not "
                   f"give ({', '.join(odd[:3])})")
            continue
        return e, ""
    return None, why


@dataclass(frozen=True)
class Claim:
    """How an episode ended, with what it leaves as evidence: what :func:`check_claim` checks.

    ``infeasible_reason``: the agent's ``report_infeasible`` reason (``None``: it made no
    claim); ``answer``: its final answer (``None``: it did not say it was done); ``values``:
    the episode's placeholder values; ``pages``: the observation texts the agent saw
    (``pages[i]`` before ``actions[i]``, the last one after the final action); ``events``: the
    agent's console audit events of the episode (as :class:`~reward_service.verifier.RuleVerifier`
    selects them)."""

    infeasible_reason: str | None
    answer: str | None = None
    values: Mapping[str, str] = field(default_factory=dict)
    pages: Sequence[str] = ()
    actions: Sequence[str] = ()
    events: Sequence[AuditEvent] = ()


def check_claim(task: Task, claim: Claim,
                console_labels: Collection[str] | None = None) -> EvidenceOutcome:
    """Check how an episode ended against the evidence (the module docstring says how).

    ``console_labels``: every label of the console's inventory, normalised (:func:`norm`), for
    the task's console and drift; ``None`` when no inventory is known."""
    infeasible_reason, answer, values = claim.infeasible_reason, claim.answer, claim.values
    pages, actions = claim.pages, claim.actions
    if infeasible_reason is None:
        if task.expected == "infeasible":
            ended = "stopped saying it was done" if answer is not None else "did not finish"
            return EvidenceOutcome("failure", "not_reported", (
                f"the procedure does not work as written, and the agent {ended} instead of "
                "reporting it infeasible",))
        return EvidenceOutcome("undetermined", "no_claim")
    rule = task.success
    events = list(claim.events)
    chosen = assign(rule.required_events, events, dict(values))[0] \
        if rule.required_events else None
    if chosen is not None:
        return EvidenceOutcome("failure", "contradicted", (
            "the agent reported the procedure infeasible, but the audit log has its "
            "operation",), events=tuple(events[k].event_id for k in chosen))
    bad = [e.event_id for _, hits in forbidden(rule, events, dict(values), None) for e in hits]
    if bad:
        return EvidenceOutcome("failure", "contradicted", (
            "a forbidden event happened during the episode",), events=tuple(bad))

    steps = steps_of(task.procedure, values)
    reason = norm(infeasible_reason)
    documented = (fill(task.procedure, values) + " " + " ".join(values.values())).lower()
    refused, refusal_why = _refusal(events, infeasible_reason, documented)
    if refused is not None:
        return EvidenceOutcome("success", "refused", (
            f"the console refused {refused.event_name} with {refused.error_code} for the "
            "documented values, as the agent reported",), events=(refused.event_id,))

    anchors: list[tuple[str, int]] = []             # (anchor, the first step naming it)
    for step in steps:
        for a in step.anchors:
            if a not in (x for x, _ in anchors):
                anchors.append((a, step.number))
    named = [(a, n) for a, n in anchors if _contains(reason, a)]
    # A longer name that contains a shorter one ("create accesskey" / "accesskey") wins.
    named = [(a, n) for a, n in named
             if not any(a != b and _contains(b, a) for b, _ in named)]
    if not named:
        why = "the reason names nothing the procedure names (no control, menu, field or option)"
        if refusal_why:
            why += f"; {refusal_why}"
        return EvidenceOutcome("failure", "unsupported", (why,))

    lowered = [p.lower() for p in pages]
    labels = {norm(x) for x in console_labels} if console_labels is not None else None
    present, missing = [], []
    for a, n in named:
        seen = next((page_url(p) or "a page" for p, low in zip(pages, lowered)
                     if _contains(low, a)), None)
        if seen is not None:
            present.append((a, n, f"{a!r} on {seen}"))
        elif labels is not None and any(_contains(lab, a) for lab in labels):
            present.append((a, n, f"{a!r} in the console's inventory"))
        else:
            missing.append((a, n))
    shown = tuple(p for _, _, p in present)
    if not missing:
        return EvidenceOutcome("failure", "contradicted", (
            "the console has what the reason says is missing: " + "; ".join(shown),),
            present=shown)
    first = min(n for _, n in missing)
    if labels is None:
        lacking = _not_followed(steps, first, pages, actions)
        if lacking:
            return EvidenceOutcome("undetermined", "unchecked", (
                f"{', '.join(repr(a) for a, _ in missing)} was on no page the agent saw, but "
                f"it did not follow the procedure to step {first} ({lacking}), and no console "
                "inventory says it is absent",), missing=tuple(a for a, _ in missing),
                present=shown)
    where = "on no page the agent saw" + (" and nowhere in the console's inventory"
                                          if labels is not None else "")
    return EvidenceOutcome("success", "confirmed", (
        f"{', '.join(repr(a) for a, _ in missing)} (step {first}) is {where}, and the audit "
        "log shows nothing done",), missing=tuple(a for a, _ in missing), present=shown)


def _not_followed(steps: Sequence[Step], upto: int, pages: Sequence[str],
                  actions: Sequence[str]) -> str:
    """What of the steps before ``upto`` the agent shows no sign of having done ("" when it
    followed them): each earlier step's anchors and resource names must be among the labels
    it acted on, or in a heading of a page it saw."""
    acted = acted_labels(pages, actions)
    headings = "\n".join(_headings(p) for p in pages)
    for step in steps:
        if step.number >= upto:
            break
        for thing in (*step.anchors, *step.targets):
            if any(_contains(label, thing) for label in acted) or _contains(headings, thing):
                continue
            return f"step {step.number}: nothing shows it acted on {thing!r}"
    return ""


__all__ = ["Claim", "acted_labels", "anchors_of", "check_claim", "norm", "steps_of"]
