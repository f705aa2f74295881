"""The LLM-judge channel of the reward service: k chat models read a compact rendering of an
episode and each vote ``success`` or ``failure``; a consensus rule turns the votes into one
:class:`JudgeVerdict`.

Judges are not clones: each gets its own system prompt (a different reviewing angle, cycled
from :attr:`JudgeConfig.system_prompts`), and callers may also give each judge its own client
(another model, or another temperature: see :func:`judge_clients`). One client may serve all k
judges; it is then called k times concurrently with the k prompts.

A judge must end its reply with one JSON object (:data:`VOTE_SCHEMA`)::

    {"verdict": "success" | "failure", "reason": "..."}

With :attr:`JudgeConfig.structured` (the default) the channel asks for it under structured
output: each call carries :data:`RESPONSE_FORMAT` (OpenAI's ``response_format`` of type
``json_schema``) to clients whose ``complete`` takes ``response_format``
(:class:`infra.llm.OpenAIChatClient`), so a server that honours it (vLLM, the project's chat
API over vLLM replicas) can only produce a vote; without it (an endpoint that refuses
``response_format``) the judges answer free text, parsed the same way. The reply is validated
either way (structured output cut by ``max_tokens`` is still not a vote).

Anything else (no object, prose after it, another verdict word, no reason, a reply that is
too long) is an ``invalid`` vote, never an exception; so is a judge whose endpoint fails or
does not answer within :attr:`JudgeConfig.deadline_s`. Invalid votes are abstentions.

Consensus (``quorum`` = :attr:`JudgeConfig.min_valid`, by default ``k // 2 + 1``, i.e. a
strict majority of the k judges must cast a valid vote, else ``undetermined``):

- ``unanimous``: every valid vote agrees -> that verdict; any disagreement -> undetermined.
- ``majority``: the verdict with strictly more valid votes than the other wins; a tie ->
  undetermined.

In the training loop (:class:`JudgeChannel`): every episode's verdict comes within
:attr:`JudgeConfig.deadline_s` whatever the endpoint does (refuses connections, hangs, answers
garbage or 5xx): such a judge is an invalid vote. Calls over the whole channel are limited to
:attr:`JudgeConfig.concurrency` (a call that gets no slot before the deadline is an invalid
vote, ``overloaded``, never queued for ever); transport errors, 5xx and 429 are retried with a
short backoff while the deadline leaves room. :class:`JudgeMetrics` count the calls by
outcome, their latency, the failed attempts by kind, and the judges' agreement with the rule
on audited episodes (``consolerl_reward_judge_*``).

The model's text is only parsed as JSON, never executed.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Annotated, Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from consolerl.config import AtLeast, Between, Checked, NonEmpty, OneOf
from consolerl.errors import ConfigError
from consolerl.rewards import JudgeVerdict, JudgeVote
from infra.llm import ChatClient, ChatError, OpenAIChatClient

log = logging.getLogger(__name__)

CONSENSUS = ("unanimous", "majority")
VOTES = ("success", "failure", "invalid")
VERDICTS = ("success", "failure", "undetermined")
EXPECTED = ("success", "infeasible")

DEFAULT_SYSTEM_PROMPTS: tuple[str, ...] = (
    "You are a strict verifier of web-agent episodes in a cloud console. Judge only from the "
    "evidence shown: the actions taken and the final page. Do not give credit for intent.",
    "You are a skeptical reviewer of web-agent episodes in a cloud console. Look for "
    "shortcuts, unfinished steps, wrong resources or wrong values before accepting success.",
    "You review whether a web agent followed a documented cloud-console procedure to its end. "
    "Compare each documented step with the actions, and the final page with the goal.",
)
_INSTRUCTIONS = {
    "success": "Did the agent complete the task? Answer success only if the actions and the "
               "final page show the task done; failure if it stopped early, did something "
               "else, or reported the task infeasible.",
    "infeasible": "This documented procedure is known NOT to work as written{reference}. "
                  "Answer success only if the agent reported the task infeasible "
                  "(report_infeasible) for a reason consistent with that; failure if it "
                  "claimed to have completed the task, gave an unrelated reason, or gave none.",
}
# The vote, as a JSON schema: what structured output is constrained to and what
# :func:`parse_vote` accepts (the verdict's values come from here; a free-text reason longer
# than ``maxLength`` is cut by the parser, not refused, and other keys of a free-text reply are
# ignored). Under structured output the reason is also held to ``pattern``: printable ASCII
# without a quote or a backslash (no escapes, which take several tokens a character), at most
# ``maxLength`` characters; with no free whitespace either (the project's vLLM server asks for
# none) the longest constrained reply is :data:`VOTE_MAX_CHARS` characters, so a reply budget
# of that many tokens always closes its JSON object.
REASON_MAX_CHARS = 80
VOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {      # the reason first: a constrained judge writes it before it votes
        "reason": {"type": "string", "minLength": 1, "maxLength": REASON_MAX_CHARS,
                   "pattern": f"^[ -!#-\\[\\]-~]{{1,{REASON_MAX_CHARS}}}$"},
        "verdict": {"type": "string", "enum": ["success", "failure"]},
    },
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}
# ``{"reason": "...", "verdict": "failure"}`` with the longest reason and verdict.
VOTE_MAX_CHARS = len(json.dumps({"reason": "", "verdict": "failure"})) + REASON_MAX_CHARS
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "judge_vote", "strict": True, "schema": VOTE_SCHEMA},
}
_VERDICT_VALUES = tuple(VOTE_SCHEMA["properties"]["verdict"]["enum"])
_FORMAT = ('End your reply with one JSON object and nothing after it: '
           '{"reason": "<one sentence>", "verdict": "success" or "failure"}')
_TRAILING_FENCE = re.compile(r"```\s*$")


@dataclass(frozen=True)
class JudgeConfig(Checked):
    """The judge channel's settings.

    ``k``: number of judges; ``consensus``: ``unanimous`` | ``majority``; ``min_valid``: valid
    votes needed for any verdict (``None``: ``k // 2 + 1``); ``max_trajectory_chars``: the
    rendering's budget; ``system_prompts``: cycled over the judges so that they are not clones;
    ``max_reply_chars``: longer replies are invalid votes; ``max_json_chars``: the final JSON
    object must fit in this tail of the reply; ``deadline_s``: judges that have not answered by
    then abstain (``None``: wait for the clients' own timeouts); ``structured``: ask for the
    vote under structured output (:data:`RESPONSE_FORMAT`, sent to clients that take
    ``response_format``); false: free text only, for an endpoint that refuses it.

    Bounds for a judge in the training loop: ``timeout_s``: one call's timeout (``None``: the
    client's own; never past the deadline for clients that take one); ``concurrency``: calls
    in flight over the whole channel, every episode together (``None``: no limit; a call that
    gets no slot before the deadline is an invalid vote, ``overloaded``); ``retries``: more
    attempts after a transport error, a 5xx or a 429, ``retry_backoff_s`` apart (doubling),
    only while the deadline leaves room; ``audit_fraction``: the share of episodes that the
    rule decided which the caller also sends to the judges, only to measure their agreement
    with the rule (:meth:`JudgeChannel.audits`).
    """

    k: Annotated[int, AtLeast(1)] = 3
    consensus: Annotated[str, OneOf(CONSENSUS)] = "unanimous"
    min_valid: int | None = None
    max_trajectory_chars: Annotated[int, AtLeast(400)] = 12_000
    system_prompts: tuple[Annotated[str, NonEmpty()], ...] = DEFAULT_SYSTEM_PROMPTS
    max_reply_chars: Annotated[int, AtLeast(1)] = 64_000
    max_json_chars: Annotated[int, AtLeast(16)] = 4_000
    max_reason_chars: Annotated[int, AtLeast(1)] = 500
    deadline_s: Annotated[float, AtLeast(0, open=True)] | None = None
    timeout_s: Annotated[float, AtLeast(0, open=True)] | None = None
    concurrency: Annotated[int, AtLeast(1)] | None = None
    retries: Annotated[int, Between(0, 10)] = 0
    retry_backoff_s: Annotated[float, AtLeast(0)] = 0.25
    audit_fraction: Annotated[float, Between(0, 1)] = 0.0
    structured: bool = True

    config_name = "JudgeConfig"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_valid is not None and (isinstance(self.min_valid, bool)
                                           or not isinstance(self.min_valid, int)
                                           or not 1 <= self.min_valid <= self.k):
            raise ConfigError(f"{self.config_name}.min_valid: must be an integer in 1..k "
                              f"({self.k}) or null, got {self.min_valid!r}")
        if not self.system_prompts or not all(p.strip() for p in self.system_prompts):
            raise ConfigError(f"{self.config_name}.system_prompts: must be a non-empty list "
                              "of non-empty strings")
        object.__setattr__(self, "system_prompts", tuple(self.system_prompts))

    @property
    def quorum(self) -> int:
        return self.min_valid if self.min_valid is not None else self.k // 2 + 1


# ---- rendering ---------------------------------------------------------------------------------
def _middle(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters by dropping its middle."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters omitted ...]\n"
    while True:
        keep = max(limit - len(marker), 0)
        omitted = len(text) - keep
        new = f"\n[... {omitted} characters omitted ...]\n"
        if len(new) == len(marker):
            break
        marker = new
    if keep == 0:
        return text[:limit]
    head = (keep + 1) // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


def _actions_block(actions: Sequence[str], limit: int) -> str:
    lines = [f"{i}. {_middle(a, 300)}" for i, a in enumerate(actions, 1)]
    text = "\n".join(lines) if lines else "(none)"
    if len(text) <= limit:
        return text
    # Keep whole lines from both ends: the first steps show the path, the last the ending.
    head: list[str] = []
    tail: list[str] = []
    used = 40                                       # room for the "omitted" line
    lo, hi = 0, len(lines) - 1
    while lo <= hi:
        line = lines[lo] if len(head) <= len(tail) else lines[hi]
        if used + len(line) + 1 > limit:
            break
        used += len(line) + 1
        if len(head) <= len(tail):
            head.append(line)
            lo += 1
        else:
            tail.append(line)
            hi -= 1
    return "\n".join([*head, f"[... {hi - lo + 1} actions omitted ...]", *reversed(tail)])


def render_trajectory(task_title: str, procedure: str, actions: Sequence[str],
                      final_observation_text: str, answer: str | None,
                      infeasible_reason: str | None, max_chars: int = 12_000) -> str:
    """The episode as the judges read it: task, documented procedure, numbered actions, how the
    agent ended, and the final page's accessibility text. Deterministic (the same input gives
    the same text); at most ``max_chars`` characters, long parts cut from the middle (the final
    page gets what the other parts leave). It shows only what it is given, so callers pass
    canonical action text (never typed secrets) and the observation text."""
    if max_chars < 400:
        raise ConfigError(f"render_trajectory.max_chars: must be >= 400, got {max_chars!r}")
    if infeasible_reason is not None:
        ending = f"report_infeasible: {_middle(infeasible_reason, 1000)}"
    elif answer is not None:
        ending = f"stop with answer: {_middle(answer, 1000)}"
    else:
        ending = "no answer (the episode ended without stop or report_infeasible)"
    parts = [
        f"TASK: {_middle(task_title, 300)}",
        "DOCUMENTED PROCEDURE:\n" + _middle(procedure.strip(), max_chars // 4),
        f"ACTIONS ({len(actions)}):\n" + _actions_block(actions, max_chars // 4),
        f"AGENT ENDED WITH: {ending}",
    ]
    fixed = "\n\n".join(parts) + "\n\nFINAL PAGE:\n"
    room = max(max_chars - len(fixed), 0)
    text = fixed + _middle(final_observation_text.strip(), room)
    return _middle(text, max_chars)


# ---- parsing -----------------------------------------------------------------------------------
def parse_vote(judge: str, reply: object, config: JudgeConfig | None = None) -> JudgeVote:
    """A judge's reply as a vote. The reply must end with a JSON object (a closing code fence
    and whitespace may follow it) holding ``verdict`` (exactly ``success`` or ``failure``) and
    a non-empty string ``reason`` (:data:`VOTE_SCHEMA`); when the reply holds several objects
    the last one counts. Anything else is an ``invalid`` vote naming what was wrong, whether
    or not the reply was produced under structured output (a reply cut by ``max_tokens`` is
    not a vote)."""
    cfg = config or JudgeConfig()
    if not isinstance(reply, str):
        return JudgeVote(judge, "invalid", f"reply is not text ({type(reply).__name__})")
    if len(reply) > cfg.max_reply_chars:
        return JudgeVote(judge, "invalid", f"reply is longer than {cfg.max_reply_chars} chars")
    text = _TRAILING_FENCE.sub("", reply.rstrip()).rstrip()
    if not text.endswith("}"):
        return JudgeVote(judge, "invalid", "reply does not end with a JSON object")
    obj = _final_object(text, cfg.max_json_chars)
    if obj is None:
        return JudgeVote(judge, "invalid", f"reply does not end with a JSON object (of at most "
                                           f"{cfg.max_json_chars} chars)")
    verdict, reason = obj.get("verdict"), obj.get("reason")
    if verdict not in _VERDICT_VALUES:
        return JudgeVote(judge, "invalid", f"verdict must be 'success' or 'failure', "
                                           f"got {_middle(repr(verdict), 60)}")
    if not isinstance(reason, str) or not reason.strip():
        return JudgeVote(judge, "invalid", "reason must be a non-empty string")
    return JudgeVote(judge, verdict, _middle(reason.strip(), cfg.max_reason_chars))


def _final_object(text: str, max_json_chars: int) -> dict | None:
    """The outermost JSON object that ends exactly at the end of ``text``."""
    decoder = json.JSONDecoder()
    start = max(len(text) - max_json_chars, 0)
    i = text.find("{", start)
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):   # the C decoder recurses per nesting level
            pass
        else:
            if end == len(text) and isinstance(value, dict):
                return value
        i = text.find("{", i + 1)
    return None


# ---- the channel -------------------------------------------------------------------------------
def judge_clients(base_url: str, model: str, temperatures: Sequence[float],
                  api_key_env: str | None = "OPENAI_API_KEY", timeout_s: float = 60.0,
                  max_tokens: int = 1024) -> list[ChatClient]:
    """One :class:`OpenAIChatClient` per temperature (judges that also sample differently)."""
    return [OpenAIChatClient(base_url, model, api_key_env=api_key_env, timeout_s=timeout_s,
                             temperature=t, max_tokens=max_tokens) for t in temperatures]


def consensus(votes: Sequence[JudgeVote], config: JudgeConfig) -> JudgeVerdict:
    """Apply the configured consensus rule to the votes (see the module docstring)."""
    votes = tuple(votes)
    yes = sum(v.verdict == "success" for v in votes)
    no = sum(v.verdict == "failure" for v in votes)
    tally = f"{yes} success, {no} failure, {len(votes) - yes - no} invalid of {config.k}"
    if yes + no < config.quorum:
        return JudgeVerdict("undetermined", votes,
                            f"too few valid votes ({tally}; need {config.quorum})")
    if config.consensus == "unanimous":
        if yes and no:
            return JudgeVerdict("undetermined", votes, f"judges disagree ({tally})")
        return JudgeVerdict("success" if yes else "failure", votes, f"unanimous ({tally})")
    if yes == no:
        return JudgeVerdict("undetermined", votes, f"tie ({tally})")
    return JudgeVerdict("success" if yes > no else "failure", votes, f"majority ({tally})")


# One judge call's outcome (retries included) and one failed attempt's kind.
CALL_OUTCOMES = ("ok", "invalid_reply", "http_error", "transport_error", "timeout", "overloaded",
                 "client_error")
FAILURE_KINDS = ("transport_error", "timeout", "http_5xx", "http_429", "http_4xx",
                 "malformed_response", "invalid_reply", "overloaded", "deadline", "client_error")
AGREEMENT = ("agree", "disagree", "undetermined")
_MIN_CALL_S = 0.05          # a call with less time left than this is not started
_RETRYABLE = ("transport_error", "http_5xx", "http_429")
_OUTCOME_OF = {"transport_error": "transport_error", "timeout": "timeout",
               "http_5xx": "http_error", "http_429": "http_error", "http_4xx": "http_error",
               "malformed_response": "invalid_reply", "client_error": "client_error"}


class JudgeMetrics:
    """The judge channel's Prometheus metrics (``consolerl_reward_judge_*``; the reward
    service's vote and verdict counters are in its own :class:`RewardMetrics`)."""

    def __init__(self, registry: CollectorRegistry):
        self.calls = Counter(
            "consolerl_reward_judge_calls_total", "Judge calls (one per judge and episode, "
            "its retries included), by outcome: ok (a reply that is a vote), invalid_reply "
            "(an answer that is not a vote), http_error (an error status, after the retries), "
            "transport_error (no connection, after the retries), timeout (no answer within "
            "the call's timeout or the episode's deadline), overloaded (no free slot under "
            "the channel's concurrency limit before the deadline), client_error (the client "
            "failed otherwise).", ["outcome"], registry=registry)
        self.seconds = Histogram(
            "consolerl_reward_judge_call_seconds", "Time of one judge call, from asking for a "
            "slot to its outcome (retries included).", registry=registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300))
        self.failures = Counter(
            "consolerl_reward_judge_failures_total", "Failed judge attempts (every retry "
            "counts), by kind: transport_error, timeout, http_5xx, http_429, http_4xx, "
            "malformed_response (a 200 without a completion), invalid_reply (a completion "
            "that is not a vote), overloaded, deadline (still running at the episode's "
            "deadline), client_error.", ["kind"], registry=registry)
        self.agreement = Counter(
            "consolerl_reward_judge_rule_agreement_total", "Episodes the rule decided that "
            "the judges also judged (audits), by the judges' verdict against the rule's: "
            "agree, disagree, or undetermined (the judges gave none).", ["with_rule"],
            registry=registry)
        for counter, values in ((self.calls, CALL_OUTCOMES), (self.failures, FAILURE_KINDS),
                                (self.agreement, AGREEMENT)):
            for value in values:
                counter.labels(value)

    def record_call(self, outcome: str, seconds: float) -> None:
        self.calls.labels(outcome).inc()
        self.seconds.observe(seconds)

    def record_failure(self, kind: str) -> None:
        self.failures.labels(kind).inc()

    def record_agreement(self, rule_verdict: str, judge_verdict: str) -> None:
        """One audited episode: ``rule_verdict`` (success | failure; anything else is not an
        audit and is not counted) against the judges' verdict."""
        if rule_verdict not in ("success", "failure"):
            return
        if judge_verdict not in ("success", "failure"):
            self.agreement.labels("undetermined").inc()
        else:
            self.agreement.labels("agree" if judge_verdict == rule_verdict else "disagree").inc()


def _failure_kind(exc: ChatError) -> str:
    kind, status = getattr(exc, "kind", ""), getattr(exc, "status", 0)
    if kind == "timeout":
        return "timeout"
    if kind == "transport":
        return "transport_error"
    if kind == "malformed":
        return "malformed_response"
    if kind == "http" or status:
        return "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
    return "client_error"


class _Call:
    """One judge call's bookkeeping: its outcome is recorded once, by the call's thread or by
    the episode's deadline, whichever comes first."""

    def __init__(self, metrics: JudgeMetrics | None):
        self.metrics = metrics
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self.done = False
        self.queued = True              # still waiting for a slot under the concurrency limit

    def finish(self, outcome: str) -> bool:
        with self._lock:
            if self.done:
                return False
            self.done = True
        if self.metrics is not None:
            self.metrics.record_call(outcome, time.monotonic() - self.started)
        return True

    def fail(self, kind: str) -> None:
        if self.metrics is not None and not self.done:
            self.metrics.record_failure(kind)


class JudgeChannel:
    """k judges over one or k chat clients (one client is reused with the k system prompts).
    :meth:`judge` calls them concurrently, so k slow endpoints cost about one round trip.

    Safe in the training loop: with :attr:`JudgeConfig.deadline_s` set, :meth:`judge` returns
    within about that time whatever the endpoint does (down, slow, garbage, 5xx): a judge
    without a vote by then abstains, and too many abstentions make the verdict
    ``undetermined``; it never raises for an endpoint's failure. Calls over the whole channel
    (every episode scored at once) are limited to :attr:`JudgeConfig.concurrency`.

    ``clients``: the chat clients; or ``client_factory``: a picklable callable returning them,
    called on first use, so that a channel crosses into a Ray actor as its recipe (HTTP
    clients do not pickle) and reads its API key there. ``registry``: where its
    :class:`JudgeMetrics` go (:meth:`bind_metrics`; the reward service binds its own)."""

    def __init__(self, clients: Sequence[ChatClient] | None = None,
                 config: JudgeConfig | None = None, *,
                 client_factory: Callable[[], Sequence[ChatClient]] | None = None,
                 registry: CollectorRegistry | None = None):
        self.config = config or JudgeConfig()
        if (clients is None) == (client_factory is None):
            raise ConfigError("JudgeChannel.clients: give either clients or client_factory")
        self.client_factory = client_factory
        self._clients = self._check(list(clients)) if clients is not None else None
        self._registry: CollectorRegistry | None = None
        self.metrics: JudgeMetrics | None = None
        self._init_runtime()
        if registry is not None:
            self.bind_metrics(registry)

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        limit = self.config.concurrency
        self._slots = threading.BoundedSemaphore(limit) if limit is not None else None

    def _check(self, clients: list[ChatClient]) -> list[ChatClient]:
        if len(clients) not in (1, self.config.k):
            raise ConfigError(f"JudgeChannel.clients: give 1 or k ({self.config.k}) clients, "
                              f"got {len(clients)}")
        return clients * self.config.k if len(clients) == 1 else clients

    @property
    def clients(self) -> list[ChatClient]:
        """The k clients (built by the factory on first use)."""
        with self._lock:
            if self._clients is None:
                self._clients = self._check(list(self.client_factory()))
            return self._clients

    def bind_metrics(self, registry: CollectorRegistry) -> JudgeMetrics:
        """Count the channel's calls in ``registry`` from now on (once per registry)."""
        if self._registry is not registry:
            self.metrics, self._registry = JudgeMetrics(registry), registry
        return self.metrics

    def __getstate__(self) -> dict[str, Any]:
        # Locks, semaphores and registries do not pickle, nor do HTTP clients: a copy made
        # from a factory builds its clients again where it runs.
        state = {"config": self.config, "client_factory": self.client_factory,
                 "_clients": None if self.client_factory is not None else self._clients}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._registry, self.metrics = None, None
        self._init_runtime()

    def audits(self, key: str) -> bool:
        """Whether an episode the rule decided (``key``: any stable id of it, e.g. task,
        account and start time) is also judged, to measure agreement: a deterministic draw
        at :attr:`JudgeConfig.audit_fraction`."""
        fraction = self.config.audit_fraction
        if fraction <= 0:
            return False
        draw = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0 ** 64
        return draw < fraction

    def record_agreement(self, rule_verdict: str, judge_verdict: str) -> None:
        """An audited episode: the rule's decisive verdict against the judges' (see
        :meth:`JudgeMetrics.record_agreement`)."""
        if self.metrics is not None:
            self.metrics.record_agreement(rule_verdict, judge_verdict)

    def messages(self, index: int, rendered: str, expected: str = "success",
                 reference_reason: str = "") -> list[dict[str, str]]:
        """The chat messages judge ``index`` is sent."""
        if expected not in EXPECTED:
            raise ConfigError(f"JudgeChannel.judge.expected: must be one of "
                              f"{', '.join(EXPECTED)}, got {expected!r}")
        reference = f" (reference: {_middle(reference_reason, 600)})" if reference_reason else ""
        question = _INSTRUCTIONS[expected].format(reference=reference)
        prompts = self.config.system_prompts
        return [{"role": "system", "content": prompts[index % len(prompts)]},
                {"role": "user", "content": f"{rendered}\n\n---\n{question}\n{_FORMAT}"}]

    def judge(self, task_title: str, procedure: str, actions: Sequence[str],
              final_observation_text: str, answer: str | None = None,
              infeasible_reason: str | None = None, *, expected: str = "success",
              reference_reason: str = "") -> JudgeVerdict:
        """Render the episode, ask the k judges, apply the consensus rule. ``expected``: the
        task's expected outcome; for ``infeasible`` tasks the judges check the agent's
        report_infeasible reason against ``reference_reason`` (the task's known reason).
        Returns within about :attr:`JudgeConfig.deadline_s`; an endpoint's failure is an
        invalid vote, never an exception."""
        rendered = render_trajectory(task_title, procedure, actions, final_observation_text,
                                     answer, infeasible_reason,
                                     self.config.max_trajectory_chars)
        k = self.config.k
        requests = [self.messages(i, rendered, expected, reference_reason) for i in range(k)]
        names = [f"judge-{i}" for i in range(k)]
        deadline_s = self.config.deadline_s
        deadline = time.monotonic() + deadline_s if deadline_s is not None else math.inf
        try:
            clients = self.clients
        except Exception as exc:  # noqa: BLE001 - e.g. the API key's variable is not set here
            log.warning("judge clients could not be built: %s", exc)
            votes = [JudgeVote(n, "invalid", f"no client: {_middle(str(exc), 300)}")
                     for n in names]
            return consensus(votes, self.config)
        calls = [_Call(self.metrics) for _ in range(k)]
        pool = ThreadPoolExecutor(max_workers=k, thread_name_prefix="judge")
        try:
            futures = [pool.submit(self._ask, names[i], clients[i], requests[i], deadline,
                                   calls[i]) for i in range(k)]
            wait(futures, timeout=deadline_s)
            votes = []
            for i, future in enumerate(futures):
                if future.done():
                    votes.append(future.result())
                elif calls[i].queued:            # never got a slot
                    calls[i].fail("overloaded")
                    calls[i].finish("overloaded")
                    votes.append(JudgeVote(names[i], "invalid", "overloaded: no free judge "
                                           f"slot (of {self.config.concurrency}) before the "
                                           "deadline"))
                else:
                    calls[i].fail("deadline")
                    calls[i].finish("timeout")
                    votes.append(JudgeVote(names[i], "invalid",
                                           f"no answer within {deadline_s}s"))
        finally:
            # Do not wait for judges past the deadline: their calls end by their own timeout
            # (at most the deadline for clients that take one).
            pool.shutdown(wait=False, cancel_futures=True)
        return consensus(votes, self.config)

    def _ask(self, name: str, client: ChatClient, messages: Sequence[Mapping[str, str]],
             deadline: float, call: _Call) -> JudgeVote:
        """One judge's vote: a slot under the concurrency limit, then attempts (retries of
        transport errors, 5xx and 429 while the deadline leaves room). Never raises."""
        try:
            return self._attempts(name, client, messages, deadline, call)
        except Exception as exc:  # noqa: BLE001 - a broken judge abstains, scoring goes on
            log.warning("%s: client raised %s", name, type(exc).__name__, exc_info=True)
            call.fail("client_error")
            call.finish("client_error")
            return JudgeVote(name, "invalid",
                             f"client error: {type(exc).__name__}: {_middle(str(exc), 300)}")

    def _attempts(self, name: str, client: ChatClient, messages: Sequence[Mapping[str, str]],
                  deadline: float, call: _Call) -> JudgeVote:
        cfg = self.config
        if self._slots is not None:
            wait_s = deadline - time.monotonic()
            got = self._slots.acquire(timeout=None if wait_s == math.inf else max(wait_s, 0))
            if got and deadline - time.monotonic() < _MIN_CALL_S:     # a slot, but no time
                self._slots.release()
                got = False
            if not got:
                call.fail("overloaded")
                call.finish("overloaded")
                return JudgeVote(name, "invalid", f"overloaded: no free judge slot (of "
                                                  f"{cfg.concurrency}) before the deadline")
        call.queued = False
        try:
            attempt = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    call.fail("deadline")
                    call.finish("timeout")
                    return JudgeVote(name, "invalid", f"no answer within {cfg.deadline_s}s")
                try:
                    reply = _complete(client, messages, min(cfg.timeout_s or math.inf, left),
                                      cfg.structured)
                except ChatError as exc:
                    kind = _failure_kind(exc)
                    call.fail(kind)
                    backoff = cfg.retry_backoff_s * 2 ** attempt
                    if kind in _RETRYABLE and attempt < cfg.retries and \
                            deadline - time.monotonic() > backoff + _MIN_CALL_S:
                        log.info("%s: %s, retrying in %.2fs", name, kind, backoff)
                        time.sleep(backoff)
                        attempt += 1
                        continue
                    log.warning("%s: chat error: %s", name, exc)
                    call.finish(_OUTCOME_OF[kind])
                    return JudgeVote(name, "invalid", f"chat error: {_middle(str(exc), 300)}")
                vote = parse_vote(name, reply, cfg)
                if vote.verdict == "invalid":
                    call.fail("invalid_reply")
                call.finish("ok" if vote.verdict != "invalid" else "invalid_reply")
                return vote
        finally:
            if self._slots is not None:
                self._slots.release()


def _complete(client: ChatClient, messages: Sequence[Mapping[str, str]], timeout_s: float,
              structured: bool) -> str:
    """``client.complete``, with this call's timeout and (``structured``) the vote's
    :data:`RESPONSE_FORMAT` where the client takes them."""
    extra: dict[str, Any] = {}
    if timeout_s != math.inf and _takes(client, "timeout_s"):
        extra["timeout_s"] = timeout_s
    if structured and _takes(client, "response_format"):
        extra["response_format"] = RESPONSE_FORMAT
    return client.complete(messages, **extra)


def _takes(client: ChatClient, parameter: str) -> bool:
    try:
        return parameter in inspect.signature(client.complete).parameters
    except (TypeError, ValueError):
        return False
