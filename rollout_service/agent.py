"""The agent loop: prompt, generate, act, until the episode ends; token-faithful trajectories.

Each turn builds one chat prompt from

- a system message: the agent's job and the action grammar (:data:`env_workers.actions.ACTION_HELP`);
- a user message: the task title and its documented procedure (placeholders filled), the last
  ``history_turns`` actions with the error each got, and the current page (its URL and
  accessibility text, cut to ``max_observation_chars``; cut further while the prompt is over
  ``max_prompt_tokens``).

The prompt is tokenized once with the tokenizer's chat template, message content as plain text
(a control string in page text, the task or the history is ordinary tokens, see
:class:`ChatTokenizer`); the policy samples from those ids; the sampled ids are decoded only to
find the action (the env worker parses the text strictly, an unparsable output becomes
``last_action_error`` in the next observation). Each
:class:`Turn` keeps exactly the prompt ids, the sampled ids, their log-probs, a loss mask (1 on
every sampled token) and the policy version that sampled them: the trainer never re-tokenizes.

The episode ends at ``stop``, ``report_infeasible``, the step limit, the token limit (total
prompt + sampled tokens of the episode), the env worker's own limits, or an env error.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Protocol

from consolerl.config import AtLeast, Between, Checked, OneOf
from consolerl.errors import ConfigError
from consolerl.experience import Trajectory, Turn, keep_pages, page_seen
from consolerl.page import compact
from consolerl.page import parse as page_of
from consolerl.types import Observation, StepResult
from env_workers.actions import ACTION_HELP, parse_action

# "stuck": a scripted policy found no way on (see rollout_service.episode.scripted_policy).
END_REASONS = ("stop", "report_infeasible", "max_steps", "token_limit", "env_limit",
               "env_error", "stuck")

SYSTEM_PROMPT = (
    "You operate a cloud console in a web browser to carry out a documented procedure. Each "
    "turn you see the task, the procedure, your recent actions and the current page as an "
    "accessibility tree where interactive elements have ids in brackets, e.g. [12]. Do one "
    "action per turn. When the task is done, stop with a short answer. If the procedure "
    "cannot be done in this console as documented, report it infeasible with the reason.\n\n"
    + ACTION_HELP)

# The same job and grammar in about a third of the tokens (~100 against ~315 with SmolLM2's
# tokenizer): on a CPU the prompt is ~99% of a training step's tokens.
COMPACT_SYSTEM_PROMPT = (
    "You operate a cloud console in a browser to carry out a documented procedure. Page "
    "elements have ids in brackets, e.g. [12]. Reply with one action:\n"
    'click(bid) | fill(bid, "text") | select(bid, "option") | press("Enter") | '
    'scroll("down") | goto("https://host/path") | go_back() | stop("answer") when done | '
    'report_infeasible("reason") when the procedure cannot be done as documented')
# The compact grammar for a grounded reply (AgentConfig.response "grounded"): the model first
# copies the label of what it acts on, as the page shows it, then writes the action.
GROUNDED_SYSTEM_PROMPT = (
    "You operate a cloud console in a browser to carry out a documented procedure. Page "
    "elements have ids in brackets, e.g. [12]. Reply with two lines: the label of the element "
    "you act on, in quotes, as the page shows it; then one action:\n"
    'click(bid) | fill(bid, "text") | select(bid, "option") | press("Enter") | '
    'scroll("down") | goto("https://host/path") | go_back() | stop("answer") when done | '
    'report_infeasible("reason") when the procedure cannot be done as documented')
SYSTEM_PROMPTS = {"full": SYSTEM_PROMPT, "compact": COMPACT_SYSTEM_PROMPT,
                  "grounded": GROUNDED_SYSTEM_PROMPT}
PAGE_VIEWS = ("full", "compact")
RESPONSES = ("action", "grounded")


@dataclass(frozen=True)
class AgentConfig(Checked):
    """``history_turns``: previous actions shown (K); ``max_steps``: actions per episode;
    ``max_prompt_tokens`` / ``max_new_tokens``: per turn; ``max_episode_tokens``: prompt and
    sampled tokens of the whole episode; sampling: ``temperature``, ``top_p``;
    ``system_prompt``: ``full`` (the grammar with a line per action), ``compact`` or
    ``grounded`` (the compact grammar asking for the target's label first).

    What the model reads and writes, which a trained model keeps (:data:`MODEL_SETTINGS`):
    ``page_view``: ``full`` (the page as rendered) or ``compact`` (the top bar, breadcrumb and
    repeated headings taken out, :func:`consolerl.page.compact`); ``response``: ``action``
    (the action alone) or ``grounded`` (the label of the element acted on, quoted, on the line
    before the action: :func:`grounded_response`; the env worker reads the last action line);
    ``random_ids``: the env worker numbers a page's elements from a permutation drawn per
    episode (``EpisodeSpec.id_seed``) instead of in document order, so an id says nothing
    of where an element sits."""

    max_steps: Annotated[int, AtLeast(1)] = 20
    history_turns: Annotated[int, AtLeast(0)] = 4
    max_observation_chars: Annotated[int, AtLeast(100)] = 8_000
    min_observation_chars: Annotated[int, AtLeast(50)] = 500
    max_prompt_tokens: Annotated[int, AtLeast(64)] = 4_096
    max_new_tokens: Annotated[int, AtLeast(1)] = 96
    max_episode_tokens: Annotated[int, AtLeast(128)] = 65_536
    temperature: Annotated[float, Between(0, 5)] = 1.0
    top_p: Annotated[float, Between(0, 1, low_open=True)] = 1.0
    system_prompt: Annotated[str, OneOf(tuple(SYSTEM_PROMPTS))] = "full"
    page_view: Annotated[str, OneOf(PAGE_VIEWS)] = "full"
    response: Annotated[str, OneOf(RESPONSES)] = "action"
    random_ids: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.response == "grounded") != (self.system_prompt == "grounded"):
            raise ConfigError("AgentConfig.response: 'grounded' goes with system_prompt "
                              "'grounded' (the prompt asks for the label line), and only with it")
        if self.min_observation_chars > self.max_observation_chars:
            raise ConfigError("AgentConfig.min_observation_chars: must not exceed "
                              "max_observation_chars")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a completion. ``json_schema`` (a JSON schema as JSON text, "" for none):
    the completion must be one JSON value that follows it (the chat API's ``response_format``
    of type ``json_schema``); the vLLM engine honours it (vLLM's structured outputs), the
    transformers engine refuses it (``ValueError``), so no caller mistakes a free-text
    completion for a constrained one."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    json_schema: str = ""


@dataclass(frozen=True)
class Generation:
    """What a policy returns: the sampled ids, the log-prob of each under the sampling policy,
    the weight version that produced them, and why it stopped (``stop`` | ``length``)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    version: int
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"Generation: {len(self.token_ids)} token ids but "
                             f"{len(self.logprobs)} logprobs")


class Policy(Protocol):
    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                       session: str = "") -> Generation: ...


class ChatTokenizer(Protocol):
    """``apply_chat_template``: the prompt ids, the template's markers as control tokens and
    every message's content as plain text: a control string in it (``<|im_end|>``, any added
    token) comes out as ordinary tokens, never as a control token. ``decode``: the sampled ids
    as text. :class:`rollout_service.models.HFChatTokenizer` is the real one."""

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool = True,
                            add_generation_prompt: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass
class _Step:
    action: str
    error: str


def history_entry(text: str, result: StepResult) -> _Step:
    """What later prompts show of an action: the canonical action the env worker ran (or the
    generated text, shortened, when it did not parse, with the parse error)."""
    error = result.observation.last_action_error if not result.action_text else ""
    return _Step(result.action_text or _short(text), error)


def recent_history(history: Sequence[_Step], turns: int) -> list[_Step]:
    """The last ``turns`` entries (none when ``turns`` is 0)."""
    return list(history[-turns:]) if turns else []


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters of the page omitted]"


def stable_part(title: str, procedure: str) -> str:
    """The start of every turn's user message in an episode (:func:`build_messages`)."""
    return f"TASK: {title}\n\nPROCEDURE:\n{procedure.strip()}"


# What a trained model was trained to read and write: these AgentConfig fields travel with the
# model folder, and serving it with other values is refused.
MODEL_SETTINGS = ("system_prompt", "page_view", "response", "random_ids", "history_turns",
                  "max_observation_chars", "min_observation_chars", "max_prompt_tokens",
                  "max_new_tokens")


def grounded_response(action_text: str, page_text: str) -> str:
    """The reply ``response: grounded`` trains: the label of the element the action names,
    quoted, on the line before the action (``"Create User"`` then ``click(16)``), so the model
    copies a label from the procedure to the page before it picks an id. An action that names
    no element, or one whose element has no label on the page, is the action alone."""
    action = parse_action(action_text)
    bid = getattr(action, "bid", None)
    if not bid:
        return action_text
    node = page_of(page_text).by_bid(bid)
    if node is None or not node.label.strip():
        return action_text
    return f"{_quoted(node.label)}\n{action_text}"


def _quoted(label: str) -> str:
    """The label between double quotes, its characters as the page shows them (the page does
    not escape a quote inside a label either), on one line."""
    return '"' + " ".join(label.split()) + '"'


def page_text(observation: Observation, view: str = "full") -> str:
    """The page as the prompt shows it in ``view`` (``AgentConfig.page_view``)."""
    return compact(observation.text) if view == "compact" else observation.text


def build_messages(title: str, procedure: str, history: Sequence[_Step],
                   observation: Observation, observation_chars: int,
                   system: str = SYSTEM_PROMPT, view: str = "full") -> list[dict[str, str]]:
    lines = [f"TASK: {title}", "", "PROCEDURE:", procedure.strip(), ""]
    if history:
        lines.append("YOUR LAST ACTIONS (oldest first):")
        for step in history:
            lines.append(f"- {step.action}" + (f"  -> error: {step.error}" if step.error else ""))
        lines.append("")
    if observation.last_action_error:
        lines += [f"LAST ACTION ERROR: {observation.last_action_error}", ""]
    lines += [f"CURRENT PAGE: {observation.url}", f"TITLE: {observation.title}",
              _cut(page_text(observation, view), observation_chars), "", "Your next action:"]
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n".join(lines)}]


StepFn = Callable[[str], Awaitable[StepResult]]


class AgentLoop:
    def __init__(self, policy: Policy, tokenizer: ChatTokenizer,
                 config: AgentConfig | None = None):
        self.policy = policy
        self.tokenizer = tokenizer
        self.config = config or AgentConfig()

    def prompt_ids(self, title: str, procedure: str, history: Sequence[_Step],
                   observation: Observation) -> list[int] | None:
        """The turn's prompt ids, the page cut until the prompt fits (``None``: it never
        does)."""
        chars = self.config.max_observation_chars
        stable = getattr(self.tokenizer, "apply_chat_template_stable", None)
        while True:
            messages = build_messages(title, procedure, history, observation, chars,
                                      SYSTEM_PROMPTS[self.config.system_prompt],
                                      self.config.page_view)
            if stable is not None:      # the task and procedure are encoded once an episode
                ids = list(stable(messages, stable_part(title, procedure)))
            else:
                ids = list(self.tokenizer.apply_chat_template(
                    messages, tokenize=True, add_generation_prompt=True))
            if len(ids) <= self.config.max_prompt_tokens:
                return ids
            if chars <= self.config.min_observation_chars:
                return None
            chars = max(chars // 2, self.config.min_observation_chars)

    async def run(self, task_id: str, title: str, procedure: str, observation: Observation,
                  step: StepFn, *, seed: int | None = None,
                  trajectory_id: str | None = None) -> Trajectory:
        tid = trajectory_id or uuid.uuid4().hex
        try:
            return await self._turns(task_id, title, procedure, observation, step, seed, tid)
        finally:
            release = getattr(self.policy, "release", None)    # a router's sticky session
            if release is not None:
                release(tid)

    async def _turns(self, task_id: str, title: str, procedure: str, observation: Observation,
                     step: StepFn, seed: int | None, tid: str) -> Trajectory:
        cfg = self.config
        started = time.time()
        turns: list[Turn] = []
        history: list[_Step] = []
        used = 0
        end, answer, infeasible, env_error = "max_steps", None, None, None
        pages = [page_seen(observation.url, observation.text)]
        for index in range(cfg.max_steps):
            ids = self.prompt_ids(title, procedure, recent_history(history, cfg.history_turns),
                                  observation)
            if ids is None or used + len(ids) + cfg.max_new_tokens > cfg.max_episode_tokens:
                end = "token_limit"
                break
            sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                                      None if seed is None else seed * 1_000 + index)
            gen = await self.policy.generate(ids, sampling, session=tid)
            used += len(ids) + len(gen.token_ids)
            text = self.tokenizer.decode(list(gen.token_ids), skip_special_tokens=True)
            result = await step(text)
            entry = history_entry(text, result)
            turns.append(Turn(tuple(ids), tuple(gen.token_ids), tuple(gen.logprobs),
                              (1,) * len(gen.token_ids), gen.version, text,
                              result.action_text, entry.error))
            history.append(entry)
            observation = result.observation
            pages.append(page_seen(observation.url, observation.text))
            if result.env_error is not None:
                end, env_error = "env_error", result.env_error
                break
            if result.done:
                if result.infeasible is not None:
                    end, infeasible = "report_infeasible", result.infeasible
                elif result.answer is not None:
                    end, answer = "stop", result.answer
                else:
                    end = "env_limit"
                break
        return Trajectory(tid, task_id, tuple(turns), end, answer, infeasible, env_error,
                          observation.text, started, time.time(), pages=keep_pages(pages))


def _short(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."
