"""The jobs API's models: what a team sends and what it gets back, and the state machines.

Job states ``queued → running → completed | failed | cancelled | expired`` (a table, and a
refusal for the rest); episode states are separate from verdicts: a procedure the agent could
not do is a ``completed`` episode with verdict ``failure``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:      # at run time only spec_tasks needs it: the client imports this module
    from consolerl.tasks import Task

JOB_STATES = ("queued", "running", "completed", "failed", "cancelled", "expired")
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# The allowed transitions; anything else is refused (409 where a client asked for it).
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled", "expired", "failed"}),
    "running": frozenset({"completed", "failed", "cancelled", "expired"}),
    "completed": frozenset(), "failed": frozenset(), "cancelled": frozenset(),
    "expired": frozenset(),
}
EPISODE_STATES = ("queued", "running", "completed", "failed", "cancelled")
# A completed episode's verdict: the agent did the procedure (success), did not (failure),
# reported it cannot be done as written (infeasible), or the judges could not tell.
VERDICTS = ("success", "failure", "infeasible", "undetermined")
SCOPES = ("jobs:write", "jobs:read", "jobs:cancel", "artifacts:read", "admin")
# The model name of the scripted teacher (datagen.oracle): it acts instead of a policy
# in a job over catalogue tasks, through the same scheduler, runner and report.
ORACLE_MODEL = "oracle"
# The documentation replay (doccheck.replay): a drafted task's steps as the static check
# resolved them, carried out by the oracle's driver; only tasks that carry a replay plan.
REPLAY_MODEL = "replay"
SCRIPTED_MODELS = (ORACLE_MODEL, REPLAY_MODEL)


def may_move(state: str, to: str) -> bool:
    return to in TRANSITIONS.get(state, frozenset())


def spec_tasks(spec: dict[str, Any], catalog: Mapping[str, Task]) -> dict[str, Task]:
    """A stored job spec's tasks by id: catalog ids, or inline definitions (parsed as task
    files are). ``KeyError`` for an id the catalog no longer has; ``ConfigError`` for a bad
    definition."""
    from consolerl.tasks import parse_task
    tasks = {}
    for entry in spec.get("tasks", []):
        if "inline" in entry:
            task = parse_task(entry["inline"], f"inline task {entry['inline'].get('id')}")
        else:
            task = catalog[entry["id"]]
        tasks[task.id] = task
    return tasks


def spec_docs(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A documentation job's static checks and procedures by task id (``POST /v1/docs`` with
    ``run`` stores them in the spec's ``docs``: task id -> ``{"procedure", "checks"}``, each as
    :func:`doccheck.model.to_json` writes it); two empty dicts for other jobs."""
    from doccheck import Procedure, StepCheck, from_json
    static, procedures = {}, {}
    for tid, entry in (spec.get("docs") or {}).items():
        static[tid] = tuple(from_json(StepCheck, c) for c in entry.get("checks", ()))
        if entry.get("procedure"):
            procedures[tid] = from_json(Procedure, entry["procedure"])
    return static, procedures


class _Strict(BaseModel):
    # NaN and Infinity (JSON literals Python accepts) pass range checks: refused as floats.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TaskSelection(_Strict):
    """Exactly one way of naming the tasks: ``ids`` (catalog ids), ``split`` (train | heldout),
    ``id_regex`` (an RE2 regular expression searched in each catalog id), or ``inline`` (task
    definitions in the suite's schema, validated as task files are)."""

    ids: list[str] | None = Field(default=None, min_length=1, max_length=500)
    split: Literal["train", "heldout"] | None = None
    id_regex: str | None = Field(
        default=None, min_length=1, max_length=200,
        description="an RE2 regular expression (linear-time: no backreferences or "
                    "lookaround), searched in each catalog id")
    inline: list[dict[str, Any]] | None = Field(default=None, min_length=1, max_length=50)

    @model_validator(mode="after")
    def _one(self) -> TaskSelection:
        given = [k for k in ("ids", "split", "id_regex", "inline") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of ids, split, id_regex, inline "
                             f"(got {', '.join(given) or 'none'})")
        return self

    @field_validator("id_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            # Imported here: the client uses these models and needs no regex engine.
            from consolerl.patterns import compile_pattern
            compile_pattern(value, "tasks.id_regex")      # a PatternError is a ValueError
        return value


class Sampling(_Strict):
    """How the model samples: ``temperature`` 0 is greedy; ``max_steps`` actions per
    episode; ``max_new_tokens`` per action."""

    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_steps: int = Field(default=8, ge=1, le=40)
    max_new_tokens: int = Field(default=32, ge=8, le=512)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


class JobCreate(_Strict):
    tasks: TaskSelection
    model: str = Field(default="live", min_length=1, max_length=100,
                       description="'live' (the policy the cluster serves now), 'oracle' "
                                   "(the scripted teacher: catalogue tasks only, seconds an "
                                   "episode, sampling not used; to check that the console "
                                   "and the pipeline work) or a model name the operator "
                                   "registered (GET /v1/models)")
    samples_per_task: int = Field(default=1, ge=1, le=64)
    sampling: Sampling = Field(default_factory=Sampling)
    priority: int = Field(default=5, ge=0, le=9, description="higher runs first, within the "
                                                               "team's share")
    deadline_s: float | None = Field(default=None, gt=0, le=7 * 86400,
                                     description="seconds from submission; the job expires "
                                                 "then, finished episodes kept")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16)

    @field_validator("metadata")
    @classmethod
    def _meta(cls, value: dict[str, str]) -> dict[str, str]:
        for k, v in value.items():
            if len(k) > 64 or len(v) > 512:
                raise ValueError("metadata keys are at most 64 characters, values 512")
        return value


class EpisodeCounts(BaseModel):
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


class VerdictCounts(BaseModel):
    success: int = 0
    failure: int = 0
    infeasible: int = 0
    undetermined: int = 0


class Usage(BaseModel):
    env_seconds: float = 0.0
    tokens: int = 0


class Job(BaseModel):
    """A job as the API shows it (and as the store keeps it)."""

    id: str
    object: Literal["job"] = "job"
    team: str
    state: Literal["queued", "running", "completed", "failed", "cancelled", "expired"]
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    model: str
    policy_version: int | None = None
    samples_per_task: int
    sampling: Sampling
    priority: int
    task_ids: list[str]
    episodes: EpisodeCounts = Field(default_factory=EpisodeCounts)
    verdicts: VerdictCounts = Field(default_factory=VerdictCounts)
    usage: Usage = Field(default_factory=Usage)
    cancel_requested: bool = False
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Job]
    has_more: bool
    last_id: str | None = None


class Step(BaseModel):
    index: int
    action: str = ""
    target: str = ""                  # the label of the element acted on, when known
    url: str = ""
    title: str = ""
    error: str = ""
    screenshot: str | None = None     # an artifact id
    elapsed_ms: float = 0.0


class Attempt(BaseModel):
    attempt: int
    started_at: float
    ended_at: float | None = None
    worker: str = ""
    env_error: str | None = None      # kind: detail, when the environment failed


class AuditEvent(BaseModel):
    event_id: str
    event_name: str
    event_time: str
    error_code: str = ""


class ClaimCheck(BaseModel):
    """The reward service's evidence channel on how the episode ended
    (:class:`consolerl.rewards.EvidenceOutcome`): ``kind`` confirmed | refused (the agent's
    infeasibility claim is backed by evidence) | contradicted | unsupported | not_reported |
    no_claim | unchecked; ``missing``: what the evidence shows absent; ``present``: what it
    found, with where."""

    kind: str
    verdict: Literal["success", "failure", "undetermined"]
    reasons: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    present: list[str] = Field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        return self.kind in ("confirmed", "refused")


class Rollout(BaseModel):
    """One episode of a job: its state, and (once completed) its verdict and trajectory.
    ``verdict`` is what the agent's episode amounts to (``infeasible``: it reported the
    procedure cannot be done as written); ``reward_verdict`` and ``decided_by`` are the reward
    service's fused verdict and the channel that decided it (rule, evidence, judges, none);
    ``claim``: the evidence channel's check of an infeasibility claim."""

    id: str
    job_id: str
    task_id: str
    sample: int
    state: Literal["queued", "running", "completed", "failed", "cancelled"] = "queued"
    model: str | None = Field(default=None, description="who acted: the job's model ('oracle': "
                                                        "the scripted teacher), once started")
    verdict: Literal["success", "failure", "infeasible", "undetermined"] | None = None
    reward: float | None = None
    reward_verdict: Literal["success", "failure", "undetermined"] | None = None
    decided_by: str | None = None
    claim: ClaimCheck | None = None
    end_reason: str | None = None
    end_detail: str | None = Field(default=None, description="why a scripted run stopped "
                                                             "early (the replay: the step it "
                                                             "could not do and why)")
    answer: str | None = None
    infeasible_reason: str | None = None
    policy_version: int | None = None
    steps: list[Step] = Field(default_factory=list)
    attempts: list[Attempt] = Field(default_factory=list)
    deciding_events: list[AuditEvent] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    leaked: list[str] = Field(default_factory=list)    # what clean-up left (must stay empty)
    env_seconds: float = 0.0
    tokens: int = 0
    started_at: float | None = None
    finished_at: float | None = None


class RolloutSummary(BaseModel):
    id: str
    task_id: str
    sample: int
    state: str
    verdict: str | None = None
    reward: float | None = None
    end_reason: str | None = None
    attempts: int = 0


class ResultPage(BaseModel):
    object: Literal["list"] = "list"
    data: list[RolloutSummary]
    has_more: bool
    last_id: str | None = None


class ValidationResult(BaseModel):
    valid: bool
    errors: list[str] = Field(default_factory=list)
    task_ids: list[str] = Field(default_factory=list)


class TaskInfo(BaseModel):
    id: str
    product: str
    title: str
    split: str
    difficulty: int
    expected: str
    procedure: str


class TaskList(BaseModel):
    object: Literal["list"] = "list"
    data: list[TaskInfo]


class Quota(BaseModel):
    team: str
    concurrent_episodes: int
    queued_jobs: int
    samples_per_job: int
    env_minutes_per_day: float
    used: dict[str, float]


class ErrorBody(BaseModel):
    error: dict[str, Any]


# ---- the events of a job's stream (SSE ``event:`` is the model's ``kind``, ``data:`` its JSON) --
JobStateName = Literal["queued", "running", "completed", "failed", "cancelled", "expired"]


class JobStatusEvent(BaseModel):
    """The job changed state (``error`` says why it failed)."""

    kind: ClassVar[str] = "job.status"
    state: JobStateName
    error: str | None = None


class RolloutStartedEvent(BaseModel):
    """An attempt of a rollout started (``attempt`` counts from 1)."""

    kind: ClassVar[str] = "rollout.started"
    rollout_id: str
    task_id: str
    sample: int
    attempt: int


class RolloutStepEvent(BaseModel):
    """A step of a running rollout (at most one per rollout per the scheduler's
    ``step_event_interval_s``)."""

    kind: ClassVar[str] = "rollout.step"
    rollout_id: str
    step: int
    action: str
    url: str
    error: str = ""


class RolloutCompletedEvent(BaseModel):
    """An attempt of a rollout ended: ``state`` ``queued`` means the environment failed and
    it runs again; otherwise the rollout is over (``verdict`` when it completed)."""

    kind: ClassVar[str] = "rollout.completed"
    rollout_id: str
    task_id: str
    state: Literal["queued", "running", "completed", "failed", "cancelled"]
    verdict: Literal["success", "failure", "infeasible", "undetermined"] | None = None
    attempts: int


class TaskSummaryEvent(BaseModel):
    """Every sample of a task is over: how many completed, how many passed."""

    kind: ClassVar[str] = "task.summary"
    task_id: str
    samples: int
    completed: int
    passes: int


class JobCompletedEvent(BaseModel):
    """The job ended (always the stream's last event)."""

    kind: ClassVar[str] = "job.completed"
    state: JobStateName
    episodes: EpisodeCounts
    verdicts: VerdictCounts


JobEvent = (JobStatusEvent | RolloutStartedEvent | RolloutStepEvent | RolloutCompletedEvent
            | TaskSummaryEvent | JobCompletedEvent)
EVENT_MODELS: dict[str, type[JobEvent]] = {m.kind: m for m in (
    JobStatusEvent, RolloutStartedEvent, RolloutStepEvent, RolloutCompletedEvent,
    TaskSummaryEvent, JobCompletedEvent)}
EVENT_TYPES = tuple(EVENT_MODELS)


def event_data(event: JobEvent) -> dict[str, Any]:
    """The event's ``data`` as the stream carries it (JSON-ready, fields in declared order)."""
    return event.model_dump(mode="json")


def parse_event(kind: str, data: Mapping[str, Any]) -> JobEvent:
    """An event's ``data`` as its model; ``ValueError`` for a type this version does not know
    (a pydantic ``ValidationError``, also a ValueError, for a malformed one)."""
    model = EVENT_MODELS.get(kind)
    if model is None:
        raise ValueError(f"event type {kind!r} is not one of {', '.join(EVENT_TYPES)}")
    return model.model_validate(data)
