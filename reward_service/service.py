"""The reward service: ``RewardService.score`` (rule channel, optional judges, fusion), served
as a Ray actor (``RewardActor``) and over HTTP (``POST /v1/score``, :func:`build_app`).

A request names the task (by id, from the suite), the account and the episode's time window,
the placeholder values of the episode, and what the judges need (actions, final page, the
agent's answer). The service holds one ActionTrail client per account and one SDK client per
account and thread (built on first use, reused afterwards); the accounts' secrets stay in the
service and never appear in a response.

Metrics (``consolerl_reward_*``, in the service's ``registry``, served at ``GET /metrics``):
scores by verdict and decider, score latency, scores in flight, undetermined episodes by cause,
errors by kind, judge votes and verdicts, and the ActionTrail client's query counters.

HTTP answers: a request that is malformed, or does not fit its task (a placeholder the rule
needs has no value, the episode began before the audit log's 90 days), is a 422 naming the
field (``detail``: ``loc``, ``msg``, ``type``, as :mod:`infra.http_errors` answers); an
unknown task or account is a 404. A cloud failure while scoring is the service's, not the
caller's, and the episode was not scored (it did not fail): an outage (no answer, 5xx,
throttling after the retries) is a 503, come back later; a refusal (any other 4xx, e.g. the
account's AccessKey unknown or not allowed) is a 502 naming the account, which retrying will
not fix. Both name the failed action and error code.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from typing import Annotated, Any

import ray
from fastapi import FastAPI, HTTPException, Response
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, \
    model_validator

from consolerl.errors import CloudAPIError, ConfigError, ConsoleRLError
from consolerl.types import EnvError
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.http_errors import field_error, install_validation_handler
from consolerl.accounts import Account
from consolerl.tasks import Task

from consolerl.experience import MAX_PAGE_CHARS, MAX_PAGES

from .actiontrail import LOOKUP_MAX_WINDOW_S, TrailClient, TrailConfig, TrailMetrics, \
    is_retryable
from .evidence import Claim, check_claim
from .fusion import RewardConfig, evidence_decides, fuse
from consolerl.rewards import RewardResult
from .judges import JudgeChannel
from consolerl.rewards import CLAIM_KINDS, JudgeVerdict
from .verifier import EpisodeRecord, RuleVerifier


FUTURE_SLACK_S = 300.0              # clock skew allowed between a caller and the service
MAX_ACTIONS = 500
MAX_ACTION_CHARS = 10_000           # a valid action line is at most 8,192 (env_workers.actions)
MAX_VALUE_CHARS = 2_000

_Name = Annotated[str, StringConstraints(min_length=1, max_length=64)]
_Value = Annotated[str, StringConstraints(max_length=MAX_VALUE_CHARS)]
_Action = Annotated[str, StringConstraints(max_length=MAX_ACTION_CHARS)]
_Page = Annotated[str, StringConstraints(max_length=MAX_PAGE_CHARS + 4_000)]


class ScoreRequest(BaseModel):
    """``POST /v1/score``: one finished episode. Unknown fields are refused (a misspelt
    ``values`` would otherwise score the episode without them)."""

    # NaN / Infinity are not times; strict: neither are true or "1700000000".
    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")

    task_id: str = Field(min_length=3, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]+$")
    account_id: str = Field(min_length=6, max_length=20, pattern=r"^[0-9]+$")
    started_at: float = Field(gt=0, strict=True,
                              description="epoch seconds when the episode began")
    ended_at: float = Field(gt=0, strict=True)
    values: dict[_Name, _Value] = Field(
        default_factory=dict, max_length=64,
        description="the episode's placeholder values; every {name} of the task's rule")
    actions: list[_Action] = Field(default_factory=list, max_length=MAX_ACTIONS)
    final_observation: str = Field(default="", max_length=200_000)
    answer: str | None = Field(default=None, max_length=4_000)
    infeasible_reason: str | None = Field(default=None, max_length=4_000)
    pages: list[_Page] = Field(
        default_factory=list, max_length=MAX_PAGES,
        description="the pages the agent saw, each its URL on the first line and then the "
                    "observation text: pages[i] before actions[i], the last after the final "
                    "action (what an infeasibility claim is checked against)")
    env_error: str | None = Field(default=None, min_length=1, max_length=2_000,
                                  description="the episode failed for infrastructure reasons")

    @field_validator("started_at", "ended_at")
    @classmethod
    def _not_in_the_future(cls, value: float) -> float:
        if value > time.time() + FUTURE_SLACK_S:
            raise ValueError(f"is in the future (more than {FUTURE_SLACK_S:g} s ahead of the "
                             "service's clock)")
        return value

    @model_validator(mode="after")
    def _window(self) -> "ScoreRequest":
        if self.ended_at < self.started_at:
            raise ValueError("ended_at must not be before started_at")
        return self


class ScoreRequestError(ConsoleRLError, ValueError):
    """A well-formed request that does not fit its task or the audit log; ``field`` names the
    request field at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message

    def __reduce__(self):
        return (type(self), (self.field, self.message))


class UnknownName(ConsoleRLError, LookupError):
    """A request named a task or account the service does not know."""


class RewardMetrics:
    """The service's Prometheus metrics (``consolerl_reward_*``) in one registry."""

    def __init__(self, registry: CollectorRegistry):
        self.scores = Counter("consolerl_reward_scores_total", "Episodes scored, by verdict "
                              "(success, failure, undetermined) and decided_by (rule, "
                              "evidence, judges, none, env_error).", ["verdict", "decided_by"],
                              registry=registry)
        self.latency = Histogram("consolerl_reward_score_seconds", "Time to score one episode "
                                 "(scores that returned a result).", registry=registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                                          60, 120, 300, 600))
        self.in_flight = Gauge("consolerl_reward_scores_in_flight", "Episodes being scored now.",
                               registry=registry)
        self.undetermined = Counter("consolerl_reward_undetermined_total", "Episodes scored "
                                    "undetermined, by cause: pending (the required audit events "
                                    "had not arrived before the settle deadline) or undecided "
                                    "(no channel could decide).", ["cause"], registry=registry)
        self.errors = Counter("consolerl_reward_errors_total", "Score requests that raised, by "
                              "kind (unknown_name, bad_request, cloud_error: a cloud outage, "
                              "cloud_refused: the cloud refused the service's call, internal).",
                              ["kind"], registry=registry)
        self.evidence = Counter("consolerl_reward_evidence_total", "Episodes the evidence "
                                "channel checked, by what it found (confirmed, refused, "
                                "contradicted, unsupported, not_reported, no_claim, unchecked).",
                                ["kind"], registry=registry)
        self.evidence_latency = Histogram("consolerl_reward_evidence_seconds", "Time to check "
                                          "one episode's ending against the evidence.",
                                          registry=registry, buckets=(0.0005, 0.001, 0.0025,
                                                                      0.005, 0.01, 0.025, 0.05,
                                                                      0.1, 0.25, 1))
        self.judge_votes = Counter("consolerl_reward_judge_votes_total", "Judge votes, by "
                                   "verdict (success, failure, invalid).", ["verdict"],
                                   registry=registry)
        self.judge_agreement = Counter("consolerl_reward_judge_agreement_total", "Episodes "
                                       "the judges voted on, by agreement: unanimous (every "
                                       "valid vote the same) or split.", ["agreement"],
                                       registry=registry)
        self.judge_verdicts = Counter("consolerl_reward_judge_verdicts_total", "Judge channel "
                                      "verdicts (success, failure, undetermined).", ["verdict"],
                                      registry=registry)
        # Every label value from the start: a rate over a series that exists reads 0, one
        # over a series that never appeared reads "no data".
        for child, values in ((self.undetermined, ("pending", "undecided")),
                              (self.errors, ("unknown_name", "bad_request", "cloud_error",
                                             "cloud_refused", "internal")),
                              (self.judge_votes, ("success", "failure", "invalid")),
                              (self.judge_verdicts, ("success", "failure", "undetermined")),
                              (self.judge_agreement, ("unanimous", "split")),
                              (self.evidence, CLAIM_KINDS)):
            for value in values:
                child.labels(value)

    def record(self, result: RewardResult) -> None:
        self.scores.labels(result.verdict, result.decided_by).inc()
        if result.verdict == "undetermined":
            rule = result.rule_verdict
            pending = rule is not None and rule.pending
            self.undetermined.labels("pending" if pending else "undecided").inc()

    def record_judges(self, verdict: JudgeVerdict) -> None:
        self.judge_verdicts.labels(verdict.verdict).inc()
        for vote in verdict.votes:
            self.judge_votes.labels(vote.verdict).inc()
        valid = {vote.verdict for vote in verdict.votes if vote.verdict != "invalid"}
        if valid:
            self.judge_agreement.labels("unanimous" if len(valid) == 1 else "split").inc()

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Time one score, keep the in-flight gauge, count the error kind if it raises."""
        self.in_flight.inc()
        t0 = time.perf_counter()
        try:
            yield
        except UnknownName:
            self.errors.labels("unknown_name").inc()
            raise
        except ScoreRequestError:
            self.errors.labels("bad_request").inc()
            raise
        except CloudAPIError as exc:
            self.errors.labels("cloud_error" if cloud_outage(exc) else "cloud_refused").inc()
            raise
        except Exception:
            self.errors.labels("internal").inc()
            raise
        else:
            self.latency.observe(time.perf_counter() - t0)
        finally:
            self.in_flight.dec()


class RewardService:
    """Scores episodes (:meth:`score`); thread-safe, so many episodes are scored at once.

    ``registry``: where the metrics go (default: a fresh one); the ActionTrail clients count
    their queries there too. ``client_factory`` builds an account's SDK client (default: one
    for ``endpoint``); it is called once per account and thread, since a
    :class:`CloudClient` is not thread-safe. A pickled service (a Ray actor's copy) starts
    with a fresh registry and no clients.
    """

    def __init__(self, tasks: list[Task], accounts: list[Account], endpoint: str | None,
                 trail_config: TrailConfig | None = None, reward_config: RewardConfig | None = None,
                 judges: JudgeChannel | None = None,
                 console_labels: Mapping[str, frozenset[str]] | None = None,
                 client_factory: Callable[[Account], CloudClient] | None = None,
                 registry: CollectorRegistry | None = None):
        self.tasks = {t.id: t for t in tasks}
        self.accounts = {a.account_id: a for a in accounts}
        self.trail_config = trail_config or TrailConfig()
        self.reward_config = reward_config or RewardConfig()
        self.judges = judges
        # drift profile -> every label of that console's UI inventory (normalised): where a
        # task's console has one, the evidence channel checks claims against all of it.
        self.console_labels = dict(console_labels or {})
        self._factory = client_factory or (lambda a: CloudClient(
            CloudConfig(endpoint=endpoint), Credentials(a.access_key_id, a.access_key_secret)))
        self._setup(registry if registry is not None else CollectorRegistry())

    def _setup(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.metrics = RewardMetrics(registry)
        self.trail_metrics = TrailMetrics(registry)
        if self.judges is not None:         # its calls, failures, agreement (JudgeMetrics)
            self.judges.bind_metrics(registry)
        self._local = threading.local()
        self._trails: dict[str, TrailClient] = {}
        self._trails_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Registries, locks and thread-local clients do not pickle (nor belong in a copy).
        keep = ("tasks", "accounts", "trail_config", "reward_config", "judges",
                "console_labels", "_factory")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup(CollectorRegistry())

    def _client(self, account: Account) -> CloudClient:
        """This thread's SDK client of ``account`` (the end-state checks and, through
        :meth:`_trail`, ActionTrail share it)."""
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        client = clients.get(account.account_id)
        if client is None:
            client = clients[account.account_id] = self._factory(account)
        return client

    def _trail(self, account: Account) -> TrailClient:
        with self._trails_lock:
            trail = self._trails.get(account.account_id)
            if trail is None:
                trail = TrailClient(lambda: self._client(account), self.trail_config,
                                    account_id=account.account_id, metrics=self.trail_metrics)
                self._trails[account.account_id] = trail
            return trail

    def score(self, request: ScoreRequest, task: Task | None = None) -> RewardResult:
        """The reward of one finished episode. Raises :class:`UnknownName` for an unknown task
        or account, :class:`ScoreRequestError` for a request that does not fit its task or the
        audit log, :class:`CloudAPIError` when the cloud fails (the episode is not scored).
        ``task``: a task that is not in the suite (an API job's inline definition)."""
        with self.metrics.scoring():
            result = self._score(request, task)
            self.metrics.record(result)
            return result

    def _score(self, request: ScoreRequest, task: Task | None = None) -> RewardResult:
        task = task if task is not None and task.id == request.task_id else \
            self.tasks.get(request.task_id)
        if task is None:
            raise UnknownName(f"unknown task_id {request.task_id!r}")
        account = self.accounts.get(request.account_id)
        if account is None:
            raise UnknownName(f"unknown account_id {request.account_id!r}")
        if request.env_error:
            return fuse(task.expected, None, None, EnvError("env_error", request.env_error),
                        self.reward_config)
        self._check(request, task)
        episode = EpisodeRecord(account.account_id, request.started_at, request.ended_at,
                                tuple(sorted(request.values.items())))
        rule, events = RuleVerifier(self._trail(account), self._client(account)) \
            .verify_with_events(task, episode)
        evidence = None
        if not rule.pending:
            with self.metrics.evidence_latency.time():
                evidence = check_claim(task, Claim(
                    request.infeasible_reason, request.answer, request.values, request.pages,
                    request.actions, events), self.console_labels.get(task.drift))
            self.metrics.evidence.labels(evidence.kind).inc()
        rule_decides = rule.verdict == "failure" or (
            rule.verdict == "success" and task.expected == "success")
        decided = rule.verdict if rule_decides else evidence.verdict \
            if evidence_decides(task.expected, evidence) and evidence is not None else ""
        verdict = None
        # The judges decide only what the rule and the evidence leave open; an audited share
        # of the decided episodes is judged too, only to measure their agreement.
        audit = bool(decided) and self.judges is not None and self.judges.audits(
            f"{task.id}:{account.account_id}:{request.started_at!r}")
        if self.judges is not None and (not decided or audit):
            verdict = self.judges.judge(
                task.title, task.procedure, request.actions, request.final_observation,
                request.answer, request.infeasible_reason, expected=task.expected,
                reference_reason=task.infeasible_reason)
            self.metrics.record_judges(verdict)
            if audit:
                self.judges.record_agreement(decided, verdict.verdict)
        return fuse(task.expected, rule, verdict, None, self.reward_config, evidence=evidence)

    def _check(self, request: ScoreRequest, task: Task) -> None:
        """What the rule channel needs of a request beyond its shape."""
        missing = sorted(task.success.placeholders() - set(request.values))
        if missing:
            raise ScoreRequestError("values", f"task {task.id!r} needs a value for "
                                    f"{', '.join('{' + m + '}' for m in missing)}; given: "
                                    f"{', '.join(sorted(request.values)) or 'none'}")
        if request.started_at < self.trail_config.oldest_start(time.time()):
            raise ScoreRequestError(
                "started_at", f"the episode began more than {LOOKUP_MAX_WINDOW_S / 86_400:g} "
                "days ago (less the trail's clock-skew and settle margins); the audit log "
                "(ActionTrail) keeps 90 days of events")


def result_json(result: RewardResult) -> dict[str, Any]:
    return asdict(result)


def cloud_outage(exc: CloudAPIError) -> bool:
    """Whether a cloud failure is an outage that may pass (no HTTP answer, a 5xx, throttling
    that outlasted the retries) rather than a refusal of the call (any other 4xx)."""
    return exc.status == 0 or is_retryable(exc)


def cloud_error_detail(exc: CloudAPIError, account_id: str) -> dict[str, Any]:
    """The 503 (outage) or 502 (refusal) body for a cloud failure. The cloud's or SDK's message
    is left out: for a transport error it quotes the request URL (with a v2 signature, the
    AccessKey id and signature)."""
    action = exc.action or "(unknown)"
    if not cloud_outage(exc):
        return {"error": "cloud_refused", "action": exc.action or "unknown", "code": exc.code,
                "status": exc.status, "request_id": exc.request_id,
                "message": f"the cloud refused {action} for account {account_id} with "
                           f"{exc.code} (HTTP {exc.status}) while scoring; the episode was not "
                           "scored, and retrying will not help until the account's "
                           "credentials or permissions (or the service) are fixed"}
    # Status 0: no HTTP answer at all (connection refused or reset, timeout).
    what = (f"the cloud did not answer {action} (connection failed or timed out)"
            if exc.status == 0 else f"the cloud call {action} failed with {exc.code}")
    return {"error": "cloud_error", "action": exc.action or "unknown", "code": exc.code,
            "status": exc.status, "request_id": exc.request_id,
            "message": f"{what} while scoring; the episode was not scored, try again later"}


def _score_pool(max_concurrent_scores: int) -> ThreadPoolExecutor:
    # A score mostly sleeps (ActionTrail polls for up to settle_s, end-state polls, judges):
    # asyncio's default pool (min(32, CPUs + 4) threads) would queue episodes behind a few
    # waiting ones, so scores get a pool of their own.
    if isinstance(max_concurrent_scores, bool) or not isinstance(max_concurrent_scores, int) \
            or max_concurrent_scores < 1:
        raise ConfigError(f"max_concurrent_scores: must be an integer >= 1, "
                          f"got {max_concurrent_scores!r}")
    return ThreadPoolExecutor(max_concurrent_scores, thread_name_prefix="reward-score")


def build_app(service: RewardService, max_concurrent_scores: int = 64) -> FastAPI:
    """The HTTP service; at most ``max_concurrent_scores`` episodes are scored at once (more
    requests wait their turn)."""
    pool = _score_pool(max_concurrent_scores)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="console-rl reward service", version="1", lifespan=lifespan)
    # The largest valid request (500 actions of 10,000 characters, a 200,000-character page,
    # every character JSON-escaped) stays under 32 MiB.
    install_validation_handler(app, max_body_bytes=32 << 20)

    @app.post("/v1/score")
    async def score(request: ScoreRequest) -> Mapping[str, Any]:
        # Scoring waits on ActionTrail (and judges): off the event loop.
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                pool, service.score, request)
        except UnknownName as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        except ScoreRequestError as exc:
            raise HTTPException(status_code=422, detail=[
                field_error(("body", exc.field), exc.message)]) from None
        except CloudAPIError as exc:
            raise HTTPException(status_code=503 if cloud_outage(exc) else 502,
                                detail=cloud_error_detail(exc, request.account_id)) from None
        return result_json(result)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz() -> Mapping[str, Any]:
        return {"status": "ok", "tasks": len(service.tasks), "accounts": len(service.accounts)}

    return app


@ray.remote
class RewardActor:
    """The service as a Ray actor: ``score`` runs in a thread (at most
    ``max_concurrent_scores`` at once), so many episodes are scored at once without blocking
    the actor's event loop."""

    def __init__(self, service: RewardService, max_concurrent_scores: int = 64):
        self.service = service
        self.pool = _score_pool(max_concurrent_scores)

    async def score(self, request: dict[str, Any]) -> RewardResult:
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, self.service.score, ScoreRequest(**request))
