"""The state-aware teacher: the next right action from whatever page an agent reached, for SRC
corrections and step-level labels (:mod:`datagen.src`).

:class:`OracleTeacher` reads the task's oracle plan (:mod:`datagen.oracle`: a list of
ops, data) against the current page instead of replaying it from the start. A session per
episode keeps which of the plan's clicks were done (an action the session would have proposed,
sent, and answered without an error) and, when the caller has it, whether the audit log says
the task is done. Its choice on a page:

1. the task is done (the audit log, or the plan's last click was done) -> ``stop("done")``, or
   for a wrong-documentation task, once its check holds on the page, ``report_infeasible``;
2. else the *latest* op of the plan whose control is on the page (a click not done yet, a field,
   a radio, a select), and before it the form's other value ops on the same page: the first of
   those that does not show its value yet, else the latest op itself (a dialog's OK over the
   list that opened it wins over the list's row action; a form's first empty field over its
   submit button);
3. a form whose values are all set and whose next op is not shown: the wizard's Next, or the
   drift's More menu;
4. nothing of the plan on the page: back to the task's start page (``goto``), the clicks that
   only navigate forgotten (submits and confirmations stay done); on the start page itself with
   nothing to do, no proposal (the teacher is lost: the state is off every path it knows).

:class:`ChatTeacher` asks an OpenAI-compatible model (a frontier model, as the seed system
distils from; configured, not required) with the agent's own prompt; its reply must parse as
one action of the action space and name an element that is on the page, else it is no
proposal. Either teacher's trajectories pass the same verifier before they train: the rule
over the audit log (:mod:`datagen.src` keeps only episodes the reward service solved).
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift
from consolerl.resources import fill
from consolerl.tasks import Task
from consolerl.types import Observation, StepResult
from env_workers.actions import (ActionError, Click, Fill, Goto, ReportInfeasible, Select, Stop,
                                 parse_action)
from env_workers.driver import DriverError, find_bid, find_in_row
from infra.llm import ChatClient, ChatError

from rollout_service.agent import SYSTEM_PROMPTS, _Step, build_messages, history_entry, recent_history
from .oracle import CHECK_VERBS, VALUE_VERBS, Op, OracleDriver, check_failure, plan_of

FINAL = -1          # Proposal.op of the episode's last action (stop / report_infeasible)
ROUTE = -2          # a step towards the next op (Next, More, back to the start page)


@dataclass(frozen=True)
class Proposal:
    """The teacher's next action (canonical action text), the plan op it does (an index,
    :data:`FINAL` or :data:`ROUTE`) and why, in a few words."""

    action: str
    op: int
    why: str


class TeacherSession(Protocol):
    """One episode's teacher: ``propose`` the next action on a page (``None``: it cannot
    tell), ``observe`` each action the episode sent from a page (whoever chose it), ``progress``: how far
    the plan is on a page (a number that grows as the task gets done)."""

    async def propose(self, observation: Observation, done: bool | None = None
                      ) -> Proposal | None: ...

    def observe(self, before: Observation, action_text: str, result: StepResult) -> None: ...

    def progress(self, observation: Observation) -> int: ...


class Teacher(Protocol):
    name: str

    def session(self, task: Task, values: Mapping[str, str], start_url: str
                ) -> TeacherSession: ...


def _line(text: str, role: str, label: str) -> re.Match[str] | None:
    return re.search(rf'^\s*\[(\d+)\] {re.escape(role)} "{re.escape(label)}"(.*)$', text, re.M)


def _textbox_value(text: str, role: str, label: str) -> str | None:
    m = _line(text, role, label)
    if m is None:
        return None
    rest = m[2]
    return rest[2:].strip() if rest.startswith(": ") else ""


def _selected(text: str, label: str) -> str | None:
    m = _line(text, "combobox", label)
    if m is None:
        return None
    for option in m[2].removeprefix(": ").split(" | "):
        if option.endswith("*"):
            return option[:-1]
    return ""


def _options(text: str, label: str) -> list[str]:
    m = _line(text, "combobox", label)
    return [o.rstrip("*") for o in m[2].removeprefix(": ").split(" | ")] if m else []


class PlanSession:
    """:class:`TeacherSession` over a task's oracle plan (see the module docstring)."""

    def __init__(self, task: Task, values: Mapping[str, str], start_url: str):
        self.task = task
        self.plan: list[Op] = plan_of(task, values)
        self.drift = Drift(parse_drift(task.drift))
        self.start_url = start_url
        self.done_ops: set[int] = set()
        actions = [i for i, o in enumerate(self.plan)
                   if o.verb not in VALUE_VERBS and o.verb not in CHECK_VERBS]
        self.last_click = actions[-1] if actions else -1
        reason = task.infeasible_reason.replace('"', "'").replace("\\", "/")[:500]
        self.final = (ReportInfeasible(reason).to_text() if task.expected == "infeasible"
                      else Stop("done").to_text())

    # ---- reading the page ---------------------------------------------------------------
    def t(self, label: str) -> str:
        return self.drift.label(label)

    def _has(self, text: str, role: str, name: str) -> bool:
        return find_bid(text, role, name) is not None

    def _present(self, i: int, text: str) -> bool:
        o, a = self.plan[i], self.plan[i].args
        if i in self.done_ops or o.verb in CHECK_VERBS:
            return False
        if o.verb == "press":
            return any(self._has(text, r, self.t(a[0])) for r in ("button", "link", "menuitem"))
        if o.verb == "row":
            return (find_in_row(text, a[0], self.t(a[1])) is not None
                    or ("more_menu" in self.drift
                        and find_in_row(text, a[0], "More") is not None))
        if o.verb == "link":
            return self._has(text, "link", a[0]) or find_in_row(text, a[0], a[0]) is not None
        if o.verb in ("field", "select"):
            return self._has(text, "combobox" if o.verb == "select" else "textbox",
                             self.t(a[0]))
        if o.verb == "pick":
            return self._has(text, "combobox", self.t(a[0]))
        if o.verb == "choose":
            return self._has(text, "radio", a[0])
        if o.verb == "reveal":
            return self._has(text, a[0], a[1])
        if o.verb == "tab":
            return re.search(rf'\] tab "[^"]*{re.escape(a[0])}', text) is not None
        if o.verb == "last_link":
            return self._has(text, "link", self.t(a[0]))
        if o.verb == "submit":
            return self._has(text, "button", self.t(a[0]))
        if o.verb == "confirm":
            return re.search(r"^\s*dialog ", text, re.M) is not None
        raise DriverError(f"unknown plan op {o}")

    def _satisfied(self, i: int, text: str) -> bool:
        o, a = self.plan[i], self.plan[i].args
        if o.verb == "field":
            return _textbox_value(text, "textbox", self.t(a[0])) == a[1]
        if o.verb == "select":
            return _selected(text, self.t(a[0])) == a[1]
        if o.verb == "pick":
            chosen = _selected(text, self.t(a[0]))
            return bool(chosen) and a[1] in chosen
        if o.verb == "choose":
            m = _line(text, "radio", a[0])
            return m is not None and "(checked)" in m[2]
        if o.verb == "reveal":
            return True
        if o.verb == "tab":
            m = re.search(rf'\] tab "[^"]*{re.escape(a[0])}[^"]*"(.*)$', text, re.M)
            return m is not None and "(selected)" in m[1] or i in self.done_ops
        return False                     # a click is never "done" by looking at the page

    def _action(self, i: int, text: str) -> str | None:
        o, a = self.plan[i], self.plan[i].args
        bid: str | None
        if o.verb == "press":
            for role in ("button", "link", "menuitem"):
                if (bid := find_bid(text, role, self.t(a[0]))) is not None:
                    return Click(bid).to_text()
            return None
        if o.verb == "row":
            bid = find_in_row(text, a[0], self.t(a[1]))
            if bid is None and "more_menu" in self.drift:
                bid = find_in_row(text, a[0], "More")
            return None if bid is None else Click(bid).to_text()
        if o.verb == "link":
            bid = find_bid(text, "link", a[0]) or find_in_row(text, a[0], a[0])
            return None if bid is None else Click(bid).to_text()
        if o.verb == "field":
            bid = find_bid(text, "textbox", self.t(a[0]))
            return None if bid is None else Fill(bid, a[1]).to_text()
        if o.verb == "select":
            bid = find_bid(text, "combobox", self.t(a[0]))
            return None if bid is None else Select(bid, a[1]).to_text()
        if o.verb == "pick":
            label = self.t(a[0])
            bid = find_bid(text, "combobox", label)
            option = next((x for x in _options(text, label) if a[1] in x), None)
            return None if bid is None or option is None else Select(bid, option).to_text()
        if o.verb == "choose":
            bid = find_bid(text, "radio", a[0])
            return None if bid is None else Click(bid).to_text()
        if o.verb == "tab":
            m = re.search(rf'\[(\d+)\] tab "[^"]*{re.escape(a[0])}', text)
            return None if m is None else Click(m[1]).to_text()
        if o.verb == "last_link":
            bids = re.findall(rf'\[(\d+)\] link "{re.escape(self.t(a[0]))}"', text)
            return Click(bids[-1]).to_text() if bids else None
        if o.verb == "submit":
            bid = find_bid(text, "button", self.t(a[0]))
            return None if bid is None else Click(bid).to_text()
        if o.verb == "confirm":
            m = re.search(r'\[(\d+)\] textbox "To confirm, type[^"]*"(.*)$', text, re.M)
            if m and a[0] and (m[2][2:].strip() if m[2].startswith(": ") else "") != a[0]:
                return Fill(m[1], a[0]).to_text()
            bid = find_bid(text, "button", self.t("OK"))
            return None if bid is None else Click(bid).to_text()
        return None

    def _route(self, k: int, text: str) -> Proposal | None:
        """A step towards op ``k``, which this page does not show."""
        o = self.plan[k]
        nxt = find_bid(text, "button", self.t("Next"))
        if o.verb in VALUE_VERBS | {"submit"} and nxt is not None:
            return Proposal(Click(nxt).to_text(), ROUTE, f"the wizard's next step has {o}")
        more = find_bid(text, "button", "More")
        if o.verb == "press" and "more_menu" in self.drift and more is not None:
            return Proposal(Click(more).to_text(), ROUTE, f"{o} is in the More menu")
        return None

    def _pointer(self) -> int:
        return max(self.done_ops) + 1 if self.done_ops else 0

    def _finish(self, observation: Observation) -> Proposal | None:
        """The final action, once every check op of the plan holds on this page."""
        if any(o.verb in CHECK_VERBS for o in self.plan):
            driver = OracleDriver(_no_step, observation, self.drift)
            for o in self.plan:
                if o.verb in CHECK_VERBS and check_failure(o, driver):
                    return None
        return Proposal(self.final, FINAL, "the task is done" if self.task.expected ==
                        "success" else "the page lacks what the procedure documents")

    # ---- the session --------------------------------------------------------------------
    def next_action(self, observation: Observation, done: bool | None = None
                    ) -> Proposal | None:
        text = observation.text
        if done or (self.last_click >= 0 and self.last_click in self.done_ops):
            return self._finish(observation)
        n = len(self.plan)
        present = [self._present(i, text) for i in range(n)]
        if any(present):
            j = max(i for i in range(n) if present[i])
            first = j
            while first > 0 and present[first - 1] and self.plan[first - 1].verb in VALUE_VERBS:
                first -= 1
            for k in range(first, j + 1):
                if not self._satisfied(k, text):
                    action = self._action(k, text)
                    if action is not None:
                        o = self.plan[k]
                        if o.verb == "row" and find_in_row(text, o.args[0],
                                                           self.t(o.args[1])) is None:
                            # Opening the row's More menu: not the op itself yet.
                            return Proposal(action, ROUTE, f"{o} is in the row's More menu")
                        if o.verb == "confirm" and action.startswith("fill("):
                            return Proposal(action, ROUTE, "the dialog asks for the id")
                        return Proposal(action, k, str(o))
            nxt = j + 1
        else:
            nxt = self._pointer()
        while nxt < n and self.plan[nxt].verb in CHECK_VERBS:
            nxt += 1
        if nxt >= n:
            return self._finish(observation)
        route = self._route(nxt, text)
        if route is not None:
            return route
        if _same_page(observation.url, self.start_url) or \
                not self.start_url.startswith(("http://", "https://")):
            return None
        return Proposal(Goto(self.start_url).to_text(), ROUTE, "back to the start page")

    async def propose(self, observation: Observation, done: bool | None = None
                      ) -> Proposal | None:
        return self.next_action(observation, done)

    def observe(self, before: Observation, action_text: str, result: StepResult) -> None:
        """Follow an action sent from ``before`` (whoever chose it): the click it would have
        proposed there, sent and answered without an error, is done."""
        proposal = self.next_action(before)
        if proposal is None or result.observation.last_action_error:
            return
        if proposal.action != action_text:
            return
        if proposal.op >= 0 and self.plan[proposal.op].verb not in VALUE_VERBS:
            self.done_ops.add(proposal.op)
        elif proposal.op == ROUTE and proposal.action.startswith("goto("):
            # Back at the start: the clicks that only navigated are to be made again.
            self.done_ops = {i for i in self.done_ops
                             if self.plan[i].verb in ("submit", "confirm")
                             or i == self.last_click}

    def progress(self, observation: Observation) -> int:
        """How far along the plan the episode is: one past the latest op that is done (a
        click sent, or a value the page shows)."""
        text = observation.text
        shown = [i for i, o in enumerate(self.plan)
                 if o.verb in VALUE_VERBS and o.verb != "reveal" and self._present(i, text)
                 and self._satisfied(i, text)]
        return max([i + 1 for i in (*self.done_ops, *shown)], default=0)


async def _no_step(text: str) -> StepResult:
    raise DriverError("the teacher only reads the page")


def _same_page(url: str, other: str) -> bool:
    a, b = urlsplit(url), urlsplit(other)
    return (a.path.rstrip("/"), a.query) == (b.path.rstrip("/"), b.query)


def start_url_of(task: Task, values: Mapping[str, str], observation: Observation) -> str:
    """The task's start page as an absolute URL on the console the observation is from."""
    parts = urlsplit(observation.url)
    return f"{parts.scheme}://{parts.netloc}{fill(task.start_page, values)}"


class OracleTeacher:
    """The oracle's plans read against the page (see the module docstring)."""

    name = "oracle"

    def session(self, task: Task, values: Mapping[str, str], start_url: str) -> PlanSession:
        return PlanSession(task, values, start_url)


# ---- a model as the teacher -----------------------------------------------------------------
def checked_action(reply: str, observation: Observation) -> str | None:
    """The canonical action of a teacher model's ``reply`` when it parses and every element it
    names is on the page; else ``None``."""
    action = parse_action(reply)
    if isinstance(action, ActionError):
        return None
    bid = getattr(action, "bid", None)
    if bid is not None and not re.search(rf"^\s*\[{re.escape(str(bid))}\] ", observation.text,
                                         re.M) and f"[{bid}]" not in observation.text:
        return None
    return action.to_text()


class ChatSession:
    """One episode of :class:`ChatTeacher`: the agent's prompt (whole page, the last
    ``history_turns`` actions) to the model, the reply checked by :func:`checked_action`."""

    def __init__(self, teacher: "ChatTeacher", task: Task, values: Mapping[str, str]):
        self.teacher, self.task = teacher, task
        self.procedure = fill(task.procedure, values)
        self.history: list[_Step] = []
        self.failures = 0

    async def propose(self, observation: Observation, done: bool | None = None
                      ) -> Proposal | None:
        t = self.teacher
        messages = build_messages(self.task.title, self.procedure,
                                  recent_history(self.history, t.history_turns),
                                  observation, t.max_observation_chars,
                                  SYSTEM_PROMPTS["full"])
        try:
            reply = await asyncio.to_thread(t.client.complete, messages)
        except ChatError:
            self.failures += 1
            return None
        action = checked_action(reply, observation)
        if action is None:
            self.failures += 1
            return None
        return Proposal(action, FINAL if action.startswith(("stop(", "report_infeasible("))
                        else 0, "the teacher model's action")

    def observe(self, before: Observation, action_text: str, result: StepResult) -> None:
        self.history.append(history_entry(action_text, result))

    def progress(self, observation: Observation) -> int:
        return len(self.history)


class ChatTeacher:
    """A model behind an OpenAI-compatible endpoint as the teacher (``client``: e.g.
    :class:`infra.llm.OpenAIChatClient`; its key comes from the environment, never logged)."""

    name = "chat"

    def __init__(self, client: ChatClient, history_turns: int = 4,
                 max_observation_chars: int = 12_000):
        self.client = client
        self.history_turns = history_turns
        self.max_observation_chars = max_observation_chars

    def session(self, task: Task, values: Mapping[str, str], start_url: str) -> ChatSession:
        return ChatSession(self, task, values)

