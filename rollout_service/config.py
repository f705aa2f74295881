"""The rollout side's composed configuration: one YAML file (``configs/*.yaml``) with
command-line overrides, one typed section per component (:func:`consolerl.config.load_config`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from env_workers.worker import WorkerConfig
from reward_service.actiontrail import TrailConfig
from reward_service.fusion import RewardConfig

from .agent import AgentConfig
from .experience import StreamConfig
from .orchestrator import OrchestratorConfig
from .policy import PolicyConfig


@dataclass(frozen=True)
class CloudSection:
    """``endpoint``: the OpenAPI endpoint (host:port); ``local``: start the embedded local
    cloud on that port."""

    endpoint: str = "127.0.0.1:18080"
    local: bool = True
    accounts_file: str = ""                 # "" = the local cloud's default accounts


@dataclass(frozen=True)
class EnvSection:
    """The env workers; their account leases live in the stream's Redis under
    ``lease_prefix``."""

    workers: int = 2
    num_cpus_per_worker: float = 0.5
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    lease_ttl_s: float = 60.0
    lease_prefix: str = "consolerl:pool"


@dataclass(frozen=True)
class RolloutConfig:
    cloud: CloudSection = field(default_factory=CloudSection)
    env: EnvSection = field(default_factory=EnvSection)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    orchestrator: OrchestratorConfig = field(default_factory=OrchestratorConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    trail: TrailConfig = field(default_factory=TrailConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
