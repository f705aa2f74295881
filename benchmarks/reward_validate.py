"""The reward channels against a labelled validation set:
``python -m benchmarks.reward_validate --json [--sample] [--tasks REGEX] [--workers N]``.

The set is built from the task suite and scripted agents whose true outcome is known by
construction (the label never comes from a scorer). For every solvable task the oracle
solves it (label success) and one scripted agent, chosen in turn from those that apply to the
task, does it wrong (label failure):

- ``stop_early``: says it is done on the start page;
- ``half``: a two-step procedure stopped after its first step, or any other procedure with
  everything but the final commit (the form filled but not submitted, the dialog not confirmed);
- ``undo``: does the task, then reverses it in the console (deletes what it created, removes
  the policy it granted, starts what it stopped, renames back, ...);
- ``wrong_region``: switches the console to another region and does it there;
- ``forbidden``: does the task, then deletes a resource the task forbids touching;
- ``infeasible_on_feasible``: reports a working procedure as infeasible.

For every wrong-documentation task: ``infeasible_right`` (reports it infeasible with the known
reason: success), ``infeasible_claim_done`` (says it is done: failure) and
``infeasible_wrong_reason`` (reports it infeasible for an unrelated reason: failure).

Each case is a real episode (provisioned prerequisites, the system Chromium on the local
cloud's console, the episode destroyed after); the rule channel (:class:`RuleVerifier`) scores
it before the destroy, the judge channel reads the same rendering a model judge would, and
:func:`fuse` combines them as the reward service does.

The judges are scripted by default (``--judge scripted``): three deterministic readers of the
rendered trajectory with different angles (how the episode ended and what the final page says;
whether the actions cover the procedure; whether anything was undone afterwards), unanimous
consensus. They stand in for LLM judges and make mistakes an LLM judge could make (they trust
the page). ``--judge openai --judge-url URL --judge-model NAME`` uses an OpenAI-compatible
endpoint instead (k and consensus from ``--judges`` / ``--consensus``). LLM judges ask for
their vote under structured output (the vote's JSON schema as ``response_format``; ``--judge
live`` serves it with ``--judge-backend vllm``); ``--judge-free-text`` asks without it.

Metrics (positive class: success). Only cases without an env error count (``env_errors``
reports the rest), and only cases whose scripted agent carried out its behaviour to the end
(``script_errors`` lists the others, e.g. an undo that never found the button):

- ``rule_accuracy_decisive``: accuracy of the rule channel where it was decisive (success or
  failure; for wrong-documentation tasks only a failure is decisive, as in fusion);
  ``rule_coverage``: the fraction of cases where it was decisive;
- ``judge_accuracy`` / ``judge_coverage``: the same for the judge channel (its consensus);
- ``judge_valid_rate``: the judges' valid votes over the votes asked (every judge of every
  judged case); ``judge_vote_accuracy``: the votes that match the label over the valid votes
  (each judge on its own, before consensus); both null when no judge ran;
- ``fused_accuracy``: the fused verdict against the label over all cases (undetermined counts
  as wrong);
- ``precision`` / ``recall`` per channel: precision over the channel's decisive success
  verdicts, recall over all cases labelled success (an undetermined verdict is a miss).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.services import cloud_and_redis
from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift
from consolerl.errors import ConsoleRLError
from consolerl.resources import fill
from consolerl.rewards import JudgeVerdict, RewardResult
from consolerl.tasks import TASKS_DIR, Task, load_suite
from consolerl.types import Observation, StepResult
from env_workers.accounts import PoolConfig, load_pool_accounts
from env_workers.driver import DriverError, StepFn, find_bid
from env_workers.pool import LeasedEnvWorker
from env_workers.worker import WorkerConfig
from reward_service.evidence import steps_of
from reward_service.fusion import evidence_decides, fuse
from reward_service.judges import VOTE_MAX_CHARS, JudgeChannel, JudgeConfig, judge_clients
from reward_service.service import RewardService
from rollout_service.episode import EpisodeOutcome, EpisodeRunner, scripted_policy
from rollout_service.episode import Script as EpisodeScript
from doccheck.inventory import labels_by_drift
from datagen.oracle import FAMILIES, OracleDriver
from datagen.plan import Op

MAX_STEPS = 40

# ---- scripted agents ---------------------------------------------------------------------------
Script = Callable[["Agent"], Awaitable[None]]


@dataclass
class Agent:
    """What a scripted behaviour works with: the task, its values and an oracle driver."""

    task: Task
    values: Mapping[str, str]
    driver: OracleDriver

    @property
    def args(self) -> dict[str, str]:
        return {k: fill(v, self.values) for k, v in self.task.oracle_args}

    async def solve(self) -> None:
        await FAMILIES[self.task.oracle_family](self.driver, self.args)

    async def goto(self, path: str) -> None:
        origin = urlsplit(self.driver.observation.url)
        await self.driver.act(f'goto("{origin.scheme}://{origin.netloc}{path}")')


class _HalfDriver(OracleDriver):
    """Does everything but the final commit: submit and confirm only stop there."""

    class Stop(ConsoleRLError):
        """Ends the script where the final commit would be (not an error of the run)."""

    async def execute(self, o: Op) -> None:
        if o.verb in ("submit", "confirm"):
            raise self.Stop
        await super().execute(o)


# family -> (list page, reversing family, its args from the task's oracle args)
_UNDO: dict[str, tuple[str, str, Callable[[dict[str, str]], dict[str, str]]]] = {
    "ram_create_user": ("/console/ram/users", "ram_delete_user",
                        lambda a: {"user_name": a["user_name"]}),
    "ram_grant_policy": ("/console/ram/users", "ram_revoke_policy", lambda a: a),
    "ram_onboard_user": ("/console/ram/users", "ram_revoke_policy", lambda a: a),
    "ram_revoke_policy": ("/console/ram/users", "ram_grant_policy",
                          lambda a: {"user_name": a["user_name"], "policy": "ReadOnlyAccess"}),
    "oss_create_bucket": ("/console/oss/buckets", "oss_delete_bucket",
                          lambda a: {"bucket": a["bucket"]}),
    "oss_set_acl": ("/console/oss/buckets", "oss_set_acl",
                    lambda a: {"bucket": a["bucket"], "acl": "Private"
                               if a["acl"] != "Private" else "Public Read"}),
    "vpc_create_vpc": ("/console/vpc/vpcs", "vpc_delete_vpc", lambda a: {"vpc": a["name"]}),
    "vpc_create_vswitch": ("/console/vpc/vswitches", "vpc_delete_vswitch",
                           lambda a: {"vswitch": a["name"]}),
    "ecs_create_sg": ("/console/ecs/security-groups", "ecs_delete_sg", lambda a: {"sg": a["name"]}),
    "ecs_create_sg_with_rule": ("/console/ecs/security-groups", "ecs_delete_sg",
                                lambda a: {"sg": a["name"]}),
    "ecs_add_rule": ("/console/ecs/security-groups", "ecs_delete_rule",
                     lambda a: {"sg": a["sg"], "port": a.get("port") or a["cidr"]}),
    "ecs_rename_instance": ("/console/ecs/instances", "ecs_rename_instance",
                            lambda a: {"instance": a["instance"],
                                       "new_name": a["new_name"] + "-old"}),
}
_UNDO_OP = {"Stop": "Start", "Start": "Stop"}

# forbidden event -> (list page, family, args from the forbidden rule's filled where values)
_FORBIDDEN: dict[str, tuple[str, str, Callable[[dict[str, str]], dict[str, str]]]] = {
    "DeleteSecurityGroup": ("/console/ecs/security-groups", "ecs_delete_sg",
                            lambda w: {"sg": w["requestParameters.SecurityGroupId"]}),
    "DeleteBucket": ("/console/oss/buckets", "oss_delete_bucket",
                     lambda w: {"bucket": w["requestParameters.BucketName"]}),
    "DeleteInstance": ("/console/ecs/instances", "ecs_instance_op",
                       lambda w: {"instance": w["requestParameters.InstanceId"], "op": "Delete"}),
}
_TWO_STEP = {"ram_onboard_user": "ram_create_user", "ecs_create_sg_with_rule": "ecs_create_sg"}
_REGIONAL_CREATES = {"vpc_create_vpc"}


def _undo_plan(task: Task) -> tuple[str, str, Callable[[dict[str, str]], dict[str, str]]] | None:
    if task.oracle_family == "ecs_instance_op":
        op = dict(task.oracle_args).get("op", "")
        if op in _UNDO_OP:
            return ("/console/ecs/instances", "ecs_instance_op",
                    lambda a: {"instance": a["instance"], "op": _UNDO_OP[a["op"]]})
        return None
    return _UNDO.get(task.oracle_family)


def _forbidden_plan(task: Task, values: Mapping[str, str]
                    ) -> tuple[str, str, dict[str, str]] | None:
    for rule in task.success.forbidden_events:
        if rule.event == "DeleteInstance" and dict(task.oracle_args).get("op") != "Stop":
            continue                     # the console releases stopped instances only
        plan = _FORBIDDEN.get(rule.event)
        where = {path: fill(p.value, values) for path, p in rule.where
                 if p.op == "eq" and isinstance(p.value, str)}
        if plan is None:
            continue
        try:
            return plan[0], plan[1], plan[2](where)
        except KeyError:
            continue
    return None


async def _succeed(a: Agent) -> None:
    await a.solve()
    await a.driver.act('stop("Done: the task is complete.")')


async def _stop_early(a: Agent) -> None:
    await a.driver.act('stop("Done: the task is complete.")')


async def _half(a: Agent) -> None:
    first = _TWO_STEP.get(a.task.oracle_family)
    if first:
        await FAMILIES[first](a.driver, a.args)
    else:
        half = _HalfDriver(a.driver.step_fn, a.driver.observation, a.driver.drift)
        try:
            await FAMILIES[a.task.oracle_family](half, a.args)
        except _HalfDriver.Stop:
            pass
        a.driver.observation = half.observation
    await a.driver.act('stop("Done: the task is complete.")')


async def _then(a: Agent, page: str, family: str, args: dict[str, str]) -> None:
    """Go to ``page`` and run ``family``; while the row action it needs is not offered yet
    (an instance still Starting or Stopping), reload and retry."""
    for attempt in range(20):
        await a.goto(page)
        try:
            await FAMILIES[family](a.driver, args)
            return
        except DriverError:
            if attempt == 19:
                raise
            await asyncio.sleep(0.5)


async def _undo(a: Agent) -> None:
    page, family, args_of = _undo_plan(a.task)  # type: ignore[misc]
    await a.solve()
    await _then(a, page, family, args_of(a.args))
    await a.driver.act('stop("Done: the task is complete.")')


async def _wrong_region(a: Agent) -> None:
    text = a.driver.observation.text
    bid = find_bid(text, "combobox", "Region")
    m = re.search(r'\] combobox "Region"[^:]*: (.*)$', text, re.M)
    if bid is None or m is None:
        raise DriverError("no region selector on the page")
    other = next(o.rstrip("*") for o in m[1].split(" | ") if "Hangzhou" not in o)
    await a.driver.act(f'select({bid}, "{other}")')
    await a.solve()
    await a.driver.act('stop("Done: the task is complete.")')


async def _forbidden(a: Agent) -> None:
    page, family, args = _forbidden_plan(a.task, a.values)  # type: ignore[misc]
    await a.solve()
    await _then(a, page, family, args)
    await a.driver.act('stop("Done: the task is complete.")')


def _report(reason: str) -> str:
    return 'report_infeasible("' + reason.replace('"', "'").replace("\\", "/")[:500] + '")'


def _named(task: Task, values: Mapping[str, str], last: bool = True) -> str:
    """A control the procedure names (its last step's first name, or its first step's), as
    the procedure writes it."""
    steps = [s for s in steps_of(task.procedure, values) if s.anchors]
    step = steps[-1] if last else steps[0]
    return step.anchors[0]


async def _infeasible_on_feasible(a: Agent) -> None:
    """The agent's own failure reported as a broken doc: it names a control of the procedure
    that the console has (a page it saw, or the inventory, shows it)."""
    await a.driver.act(_report(f"The console has no {_named(a.task, a.values)!r} here; the "
                               "procedure cannot be done as written."))


async def _infeasible_right(a: Agent) -> None:
    """The oracle: it follows the procedure as far as the console allows, then reports."""
    if a.task.oracle_family in FAMILIES:
        await a.solve()
    await a.driver.act(_report(a.task.infeasible_reason))


async def _infeasible_lazy(a: Agent) -> None:
    """The right reason at once, from the start page, without looking."""
    await a.driver.act(_report(a.task.infeasible_reason))


async def _infeasible_wrong_reason(a: Agent) -> None:
    await a.driver.act(_report("The page took too long to load."))


async def _infeasible_names_present(a: Agent) -> None:
    """Reports missing a control that the console has: the first name of the procedure that
    the start page shows."""
    page = a.driver.observation.text.lower()
    anchors = [n for s in steps_of(a.task.procedure, a.values) for n in s.anchors]
    known = _labels().get(a.task.drift, frozenset())
    names = [n for n in anchors if _shows(page, n)] or \
        [n for n in anchors if any(_shows(label, n) for label in known)]
    if not names:
        raise DriverError("neither the start page nor the console's inventory shows anything "
                          "the procedure names")
    await a.driver.act(_report(f"There is no {names[0]!r} in the console."))


@functools.cache
def _labels() -> dict[str, frozenset[str]]:
    return labels_by_drift()


def _shows(page: str, name: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", page) is not None


@dataclass(frozen=True)
class Behaviour:
    name: str
    script: Script
    label: str                                 # success | failure
    applies: Callable[[Task], bool]


def _feasible(t: Task) -> bool:
    return t.expected == "success" and t.oracle_family in FAMILIES


BEHAVIOURS: dict[str, Behaviour] = {b.name: b for b in (
    Behaviour("succeed", _succeed, "success", _feasible),
    Behaviour("stop_early", _stop_early, "failure", _feasible),
    Behaviour("half", _half, "failure", _feasible),
    Behaviour("undo", _undo, "failure", lambda t: _feasible(t) and _undo_plan(t) is not None),
    Behaviour("wrong_region", _wrong_region, "failure",
              lambda t: _feasible(t) and t.oracle_family in _REGIONAL_CREATES),
    Behaviour("forbidden", _forbidden, "failure",
              lambda t: _feasible(t) and _forbidden_plan(t, _probe_values(t)) is not None),
    Behaviour("infeasible_on_feasible", _infeasible_on_feasible, "failure", _feasible),
    Behaviour("infeasible_right", _infeasible_right, "success",
              lambda t: t.expected == "infeasible"),
    Behaviour("infeasible_claim_done", _stop_early, "failure",
              lambda t: t.expected == "infeasible"),
    Behaviour("infeasible_wrong_reason", _infeasible_wrong_reason, "failure",
              lambda t: t.expected == "infeasible"),
    # The claim is true: the inventory shows the console has no such thing, wherever the
    # agent looked (without an inventory the evidence channel leaves it unchecked).
    # (Not for a refusal: without the attempt there is no refusal to quote.)
    Behaviour("infeasible_lazy", _infeasible_lazy, "success",
              lambda t: t.expected == "infeasible" and t.oracle_family != "wrongdoc_refused"),
    Behaviour("infeasible_names_present", _infeasible_names_present, "failure",
              lambda t: t.expected == "infeasible"),
)}
_WRONG = ("undo", "forbidden", "wrong_region", "half", "stop_early", "infeasible_on_feasible")


def _probe_values(task: Task) -> dict[str, str]:
    """Placeholder values good enough to see which plans apply (ids are not needed)."""
    names = {p.id for p in task.prerequisites}
    return {**{n: f"<{n}>" for n in names}, **task.values("probe")}


@dataclass(frozen=True)
class Case:
    task: Task
    behaviour: str

    @property
    def label(self) -> str:
        return BEHAVIOURS[self.behaviour].label


def build_cases(tasks: Sequence[Task], sample: bool = False) -> list[Case]:
    """The validation set: per solvable task the oracle plus one wrong behaviour (in turn over
    those that apply, rarest first so each kind is covered); per wrong-documentation task its
    three behaviours. ``sample``: one case of each behaviour (CI)."""
    cases: list[Case] = []
    used: dict[str, int] = {name: 0 for name in BEHAVIOURS}
    for task in tasks:
        if task.expected == "infeasible":
            names = [n for n, b in BEHAVIOURS.items() if b.applies(task)]
        elif _feasible(task):
            wrong = [n for n in _WRONG if BEHAVIOURS[n].applies(task)]
            names = ["succeed", min(wrong, key=lambda n: (used[n], _WRONG.index(n)))]
        else:
            continue
        for n in names:
            used[n] += 1
            cases.append(Case(task, n))
    if sample:
        seen: set[str] = set()
        picked = []
        for case in cases:
            if case.behaviour not in seen:
                seen.add(case.behaviour)
                picked.append(case)
        return picked
    return cases


def as_policy(behaviour: Behaviour) -> EpisodeScript:
    async def policy(task: Task, values: Mapping[str, str], step_fn: StepFn,
                     observation: Observation) -> StepResult:
        driver = OracleDriver(step_fn, observation, Drift(parse_drift(task.drift)))
        await behaviour.script(Agent(task, values, driver))
        if not driver.results or not driver.results[-1].done:
            raise DriverError(f"{behaviour.name} did not end the episode")
        return driver.results[-1]
    return policy


# ---- scripted judges ---------------------------------------------------------------------------
_DONE_WORDS = re.compile(r"\b(created|granted|added|deleted|started|stopped|restarted|renamed|"
                         r"saved|updated|removed|released|changed|modified|submitted)\b", re.I)
_UNDO_WORDS = re.compile(r"\b(delete|remove|release|revoke)\b", re.I)
_STOPWORDS = {"the", "a", "an", "and", "or", "of", "to", "in", "is", "no", "not", "for", "on",
              "this", "that", "there", "has", "have", "be", "it", "its", "with", "as", "console"}


def _section(text: str, head: str, until: str) -> str:
    start = text.find(head)
    if start < 0:
        return ""
    end = text.find(until, start + len(head)) if until else -1
    return text[start + len(head): end if end >= 0 else len(text)]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2 and w not in _STOPWORDS}


class ScriptedJudge:
    """A deterministic judge over the rendered trajectory (a :class:`ChatClient`). ``angle``:

    - ``outcome``: success when the agent stopped and the final page reports a completed
      change; for a wrong-documentation task, when it reported the procedure infeasible;
    - ``coverage``: success when the agent stopped after at least one action per changing
      procedure step; for wrong documentation, when its reason shares words with the
      reference reason;
    - ``skeptic``: like ``outcome``, but a delete/remove/release action in a task that does not
      ask for one means failure; for wrong documentation, like ``coverage``.
    """

    def __init__(self, angle: str):
        if angle not in ("outcome", "coverage", "skeptic"):
            raise ValueError(f"unknown judge angle {angle!r}")
        self.angle = angle

    def complete(self, messages: Sequence[Mapping[str, str]]) -> str:
        text = messages[-1]["content"]
        task = _section(text, "TASK:", "\n")
        procedure = _section(text, "DOCUMENTED PROCEDURE:", "\n\nACTIONS")
        actions = [line for line in _section(text, "ACTIONS", "\n\nAGENT ENDED").splitlines()[1:]
                   if re.match(r"\d+\. ", line)]
        ending = _section(text, "AGENT ENDED WITH:", "\n").strip()
        page = _section(text, "FINAL PAGE:", "\n\n---")
        question = text[text.rfind("\n---\n"):]
        stopped = ending.startswith("stop")
        if "known NOT to work" in question:
            reference = re.search(r"\(reference: (.*?)\)\. Answer", question, re.S)
            if not ending.startswith("report_infeasible"):
                return self._say("failure", "the agent did not report the procedure infeasible")
            if self.angle == "outcome":
                return self._say("success", "the agent reported the procedure infeasible")
            shared = _words(ending) & _words(reference[1] if reference else "")
            return self._say("success" if len(shared) >= 2 else "failure",
                             f"reason shares {len(shared)} words with the known problem")
        if not stopped:
            return self._say("failure", "the agent did not finish with stop")
        changed = _DONE_WORDS.search(page) is not None
        if self.angle == "coverage":
            steps = len(re.findall(r"^\s*\d+\.", procedure, re.M))
            enough = len(actions) >= max(steps - 2, 1)
            return self._say("success" if enough else "failure",
                             f"{len(actions)} actions for {steps} documented steps")
        if self.angle == "skeptic" and not _UNDO_WORDS.search(task):
            if any(_UNDO_WORDS.search(a) for a in actions):
                return self._say("failure", "the agent deleted or removed something afterwards")
        return self._say("success" if changed else "failure",
                         "the final page reports the change" if changed
                         else "the final page shows no completed change")

    @staticmethod
    def _say(verdict: str, reason: str) -> str:
        return f'Verdict follows.\n{json.dumps({"verdict": verdict, "reason": reason})}'


def scripted_channel() -> JudgeChannel:
    angles = ("outcome", "coverage", "skeptic")
    return JudgeChannel([ScriptedJudge(a) for a in angles],
                        JudgeConfig(k=3, consensus="unanimous"))


@contextmanager
def live_judge(model: str, backend: str = "vllm", max_tokens: int = VOTE_MAX_CHARS
               ) -> Iterator[tuple[str, str]]:
    """Serve ``model`` (a folder, or ``default``) as a judge on an embedded Ray cluster: one
    PolicyServer replica behind the project's OpenAI-compatible chat API
    (:func:`cluster.judges.serve_judge`); yields ``(base_url, model_name)``."""
    import ray

    from cluster.judges import serve_judge
    from rollout_service.policy import PolicyConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    stop = None
    try:
        policy = PolicyConfig(backend=backend, dtype="float32", max_model_len=4096,
                              kv_cache_gib=1.0 if backend == "vllm" else 0.0,
                              enforce_eager=True, num_cpus_per_replica=1.0)
        url, name, stop = serve_judge(model, policy, max_tokens=max_tokens)
        yield url, name
    finally:
        if stop is not None:
            stop()
        ray.shutdown()


# ---- running and scoring -----------------------------------------------------------------------
@dataclass
class Scored:
    task_id: str
    behaviour: str
    label: str
    env_error: bool
    rule: str
    judges: str
    fused: str
    decided_by: str
    reward: float
    reasons: list[str] = field(default_factory=list)
    steps: int = 0
    leaked: int = 0
    script_error: str = ""           # the scripted agent could not carry out its behaviour
    evidence: str = "undetermined"   # the evidence channel's verdict
    evidence_kind: str = ""          # what it found (confirmed, contradicted, ...)
    evidence_decisive: bool = False  # whether fusion lets it decide (reward_service.fusion)
    judge_s: float = 0.0             # how long the judge channel took
    judge_votes: list[str] = field(default_factory=list)   # "verdict: reason" per judge




def score_case(case: Case, outcome: EpisodeOutcome, channel: JudgeChannel | None,
               judge_this: bool = True) -> Scored:
    env_error = outcome.status == "env_error"
    traj = outcome.trajectory
    answer = traj.answer if traj is not None else None
    infeasible = traj.infeasible if traj is not None else None
    rule = outcome.reward.rule_verdict if outcome.reward is not None else None
    # A behaviour that did not reach its own end (stop or report) is not the case it claims
    # to be: kept out of the metrics and reported.
    script_error = "" if env_error or answer is not None or \
        infeasible is not None else "; ".join(outcome.reasons)[:300] or "no answer"
    evidence = outcome.reward.evidence_verdict if outcome.reward is not None else None
    verdict: JudgeVerdict | None = None
    result: RewardResult | None = None
    judge_s = 0.0
    if not env_error and traj is not None:
        rule_or_evidence = outcome.reward is not None and \
            outcome.reward.decided_by in ("rule", "evidence")
        if channel is not None and (judge_this or not rule_or_evidence):
            # Judged (every case, or every n-th and those the other channels leave open), so
            # that the channel's own accuracy is measured; fusion listens to it only where
            # the rule and the evidence abstain.
            t0 = time.perf_counter()
            verdict = channel.judge(case.task.title, case.task.procedure, traj.actions,
                                    traj.final_observation, answer, infeasible,
                                    expected=case.task.expected,
                                    reference_reason=case.task.infeasible_reason)
            judge_s = time.perf_counter() - t0
        result = fuse(case.task.expected, rule, verdict, None, evidence=evidence)
    return Scored(case.task.id, case.behaviour, case.label, env_error,
                  rule.verdict if rule else "undetermined",
                  verdict.verdict if verdict else "undetermined",
                  result.verdict if result else "undetermined",
                  result.decided_by if result else "env_error",
                  result.reward if result else 0.0,
                  list(result.reasons if result else outcome.reasons)[:4],
                  len(traj.turns) if traj is not None else 0, len(outcome.leaked), script_error,
                  evidence.verdict if evidence else "undetermined",
                  evidence.kind if evidence else "",
                  evidence_decides(case.task.expected, evidence), round(judge_s, 3),
                  [f"{v.verdict}: {v.reason[:160]}" for v in verdict.votes] if verdict else [])


def _rule_decisive(s: Scored, expected: str) -> bool:
    return s.rule == "failure" or (s.rule == "success" and expected == "success")


def report(scored: Sequence[Scored], tasks: Mapping[str, Task]) -> dict:
    """The metrics of the module docstring."""
    ok = [s for s in scored if not s.env_error and not s.script_error]

    def channel(verdict_of: Callable[[Scored], str], decisive: Callable[[Scored], bool]
                ) -> dict[str, float | int | None]:
        decided = [s for s in ok if decisive(s)]
        right = sum(verdict_of(s) == s.label for s in decided)
        said_yes = [s for s in decided if verdict_of(s) == "success"]
        positives = [s for s in ok if s.label == "success"]
        return {
            "accuracy": round(right / len(decided), 4) if decided else None,
            "coverage": round(len(decided) / len(ok), 4) if ok else None,
            "precision": round(sum(s.label == "success" for s in said_yes) / len(said_yes), 4)
            if said_yes else None,
            "recall": round(sum(verdict_of(s) == "success" and decisive(s) for s in positives)
                            / len(positives), 4) if positives else None,
            "wrong": sum(verdict_of(s) != s.label for s in decided),
        }

    rule = channel(lambda s: s.rule, lambda s: _rule_decisive(s, tasks[s.task_id].expected))
    evidence = channel(lambda s: s.evidence, lambda s: s.evidence_decisive)
    judge = channel(lambda s: s.judges, lambda s: s.judges in ("success", "failure"))
    fused = channel(lambda s: s.fused, lambda s: True)
    # Rule and evidence together, as fusion would without judges.
    both = channel(lambda s: s.rule if _rule_decisive(s, tasks[s.task_id].expected)
                   else s.evidence,
                   lambda s: _rule_decisive(s, tasks[s.task_id].expected)
                   or s.evidence_decisive)
    by_behaviour: dict[str, dict[str, int]] = {}
    for s in ok:
        row = by_behaviour.setdefault(s.behaviour, {"n": 0, "fused_right": 0,
                                                     "rule_decisive": 0,
                                                     "evidence_decisive": 0})
        row["n"] += 1
        row["fused_right"] += s.fused == s.label
        row["rule_decisive"] += _rule_decisive(s, tasks[s.task_id].expected)
        row["evidence_decisive"] += s.evidence_decisive
    votes = [(v.split(":", 1)[0], s.label) for s in ok for v in s.judge_votes]
    valid = [(v, label) for v, label in votes if v in ("success", "failure")]
    return {
        "n": len(ok),
        "env_errors": sum(s.env_error for s in scored),
        "script_errors": [f"{s.task_id}/{s.behaviour}: {s.script_error}" for s in scored
                          if s.script_error],
        "labels": {"success": sum(s.label == "success" for s in ok),
                   "failure": sum(s.label == "failure" for s in ok)},
        "infeasible_cases": sum(tasks[s.task_id].expected == "infeasible" for s in ok),
        "rule_accuracy_decisive": rule["accuracy"],
        "rule_coverage": rule["coverage"],
        "evidence_accuracy_decisive": evidence["accuracy"],
        "evidence_coverage": evidence["coverage"],
        "rule_evidence_accuracy": both["accuracy"],
        "rule_evidence_coverage": both["coverage"],
        "judge_accuracy": judge["accuracy"],
        "judge_coverage": judge["coverage"],
        "judge_valid_rate": round(len(valid) / len(votes), 4) if votes else None,
        "judge_vote_accuracy": round(sum(v == label for v, label in valid) / len(valid), 4)
        if valid else None,
        "fused_accuracy": fused["accuracy"],
        "undetermined_rate": round(sum(s.fused == "undetermined" for s in ok) / len(ok), 4)
        if ok else None,
        "decided_by": dict(Counter(s.decided_by for s in ok)),
        "judge_seconds_median": round(statistics.median(s.judge_s for s in ok), 3)
        if ok and any(s.judge_s for s in ok) else None,
        "judge_votes": dict(Counter(v for v, _ in votes)),
        "judge_invalid_reasons": dict(Counter(
            v.split(":", 1)[1].strip()[:60] for s in ok for v in s.judge_votes
            if v.startswith("invalid")).most_common(5)),
        "rule": rule, "evidence": evidence, "rule_evidence": both, "judge": judge,
        "fused": fused,
        "by_behaviour": by_behaviour,
        "leaked_resources": sum(s.leaked for s in scored),
        "rule_errors": [asdict(s) for s in ok
                        if _rule_decisive(s, tasks[s.task_id].expected) and s.rule != s.label],
        "evidence_errors": [f"{s.task_id}/{s.behaviour}: {s.evidence_kind} -> {s.evidence}; "
                            f"{'; '.join(s.reasons)[:300]}"
                            for s in ok if s.evidence_decisive and s.evidence != s.label],
        "fused_errors": [f"{s.task_id}/{s.behaviour}: {s.fused} by {s.decided_by}"
                         for s in ok if s.fused != s.label],
    }


def _progress(msg: str) -> None:
    print(f"[validate] {msg}", file=sys.stderr, flush=True)


async def run_cases(cases: Sequence[Case], url: str, endpoint: str, redis_url: str,
                    channel: JudgeChannel | None, workers: int = 2,
                    console_labels: Mapping[str, frozenset[str]] | None = None,
                    judge_every: int = 1) -> list[Scored]:
    pool = PoolConfig(redis_url=redis_url, key_prefix="validate:pool")
    accounts = load_pool_accounts(pool)
    tasks = list({c.task.id: c.task for c in cases}.values())
    # The service scores the rule and evidence channels; the judges are asked here, on every
    # case, so that their own accuracy is measured too.
    service = RewardService(tasks, accounts, endpoint, console_labels=console_labels)
    runner = EpisodeRunner(accounts, endpoint, service.score, ready_timeout_s=60)
    queue: asyncio.Queue[tuple[int, Case]] = asyncio.Queue()
    for item in enumerate(cases):
        queue.put_nowait(item)
    results: list[Scored | None] = [None] * len(cases)
    done = [0]
    t0 = time.monotonic()

    # Judging (a served model may take many seconds) runs beside the episodes, in threads of
    # its own, so that the browsers go on with the next case meanwhile.
    judging = ThreadPoolExecutor(max(2, 2 * workers), thread_name_prefix="validate-judge")
    scoring: list[asyncio.Future[None]] = []

    def scored_case(i: int, case: Case, outcome: EpisodeOutcome) -> None:
        scored = score_case(case, outcome, channel, i % judge_every == 0)
        results[i] = scored
        done[0] += 1
        mark = "ok" if scored.fused == scored.label else "WRONG"
        _progress(f"{done[0]}/{len(cases)} {case.task.id} {case.behaviour}: label "
                  f"{case.label}, rule {scored.rule}, evidence {scored.evidence} "
                  f"({scored.evidence_kind or '-'}), judges {scored.judges}, fused "
                  f"{scored.fused} [{mark}] ({time.monotonic() - t0:.0f} s)")

    async def work(index: int) -> None:
        env = LeasedEnvWorker(WorkerConfig(console_url=url), pool, f"validate-{index}")
        loop = asyncio.get_running_loop()
        try:
            while not queue.empty():
                i, case = queue.get_nowait()
                outcome = await runner.run(env, case.task,
                                           scripted_policy(as_policy(BEHAVIOURS[case.behaviour])),
                                           max_steps=MAX_STEPS)
                scoring.append(loop.run_in_executor(judging, scored_case, i, case, outcome))
        finally:
            await env.drain()

    try:
        await asyncio.gather(*(work(i) for i in range(workers)))
        await asyncio.gather(*scoring)
    finally:
        judging.shutdown(wait=False, cancel_futures=True)
    return [r for r in results if r is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reward_validate",
                                     description="Validate the reward channels on labelled "
                                                 "scripted trajectories.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sample", action="store_true",
                        help="one case per behaviour (the CI sample)")
    parser.add_argument("--tasks", default="", help="regular expression over task ids")
    parser.add_argument("--suite", type=Path, default=TASKS_DIR)
    parser.add_argument("--workers", type=int, default=2,
                        help="browsers (and accounts) in parallel")
    parser.add_argument("--judge", choices=("none", "live", "openai", "scripted"),
                        default="none",
                        help="none: no judge channel; live: serve --judge-model (a model "
                             "folder, or 'default') as a PolicyServer replica behind the "
                             "OpenAI-compatible API and judge with it; openai: an endpoint "
                             "already running (--judge-url, --judge-model); scripted: the "
                             "deterministic stand-ins of the unit tests")
    parser.add_argument("--judge-url", default="")
    parser.add_argument("--judge-model", default="")
    parser.add_argument("--judge-deadline", type=float, default=120.0,
                        help="seconds the judge channel may take per case")
    parser.add_argument("--judge-backend", choices=("vllm", "transformers"), default="vllm",
                        help="how --judge live serves the model")
    parser.add_argument("--judge-max-tokens", type=int, default=VOTE_MAX_CHARS,
                        help="the longest reply of one judge (by default the longest vote "
                             "structured output allows)")
    parser.add_argument("--judge-chars", type=int, default=6000,
                        help="the rendering's budget of characters (the episode as the "
                             "judges read it)")
    parser.add_argument("--judge-free-text", action="store_true",
                        help="LLM judges answer free text (no response_format json_schema), "
                             "for an endpoint without structured output")
    parser.add_argument("--judge-every", type=int, default=1,
                        help="judge every n-th case (and every case the rule and the evidence "
                             "leave open); 1: all (a small CPU judge takes many seconds a case)")
    parser.add_argument("--no-inventory", action="store_true",
                        help="check claims without the console's inventory (pages seen only)")
    parser.add_argument("--judges", type=int, default=3, help="k for --judge openai")
    parser.add_argument("--consensus", choices=("unanimous", "majority"), default="unanimous")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write every scored case as JSON lines here")
    args = parser.parse_args(argv)
    if not 1 <= args.workers <= 8:
        parser.error("--workers must be 1 to 8")
    if args.judge_every < 1:
        parser.error("--judge-every must be >= 1")
    if args.judge == "openai" and not (args.judge_url and args.judge_model):
        parser.error("--judge openai needs --judge-url and --judge-model")
    tasks = [t for t in load_suite(args.suite) if re.search(args.tasks, t.id)]
    cases = build_cases(tasks, sample=args.sample)
    if not cases:
        parser.error(f"no validation case for tasks matching {args.tasks!r}")
    if args.judge == "live" and not args.judge_model:
        parser.error("--judge live needs --judge-model (a model folder, or 'default')")
    labels = None if args.no_inventory else labels_by_drift()
    started = time.monotonic()
    with ExitStack() as stack:
        judge_model = ""
        if args.judge == "scripted":
            channel: JudgeChannel | None = scripted_channel()
        elif args.judge in ("openai", "live"):
            url, judge_model = args.judge_url, args.judge_model
            if args.judge == "live":
                _progress(f"serving the judge model {args.judge_model!r} "
                          f"({args.judge_backend})")
                url, judge_model = stack.enter_context(
                    live_judge(args.judge_model, args.judge_backend, args.judge_max_tokens))
            channel = JudgeChannel(
                judge_clients(url, judge_model,
                              [(0.0, 0.5, 1.0)[i % 3] for i in range(args.judges)],
                              api_key_env=None if args.judge == "live" else "OPENAI_API_KEY",
                              timeout_s=args.judge_deadline,
                              max_tokens=args.judge_max_tokens),
                JudgeConfig(k=args.judges, consensus=args.consensus,
                            deadline_s=args.judge_deadline,
                            max_trajectory_chars=args.judge_chars,
                            structured=not args.judge_free_text and not (
                                args.judge == "live" and args.judge_backend != "vllm")))
        else:
            channel = None
        cloud, redis_server = stack.enter_context(
            cloud_and_redis("validate-", ("--transition", "1", "--network-ready", "0.3")))
        _progress(f"{len(cases)} cases over {len({c.task.id for c in cases})} tasks against "
                  f"{cloud.url}, {args.workers} browsers")
        scored = asyncio.run(run_cases(cases, cloud.url, cloud.endpoint, redis_server.url,
                                       channel, args.workers, labels, args.judge_every))
    summary = report(scored, {t.id: t for t in tasks})
    summary["judge_kind"] = args.judge
    summary["judge_model"] = judge_model or None
    summary["judge_structured"] = channel.config.structured if channel is not None and \
        args.judge in ("openai", "live") else None
    summary["judged_cases"] = sum(bool(s.judge_votes) for s in scored)
    summary["inventory"] = sorted(labels) if labels is not None else None
    summary["wall_s"] = round(time.monotonic() - started, 1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(asdict(s)) + "\n" for s in scored))
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
