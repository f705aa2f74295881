"""The job's composed configuration: the rollout side's sections (:class:`RolloutConfig`) plus
the trainer, the SFT stage and the run itself; one YAML file (``configs/*.yaml``) with
``section.key=value`` overrides (:func:`consolerl.config.load_config`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from consolerl.config import check_int
from consolerl.errors import ConfigError
from rollout_service.config import RolloutConfig

from .algo import AlgoConfig
from .checkpoint import CheckpointConfig
from .engine import EngineConfig
from .stream import ConsumerConfig


@dataclass(frozen=True)
class TrainerConfig:
    """``steps``: optimizer steps of the GRPO stage; each takes ``orchestrator.groups_per_step``
    groups from the stream. ``publish_every``: weights reach the PolicyServers every k steps
    (the trainer version the staleness control reads moves with them). ``model``: the starting
    weights ("" = the SFT output when SFT runs, else ``policy.model``). ``time_budget_s``: a
    wall-clock budget for the whole job (SFT included; 0 = none): no GRPO step starts that the
    last step's duration says would end past it, and the run ends with its checkpoint."""

    steps: int = 2
    publish_every: int = 1
    model: str = ""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    read_timeout_s: float = 1800.0        # waiting for the stream before giving up a step
    time_budget_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "publish_every"):
            check_int(f"TrainerConfig.{name}", getattr(self, name), 1)
        if self.time_budget_s < 0:
            raise ConfigError(f"TrainerConfig.time_budget_s must be >= 0 (0 = no budget), "
                              f"got {self.time_budget_s}")


@dataclass(frozen=True)
class SftSection:
    """The SFT stage before GRPO: oracle trajectories exported from ``tasks`` (a regular
    expression over train-split task ids; "" = all), ``epochs`` over them."""

    enabled: bool = False
    data: str = ""                         # a JSONL file; "" = export oracle runs first
    tasks: str = ""
    episodes_per_task: int = 1
    epochs: int = 2
    lr: float = 5e-5
    max_tokens_per_batch: int = 8192


@dataclass(frozen=True)
class EvalSection:
    """Success on held-out tasks (``split``), greedy, before and after training."""

    enabled: bool = False
    split: str = "heldout"
    tasks: str = ""
    episodes_per_task: int = 1
    temperature: float = 0.0


@dataclass(frozen=True)
class RunSection:
    """``dir``: where the run's files go (checkpoints, metrics.jsonl, curves); ``resume``:
    continue from the latest checkpoint in ``dir``; ``redis``: start an embedded Redis on the
    stream URL's port when nothing answers there; ``ray_address``: "" = the cluster of
    ``RAY_ADDRESS`` (under ``ray job submit``) or an embedded local one."""

    dir: str = "runs/default"
    resume: bool = False
    redis: bool = True
    ray_address: str = ""
    ray_num_cpus: int = 0                   # embedded cluster only; 0 = the machine's
    metrics_port: int = 0                   # the trainer's /metrics (Prometheus); 0 = off


@dataclass(frozen=True)
class JobConfig(RolloutConfig):
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftSection = field(default_factory=SftSection)
    eval: EvalSection = field(default_factory=EvalSection)
    run: RunSection = field(default_factory=RunSection)
