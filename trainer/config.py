"""The trainer's section of the job config (:class:`cluster.config.JobConfig` holds it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from consolerl.config import AtLeast, Checked, OneOf

from .algo import AlgoConfig
from .checkpoint import CheckpointConfig
from .engine import EngineConfig
from .stream import ConsumerConfig


TRANSPORTS = ("collective", "object_store")


@dataclass(frozen=True)
class WeightsConfig(Checked):
    """How the weights reach the policy replicas after a step. ``transport``: ``collective``
    (a process group between trainer rank 0 and each replica's engine: NCCL on GPU, gloo on
    CPU; tensors streamed in chunks of ``chunk_mib``) or ``object_store`` (Ray's object store
    and a file per replica; also the fallback for a replica Ray restarted or one whose
    collective transfer failed). ``timeout_s``: how long forming a group, or one chunk, may
    take before the peer counts as dead."""

    transport: Annotated[str, OneOf(TRANSPORTS)] = "collective"
    chunk_mib: Annotated[int, AtLeast(1)] = 256
    timeout_s: Annotated[float, AtLeast(0, open=True)] = 120.0


@dataclass(frozen=True)
class TrainerConfig(Checked):
    """``steps``: optimizer steps of the GRPO stage; each takes ``orchestrator.groups_per_step``
    groups from the stream. ``publish_every``: weights reach the PolicyServers every k steps
    (the trainer version the staleness control reads moves with them). ``model``: the starting
    weights ("" = the SFT output when SFT runs, else ``policy.model``). ``time_budget_s``: a
    wall-clock budget for the whole job (SFT included; 0 = none): no GRPO step starts that the
    last step's duration says would end past it, and the run ends with its checkpoint.
    ``skip_zero_advantage``: rows whose advantage is 0 (a group whose samples all scored alike)
    skip the forward and backward: their policy loss has no gradient, so the step's gradient is
    unchanged (they still count in the token-mean's denominator); a step with no such row
    changes no weight. ``pause_generation``: the policy replicas hold new requests while a
    step's forward and backward run (for a CPU machine where both share the cores: two
    thread pools on two cores slow each other more than taking turns)."""

    steps: Annotated[int, AtLeast(1)] = 2
    publish_every: Annotated[int, AtLeast(1)] = 1
    model: str = ""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    read_timeout_s: float = 1800.0        # waiting for the stream before giving up a step
    time_budget_s: Annotated[float, AtLeast(0)] = 0.0     # 0 = no budget
    skip_zero_advantage: bool = True
    pause_generation: bool = False
