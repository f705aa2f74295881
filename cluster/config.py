"""The job's root configuration: one YAML file (``configs/*.yaml``) with ``section.key=value``
overrides (:func:`consolerl.config.load_config`), one typed section per component. This is the
only place that sees the whole tree; :mod:`cluster.builders` hands each component its own
section."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from consolerl.config import AtLeast, Checked, build, config_tree
from consolerl.errors import ConfigError
from env_workers.pool import EnvPoolConfig
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.observability.discovery import PublishConfig
from cluster.judges import JudgeSection
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig
from rollout_service.agent import MODEL_SETTINGS, AgentConfig
from rollout_service.experience import StreamConfig
from jobsapi.schema import SCRIPTED_MODELS
from jobsapi.blobs import BlobConfig
from jobsapi.retention import RetentionConfig
from jobsapi.scheduler import SchedulerConfig
from rollout_service.orchestrator import OrchestratorConfig
from rollout_service.models import agent_for_model, model_agent_settings
from rollout_service.policy import PolicyConfig
from datagen.augment import KINDS as AUGMENT_KINDS, AugmentConfig
from datagen.src import SRCConfig
from trainer.config import TrainerConfig
from trainer.sft import SftConfig


@dataclass(frozen=True)
class CloudSection:
    """``endpoint``: the OpenAPI endpoint (host:port); ``local``: start the embedded local
    cloud on that port."""

    endpoint: str = "127.0.0.1:18080"
    local: bool = True
    accounts_file: str = ""                 # "" = the local cloud's default accounts

    @property
    def console_url(self) -> str:
        """Where the console is when ``env.worker.console_url`` is "": the endpoint's host
        serves it (the local cloud does)."""
        return f"http://{self.endpoint}"

    @property
    def accounts_path(self) -> str:
        return self.accounts_file or str(DEFAULT_ACCOUNTS_FILE)


@dataclass(frozen=True)
class EvidenceSection:
    """``reward.evidence``: what the evidence channel (:mod:`reward_service.evidence`) checks
    an agent's infeasibility claim against besides the pages it saw. ``inventories``: drift
    profile -> a crawl of the console under it (``python -m doccheck.crawl``);
    empty: the committed crawls of the local console (``docs/inventory/``) when ``cloud.local``
    is on, none otherwise (claims are then checked against the pages seen only, and the agent
    must have followed the procedure up to the missing step)."""

    inventories: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.inventories, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and v
                for k, v in self.inventories.items()):
            raise ConfigError("reward.evidence.inventories: must map drift profiles (\"\" = "
                              "none) to inventory files")


@dataclass(frozen=True)
class RewardSection(RewardConfig):
    """``reward``: the rewards per verdict (:class:`~reward_service.fusion.RewardConfig`'s
    fields; ``fuse`` takes this section as it is) plus the reward service's channels:
    ``evidence`` (:class:`EvidenceSection`) and ``judges`` (:class:`cluster.judges.JudgeSection`,
    off by default)."""

    evidence: EvidenceSection = field(default_factory=EvidenceSection)
    judges: JudgeSection = field(default_factory=JudgeSection)


@dataclass(frozen=True)
class SftSection(SftConfig):
    """The SFT stage before GRPO: the trainer's :class:`~trainer.sft.SftConfig` (its fields and
    defaults; ``data`` "" = export oracle runs first, ``out`` "" = ``<run.dir>/sft``) plus what
    the job does around it: ``enabled``, and the oracle export's ``tasks`` (a regular
    expression over train-split task ids; "" = all) and ``episodes_per_task``;
    ``augment_copies``: variants of each exported trajectory that SFT also trains on
    (:mod:`datagen.augment`, written to ``<run.dir>/sft-augment.jsonl``; 0 = none) with the
    transforms ``augment_kinds`` (comma-separated: ids, values, decoys, wording), seeded by
    ``seed``; ``engine_tasks``: tasks the data engine synthesises from the console's
    inventory (:mod:`datagen.engine`, into ``<run.dir>/engine/tasks``; the families of
    ``eval.tasks`` kept out) with up to ``engine_wrong`` wrong documents made from them, whose
    confirmed teacher trajectories SFT also trains on (``<run.dir>/sft-engine.jsonl``; 0 =
    none)."""

    enabled: bool = False
    tasks: str = ""
    episodes_per_task: int = 1
    augment_copies: Annotated[int, AtLeast(0)] = 0
    augment_kinds: str = ",".join(AUGMENT_KINDS)
    engine_tasks: Annotated[int, AtLeast(0)] = 0
    engine_wrong: Annotated[int, AtLeast(0)] = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.augment()          # names a bad kind

    def augment(self) -> AugmentConfig:
        """The augmentation these settings ask for."""
        try:
            return AugmentConfig(self.augment_copies, tuple(
                k.strip() for k in self.augment_kinds.split(",") if k.strip()), self.seed)
        except ConfigError as exc:
            raise ConfigError(f"sft.{exc}".replace("augment ", "augment_", 1)) from None


@dataclass(frozen=True)
class SrcSection(SRCConfig):
    """Teacher-guided data after the oracle SFT (:mod:`datagen.src`): the SFT model
    is the student, the state-aware oracle the teacher. The collection's
    :class:`~datagen.src.SRCConfig` (its fields and defaults; the stage hands this section to it
    as it is): ``mode`` src (speculative segments of ``segment_steps``, review, rollback, at
    most ``max_rollbacks`` corrections an attempt) or step (step-level labels), at most
    ``archive_per_task`` distinct verifier-passing paths kept per task; plus what the job does
    around it: ``attempts_per_task`` attempts of each train-split task of ``tasks`` ("" =
    ``sft.tasks``), sampled at ``temperature`` (None: the agent's). The SFT model then trains
    ``epochs`` more on the corrections and the archive (``lr`` None: ``sft.lr``) into
    ``<run.dir>/sft-src``, where GRPO starts. ``data``: a JSONL file to train on instead of
    collecting. ``teacher``: ``oracle`` (the state-aware oracle) or an OpenAI-compatible
    endpoint ``http(s)://host:port[/v1]`` (a frontier model: ``teacher_model`` names it,
    ``teacher_api_key_env`` the environment variable with its key; its trajectories pass the
    same verifier, its replies must parse and name an element on the page)."""

    config_name = "src"

    enabled: bool = False
    teacher: str = "oracle"
    teacher_model: str = ""
    teacher_api_key_env: str | None = None
    attempts_per_task: Annotated[int, AtLeast(1)] = 2
    tasks: str = ""
    temperature: float | None = None
    epochs: Annotated[int, AtLeast(1)] = 1
    lr: float | None = None
    data: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher != "oracle":
            if not self.teacher.startswith(("http://", "https://")):
                raise ConfigError(f"src.teacher: 'oracle' or an http(s):// endpoint, got "
                                  f"{self.teacher!r}")
            if not self.teacher_model:
                raise ConfigError("src.teacher_model: required with an endpoint teacher")


@dataclass(frozen=True)
class EvalSection:
    """Success on held-out tasks (``split``), greedy, before and after training.
    ``heldout_states``: the training job also records the oracle's trajectories on these
    tasks (one episode each, the SFT export's record format and agent settings) into
    ``<run.dir>/heldout-states.jsonl``, the states ``benchmarks.dose`` probes; no training
    stage reads that file."""

    enabled: bool = False
    split: str = "heldout"
    tasks: str = ""
    episodes_per_task: int = 1
    temperature: float = 0.0
    heldout_states: bool = False


@dataclass(frozen=True)
class RunSection:
    """``dir``: where the run's files go (checkpoints, metrics.jsonl, curves); ``resume``:
    continue from the latest checkpoint in ``dir``; ``redis``: start an embedded Redis on the
    stream URL's port when nothing answers there; ``ray_address``: "" = the cluster of
    ``RAY_ADDRESS`` (under ``ray job submit``) or an embedded local one;
    ``services_host``: where the Redis and local cloud this job starts listen and are reached
    from other Ray nodes ("" = the driver's Ray node IP on a cluster, 127.0.0.1 with an
    embedded one; see :mod:`cluster.addresses`)."""

    dir: str = "runs/default"
    resume: bool = False
    redis: bool = True
    ray_address: str = ""
    ray_num_cpus: int = 0                   # embedded cluster only; 0 = the machine's
    services_host: str = ""


@dataclass(frozen=True)
class ObserveSection:
    """Prometheus discovery (:mod:`infra.observability.discovery`): every component serves its
    metrics on a free port of its node and announces it in the stream's Redis, labelled with
    ``run`` ("" = the run folder's name). ``host``: the address to serve on ("" = the Ray
    node's IP on a cluster, 127.0.0.1 with an embedded one); ``ttl_s``: how long a dead
    process stays listed (shown down)."""

    enabled: bool = True
    run: str = ""
    host: str = ""
    ttl_s: float = 60.0


@dataclass(frozen=True)
class ApiSection(Checked):
    """The jobs API (``python -m cluster.serve``): it listens on ``host:port``; its jobs live in
    the stream's Redis under ``prefix``; tokens (hashes) in ``tokens_file``; ``workers`` env
    workers run API jobs, leasing from the same account pool as training (``env``);
    ``models``: checkpoints or run folders the operator registers by name (besides ``live``
    and ``oracle``, the scripted teacher, which every jobs API offers);
    ``hosting``: ``actor`` (uvicorn in a Ray actor) or ``serve`` (Ray Serve); ``blobs``: where
    artifacts' bytes go (:class:`~jobsapi.blobs.BlobConfig`: a local directory,
    or an OSS bucket whose AccessKey is read from environment variables); ``retention``: how
    long finished jobs and their screenshots are kept, per team
    (:class:`~jobsapi.retention.RetentionConfig`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    prefix: str = "consolerl:api"
    tokens_file: str = "var/api/tokens.json"
    default_team: str = "default"
    workers: int = 2
    models: dict[str, str] = field(default_factory=dict)
    hosting: Literal["actor", "serve"] = "actor"
    sse_max_s: float = 300.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    blobs: BlobConfig = field(default_factory=BlobConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

    config_name = "api"

    def __post_init__(self) -> None:
        super().__post_init__()
        if "live" in self.models:
            raise ConfigError("api.models: 'live' is the served policy's name; register "
                              "checkpoints under other names")
        for name in SCRIPTED_MODELS:
            if name in self.models:
                raise ConfigError(f"api.models: {name!r} is a scripted executor's name; "
                                  "register checkpoints under other names")


@dataclass(frozen=True)
class JobConfig:
    """The root config: one section per component. Only :mod:`cluster` reads it whole; every
    component is built from its own section. ``base_model_agent``: model settings
    (:data:`~rollout_service.agent.MODEL_SETTINGS`) over the ``agent`` section's defaults for
    serving or evaluating a model folder without ``agent.json`` (the base model, a run saved
    before the file existed; what the ``agent`` section states holds over it); a trained model
    brings its own (:func:`served_agent`)."""

    # Where episodes run and how they are scored (cluster.builders.rollout_spec):
    cloud: CloudSection = field(default_factory=CloudSection)
    env: EnvPoolConfig = field(default_factory=EnvPoolConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    # The model settings for a model folder without agent.json (served_agent):
    base_model_agent: dict[str, Any] = field(default_factory=dict)
    orchestrator: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    trail: TrailConfig = field(default_factory=TrailConfig)
    reward: RewardSection = field(default_factory=RewardSection)
    # Training, evaluation and the run itself:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftSection = field(default_factory=SftSection)
    src: SrcSection = field(default_factory=SrcSection)
    eval: EvalSection = field(default_factory=EvalSection)
    run: RunSection = field(default_factory=RunSection)
    observe: ObserveSection = field(default_factory=ObserveSection)
    # The jobs API for other teams (cluster.serve):
    api: ApiSection = field(default_factory=ApiSection)

    def __post_init__(self) -> None:
        # Values the composition root derives and hands down (cluster.builders): set in the
        # file they would be a second copy that can disagree with the first.
        if self.trainer.algo.temperature is not None:
            raise ConfigError(
                "trainer.algo.temperature: the trainer computes log-probs at the sampling "
                f"temperature, agent.temperature ({self.agent.temperature:g}); set that one only")
        derived = {"env.pool.redis_url": (self.env.pool.redis_url, "stream.url"),
                   "env.pool.accounts_file": (self.env.pool.accounts_file,
                                              "cloud.accounts_file")}
        for name, (value, source) in derived.items():
            if value:
                raise ConfigError(f"{name}: taken from {source}; set that one only")
        unknown = sorted(set(self.base_model_agent) - set(MODEL_SETTINGS))
        if unknown:
            raise ConfigError(f"base_model_agent.{unknown[0]}: not a model setting; allowed: "
                              f"{', '.join(MODEL_SETTINGS)}")
        build(AgentConfig, {**asdict(self.agent), **self.base_model_agent}, "base_model_agent")


# Advantage estimators whose baseline is not the group's other samples.
_GROUPLESS_ESTIMATORS = ("reinforce_plus_plus",)


def check_training(config: JobConfig) -> None:
    """Settings that are each valid but together train something other than what they say
    (a :class:`ConfigError` naming both fields). Checked before a training job starts, not on
    every config: evaluation legitimately samples greedily, one episode per task."""
    agent, algo = config.agent, config.trainer.algo
    if config.orchestrator.mode == "sync" and config.trainer.publish_every != 1:
        raise ConfigError("orchestrator.mode=sync needs trainer.publish_every=1 (its batch "
                          "barrier waits for each step's version)")
    if not agent.temperature > 0:
        raise ConfigError(
            f"agent.temperature ({agent.temperature:g}) must be > 0 for training: the trainer "
            "computes log-probs at the sampling temperature (trainer.algo takes it from "
            "agent.temperature), and greedy decoding has none")
    if agent.top_p < 1.0:
        raise ConfigError(
            f"agent.top_p ({agent.top_p:g}) must be 1 for training with trainer.algo: the "
            "sampler's log-probs of a nucleus sample are renormalised over the nucleus, the "
            "trainer's are over the whole vocabulary, so the importance weights would be wrong")
    if config.orchestrator.group_size < 2 and algo.adv_estimator not in _GROUPLESS_ESTIMATORS:
        raise ConfigError(
            f"orchestrator.group_size ({config.orchestrator.group_size}) must be at least 2 "
            f"with trainer.algo.adv_estimator {algo.adv_estimator!r}: its baseline is the "
            "group's other samples, and a group of one silently becomes REINFORCE without a "
            "baseline")
    if algo.kl_coef > 0:
        raise ConfigError(
            f"trainer.algo.kl_coef ({algo.kl_coef:g}) must be 0: the GRPO trainer keeps no "
            "reference model to compute the KL term against")


def metrics_publish(config: JobConfig, run: str | None = None) -> PublishConfig | None:
    """Where the components announce their metrics (None when ``observe.enabled`` is off)."""
    if not config.observe.enabled:
        return None
    name = run or config.observe.run or Path(config.run.dir).name or "default"
    host = config.observe.host
    if not host and not (config.run.ray_address or os.environ.get("RAY_ADDRESS")):
        host = "127.0.0.1"      # an embedded cluster is this machine: stay off the network
    return PublishConfig(redis_url=config.stream.url, run=name, host=host,
                         ttl_s=config.observe.ttl_s)


def agent_named(path: str | Path | None, overrides: Sequence[str] = ()) -> frozenset[str]:
    """The model settings (:data:`~rollout_service.agent.MODEL_SETTINGS`) the config at
    ``path`` with ``overrides`` states in its ``agent`` section: a key of the file's ``agent``
    mapping or an ``agent.KEY=VALUE`` override, whatever its value. Named is told from
    default by the raw YAML mapping (:func:`consolerl.config.config_tree`), not by comparing
    with :class:`AgentConfig`'s defaults: a config that writes ``history_turns: 4`` states
    it, and a model trained with 2 is refused, though 4 is the default."""
    section = config_tree(path, overrides).get("agent")
    return frozenset(section).intersection(MODEL_SETTINGS) if isinstance(section, dict) \
        else frozenset()


def served_agent(config: JobConfig, named: frozenset[str] | set[str], model: str
                 ) -> AgentConfig:
    """The agent settings the model folder ``model`` is served or evaluated with: a trained
    model's ``agent.json`` settings, where ``config.agent`` states (``named``:
    :func:`agent_named`) none with another value
    (:func:`rollout_service.models.agent_for_model`; a :class:`ConfigError` naming the
    setting, the config's value and the model's otherwise); for a folder without the file,
    :func:`untrained_agent`."""
    settings = model_agent_settings(model)
    if settings is None:
        return untrained_agent(config, named)
    return agent_for_model(config.agent, named, settings, model)


def untrained_agent(config: JobConfig, named: frozenset[str] | set[str]) -> AgentConfig:
    """What a model folder without ``agent.json`` runs with: ``config.agent`` with
    ``base_model_agent`` over it, except the settings the ``agent`` section states
    (``named``: an ``agent.KEY=VALUE`` override holds over the file's base_model_agent)."""
    return replace(config.agent, **{k: v for k, v in config.base_model_agent.items()
                                    if k not in named})
