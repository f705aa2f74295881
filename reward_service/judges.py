"""The LLM-judge channel of the reward service: k chat models read a compact rendering of an
episode and each vote ``success`` or ``failure``; a consensus rule turns the votes into one
:class:`JudgeVerdict`.

Judges are not clones: each gets its own system prompt (a different reviewing angle, cycled
from :attr:`JudgeConfig.system_prompts`), and callers may also give each judge its own client
(another model, or another temperature: see :func:`judge_clients`). One client may serve all k
judges; it is then called k times concurrently with the k prompts.

A judge must end its reply with one JSON object::

    {"verdict": "success" | "failure", "reason": "..."}

Anything else (no object, prose after it, another verdict word, no reason, a reply that is
too long) is an ``invalid`` vote, never an exception; so is a judge whose endpoint fails or
does not answer within :attr:`JudgeConfig.deadline_s`. Invalid votes are abstentions.

Consensus (``quorum`` = :attr:`JudgeConfig.min_valid`, by default ``k // 2 + 1``, i.e. a
strict majority of the k judges must cast a valid vote, else ``undetermined``):

- ``unanimous``: every valid vote agrees -> that verdict; any disagreement -> undetermined.
- ``majority``: the verdict with strictly more valid votes than the other wins; a tie ->
  undetermined.

The model's text is only parsed as JSON, never executed.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

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
_FORMAT = ('End your reply with one JSON object and nothing after it: '
           '{"verdict": "success" or "failure", "reason": "<one sentence>"}')
_TRAILING_FENCE = re.compile(r"```\s*$")


@dataclass(frozen=True)
class JudgeConfig:
    """The judge channel's settings.

    ``k``: number of judges; ``consensus``: ``unanimous`` | ``majority``; ``min_valid``: valid
    votes needed for any verdict (``None``: ``k // 2 + 1``); ``max_trajectory_chars``: the
    rendering's budget; ``system_prompts``: cycled over the judges so that they are not clones;
    ``max_reply_chars``: longer replies are invalid votes; ``max_json_chars``: the final JSON
    object must fit in this tail of the reply; ``deadline_s``: judges that have not answered by
    then abstain (``None``: wait for the clients' own timeouts).
    """

    k: int = 3
    consensus: str = "unanimous"
    min_valid: int | None = None
    max_trajectory_chars: int = 12_000
    system_prompts: tuple[str, ...] = DEFAULT_SYSTEM_PROMPTS
    max_reply_chars: int = 64_000
    max_json_chars: int = 4_000
    max_reason_chars: int = 500
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        for name, low in (("k", 1), ("max_trajectory_chars", 400), ("max_reply_chars", 1),
                          ("max_json_chars", 16), ("max_reason_chars", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"JudgeConfig.{name}: must be an integer >= {low}, "
                                  f"got {value!r}")
        if self.consensus not in CONSENSUS:
            raise ConfigError(f"JudgeConfig.consensus: must be one of {', '.join(CONSENSUS)}, "
                              f"got {self.consensus!r}")
        if self.min_valid is not None and (isinstance(self.min_valid, bool)
                                           or not isinstance(self.min_valid, int)
                                           or not 1 <= self.min_valid <= self.k):
            raise ConfigError(f"JudgeConfig.min_valid: must be an integer in 1..k ({self.k}) "
                              f"or null, got {self.min_valid!r}")
        prompts = tuple(self.system_prompts)
        if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise ConfigError("JudgeConfig.system_prompts: must be a non-empty list of "
                              "non-empty strings")
        object.__setattr__(self, "system_prompts", prompts)
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ConfigError(f"JudgeConfig.deadline_s: must be > 0 or null, "
                              f"got {self.deadline_s!r}")

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
    a non-empty string ``reason``; when the reply holds several objects the last one counts.
    Anything else is an ``invalid`` vote naming what was wrong."""
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
    if verdict not in ("success", "failure"):
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


class JudgeChannel:
    """k judges over one or k chat clients (one client is reused with the k system prompts).
    :meth:`judge` calls them concurrently, so k slow endpoints cost about one round trip."""

    def __init__(self, clients: Sequence[ChatClient], config: JudgeConfig | None = None):
        self.config = config or JudgeConfig()
        clients = list(clients)
        if len(clients) not in (1, self.config.k):
            raise ConfigError(f"JudgeChannel.clients: give 1 or k ({self.config.k}) clients, "
                              f"got {len(clients)}")
        self.clients = clients * self.config.k if len(clients) == 1 else clients

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
        report_infeasible reason against ``reference_reason`` (the task's known reason)."""
        rendered = render_trajectory(task_title, procedure, actions, final_observation_text,
                                     answer, infeasible_reason,
                                     self.config.max_trajectory_chars)
        requests = [self.messages(i, rendered, expected, reference_reason)
                    for i in range(self.config.k)]
        names = [f"judge-{i}" for i in range(self.config.k)]
        pool = ThreadPoolExecutor(max_workers=self.config.k, thread_name_prefix="judge")
        try:
            futures = [pool.submit(self._ask, names[i], self.clients[i], requests[i])
                       for i in range(self.config.k)]
            wait(futures, timeout=self.config.deadline_s)
            votes = [f.result() if f.done() else
                     JudgeVote(names[i], "invalid", f"no answer within {self.config.deadline_s}s")
                     for i, f in enumerate(futures)]
        finally:
            # Do not wait for judges past the deadline; their threads end with their clients'
            # own timeouts.
            pool.shutdown(wait=False, cancel_futures=True)
        return consensus(votes, self.config)

    def _ask(self, name: str, client: ChatClient, messages: Sequence[Mapping[str, str]]
             ) -> JudgeVote:
        try:
            reply = client.complete(messages)
        except ChatError as exc:
            log.warning("%s: chat error: %s", name, exc)
            return JudgeVote(name, "invalid", f"chat error: {_middle(str(exc), 300)}")
        except Exception as exc:  # noqa: BLE001 - a broken judge abstains, scoring goes on
            log.warning("%s: client raised %s", name, type(exc).__name__, exc_info=True)
            return JudgeVote(name, "invalid",
                             f"client error: {type(exc).__name__}: {_middle(str(exc), 300)}")
        return parse_vote(name, reply, self.config)
