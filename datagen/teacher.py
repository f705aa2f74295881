"""The state-aware teacher: the next right action from whatever page an agent reached, for SRC
corrections and step-level labels (:mod:`datagen.src`).

:class:`OracleTeacher` reads the task's oracle plan (:mod:`datagen.oracle`: a list of
ops, data) against the current page, each op with :func:`datagen.plan.resolve` (as the oracle
does them), instead of replaying it from the start. A session per
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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift
from consolerl.resources import fill
from consolerl.tasks import Task
from consolerl.types import Observation, StepResult
from env_workers.actions import ActionError, Goto, ReportInfeasible, Stop, parse_action
from infra.llm import ChatClient, ChatError

from rollout_service.agent import SYSTEM_PROMPTS, _Step, build_messages, history_entry, recent_history
from .oracle import plan_of
from .plan import CHECK_VERBS, VALUE_VERBS, Op, Resolution, check_failure, resolve

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
    def _resolve(self, i: int, observation: Observation) -> Resolution:
        return resolve(self.plan[i], observation, self.drift)

    def _present(self, r: Resolution, i: int) -> bool:
        return r.present and i not in self.done_ops and self.plan[i].verb not in CHECK_VERBS

    def _satisfied(self, r: Resolution, i: int) -> bool:
        # A tab opened by a click of this episode stays done (the page may not mark it).
        return r.satisfied or (self.plan[i].verb == "tab" and i in self.done_ops)

    def _pointer(self) -> int:
        return max(self.done_ops) + 1 if self.done_ops else 0

    def _finish(self, observation: Observation) -> Proposal | None:
        """The final action, once every check op of the plan holds on this page."""
        for o in self.plan:
            if o.verb in CHECK_VERBS and check_failure(o, observation, self.drift):
                return None
        return Proposal(self.final, FINAL, "the task is done" if self.task.expected ==
                        "success" else "the page lacks what the procedure documents")

    # ---- the session --------------------------------------------------------------------
    def next_action(self, observation: Observation, done: bool | None = None
                    ) -> Proposal | None:
        if done or (self.last_click >= 0 and self.last_click in self.done_ops):
            return self._finish(observation)
        n = len(self.plan)
        read = [self._resolve(i, observation) for i in range(n)]
        present = [self._present(read[i], i) for i in range(n)]
        if any(present):
            j = max(i for i in range(n) if present[i])
            first = j
            while first > 0 and present[first - 1] and self.plan[first - 1].verb in VALUE_VERBS:
                first -= 1
            for k in range(first, j + 1):
                r = read[k]
                if self._satisfied(r, k):
                    continue
                if r.prepare is not None:
                    return Proposal(r.prepare, ROUTE, r.why)    # not the op itself yet
                if r.action is not None:
                    return Proposal(r.action, k, str(self.plan[k]))
            nxt = j + 1
        else:
            nxt = self._pointer()
        while nxt < n and self.plan[nxt].verb in CHECK_VERBS:
            nxt += 1
        if nxt >= n:
            return self._finish(observation)
        if read[nxt].route is not None:       # a step towards the op, which this page lacks
            return Proposal(read[nxt].route, ROUTE, read[nxt].towards)
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
        shown = []
        for i, o in enumerate(self.plan):
            if o.verb in VALUE_VERBS and o.verb != "reveal":
                r = self._resolve(i, observation)
                if self._present(r, i) and self._satisfied(r, i):
                    shown.append(i)
        return max([i + 1 for i in (*self.done_ops, *shown)], default=0)


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
    if bid is not None and observation.page.by_bid(str(bid)) is None:
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

