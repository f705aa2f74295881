"""The update engine: data-parallel trainer workers (Ray actors) around one causal LM each.

Each :class:`TrainerWorker` holds a full replica of the model wrapped in torch's
``DistributedDataParallel`` (``gloo`` on CPU, ``nccl`` on GPU), optionally with LoRA adapters
(peft). One optimizer step (:meth:`TrainerWorker.step`) on a rank's shard of the batch:

1. micro-batches by a token budget; each one's forward gives the log-probs of the sampled
   tokens under the current weights, and those, detached, are the "old" policy of the PPO
   ratio (one update per batch: the weights before the step are the ones in use), while the
   rollout log-probs enter through the staleness importance weights;
2. gradients accumulated locally (``no_sync``) and averaged across ranks on the last
   micro-batch; the loss (:func:`trainer.algo.compute_loss`) is scaled by the global token
   count so that the accumulated, averaged gradient is the gradient of the global token-mean
   loss;
3. gradient clipping, the optimizer step.

:meth:`state_dict` gives the full model in Hugging Face names (LoRA merged in), which is what
PolicyServers load and checkpoints store.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from consolerl.config import check_int, check_resources
from consolerl.errors import ConfigError
from consolerl.tensors import PartialWeights
from infra.local_cloud import free_port

from .algo import AlgoConfig, TrainBatch, compute_loss, response_logprobs


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.lr < 1.0:
            raise ConfigError(f"OptimConfig.lr: must be in (0, 1), got {self.lr!r}")
        if self.grad_clip < 0:
            raise ConfigError(f"OptimConfig.grad_clip: must be >= 0 (0 = off), "
                              f"got {self.grad_clip!r}")


@dataclass(frozen=True)
class LoraConfig:
    """``rank`` 0 trains every weight; > 0 trains LoRA adapters on ``target_modules``."""

    rank: int = 0
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        check_int("LoraConfig.rank", self.rank, 0)


@dataclass(frozen=True)
class EngineConfig:
    """``workers``: data-parallel ranks (Ray actors); ``backend``: ``gloo`` (CPU) or ``nccl``
    (GPU); ``micro_batch_tokens``: padded tokens (rows x length) per forward/backward, rows
    sorted by length first so that a micro-batch pads little. ``autocast``: the forward and
    backward in bf16 autocast over fp32 weights: ``auto`` where the device computes bf16
    natively (a GPU with bf16, a CPU with AVX512-BF16 or AMX; elsewhere emulated bf16 is slower
    than fp32), ``bfloat16`` always, ``off`` never. ``memory_gib``: what Ray reserves for each
    worker (0 = nothing): Ray then places workers where that much memory is free instead of
    letting its memory monitor kill them. ``train_layers``: 0 trains the whole model; N > 0
    trains only the top N decoder layers and the final norm (LoRA: adapters on those layers
    only); the embeddings, the (tied) output head and the layers below run forward only, keep
    no activations for the backward and have no optimizer state. The gradient of what trains
    is exact; on prompt-heavy batches a step then costs about (L - N) / 3L + N / L of full
    fine-tuning for a model of L layers. ``share_prefix``: the prompt prefix common to every
    row of a micro-batch (the system prompt; a group's task) runs once and its keys and values
    serve every row; the log-probs and the gradient are the same as without (not with gradient
    checkpointing, whose recomputation cannot replay a cache)."""

    workers: int = 1
    strategy: str = "ddp"
    nodes: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    dtype: str = "float32"
    micro_batch_tokens: int = 8192
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    gradient_checkpointing: bool = False
    autocast: str = "auto"
    memory_gib: float = 0.0
    threads_per_worker: int = 0                 # torch intra-op threads; 0 = torch's default
    train_layers: int = 0
    share_prefix: bool = True
    # Ray custom resources each worker needs (e.g. {"trainer": 1}).
    resources: dict[str, float] = field(default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        check_int("EngineConfig.workers", self.workers, 1)
        check_int("EngineConfig.nodes", self.nodes, 1)
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"EngineConfig.strategy: must be one of {', '.join(STRATEGIES)}, "
                              f"got {self.strategy!r}")
        if self.workers % self.nodes:
            raise ConfigError(f"EngineConfig.nodes: {self.workers} workers do not divide "
                              f"evenly over {self.nodes} nodes")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"EngineConfig.backend: must be gloo or nccl, "
                              f"got {self.backend!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"EngineConfig.dtype: must be float32, bfloat16 or float16, "
                              f"got {self.dtype!r}")
        if self.autocast not in AUTOCAST_MODES:
            raise ConfigError(f"EngineConfig.autocast: must be one of "
                              f"{', '.join(AUTOCAST_MODES)}, got {self.autocast!r}")
        if not self.memory_gib >= 0:
            raise ConfigError(f"EngineConfig.memory_gib: must be >= 0 (0 = no reservation), "
                              f"got {self.memory_gib!r}")
        check_int("EngineConfig.train_layers", self.train_layers, 0)
        check_resources("EngineConfig.resources", self.resources)
        if self.micro_batch_tokens < 64:
            raise ConfigError(f"EngineConfig.micro_batch_tokens: must be >= 64, "
                              f"got {self.micro_batch_tokens!r}")


AUTOCAST_MODES = ("auto", "bfloat16", "off")
STRATEGIES = ("ddp", "fsdp2")
_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16(device: str) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:N") computes bf16 matmuls natively."""
    import torch
    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return any(flag in flags for flag in _BF16_CPU_FLAGS)


def autocast_dtype(engine: EngineConfig, device: str) -> Any:
    """The autocast dtype of ``engine`` on ``device`` (None: no autocast)."""
    import torch
    if engine.autocast == "off" or engine.dtype != "float32":
        return None
    if engine.autocast == "bfloat16" or native_bf16(device):
        return torch.bfloat16
    return None


def _decoder(model: Any) -> Any:
    """The decoder stack of a Hugging Face causal LM (Llama, Qwen, Mistral: ``model.model``)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ConfigError(f"EngineConfig.train_layers: {type(model).__name__} has no "
                          f"model.layers to choose from; set train_layers: 0")
    return inner


def top_layers(model: Any, n: int) -> list[int] | None:
    """The indexes of the top ``n`` decoder layers of ``model`` (None: ``n`` is 0, all)."""
    if not n:
        return None
    total = len(_decoder(model).layers)
    if n > total:
        raise ConfigError(f"EngineConfig.train_layers: {n} is more than the model's {total} "
                          f"layers")
    return list(range(total - n, total))


def freeze_below(model: Any, trained: list[int]) -> None:
    """Only the layers ``trained`` and the final norm keep ``requires_grad``."""
    inner = _decoder(model)
    for p in model.parameters():
        p.requires_grad_(False)
    keep = [inner.layers[i] for i in trained]
    if getattr(inner, "norm", None) is not None:
        keep.append(inner.norm)
    for module in keep:
        for p in module.parameters():
            p.requires_grad_(True)


MIN_SHARED_PREFIX = 16      # fewer common prompt tokens than this: not worth a second call


def common_prefix(mb: TrainBatch) -> int:
    """How many leading prompt tokens every row of ``mb`` has in common (left padding aside),
    at most the shortest prompt's length less one: the last prompt token's logits predict the
    first response token, so each row keeps at least that one."""
    p = mb.prompt_len
    lens = [int(n) for n in mb.attention_mask_BT[:, :p].sum(dim=1).tolist()]
    limit = min(lens) - 1
    if limit <= 0:
        return 0
    first = mb.input_ids_BT[0, p - lens[0]:p - lens[0] + limit]
    for i in range(1, mb.num_rows):
        row = mb.input_ids_BT[i, p - lens[i]:p - lens[i] + limit]
        differ = (row != first).nonzero()
        if len(differ):
            limit = int(differ[0, 0])
            if limit == 0:
                return 0
            first = first[:limit]
    return limit


# compute_loss metrics that are a micro-batch's share of the step's value (summed, not averaged)
_SHARE_METRICS = frozenset({"loss", "pg_loss", "kl"})


class TrainerWorker:
    """One data-parallel rank: the model is loaded on construction; :meth:`init_distributed`
    joins the process group (rendezvous at rank 0's :meth:`address`) and builds the
    optimizer."""

    def __init__(self, rank: int, world_size: int, model_path: str, engine: EngineConfig,
                 algo: AlgoConfig):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.rank, self.world_size = rank, world_size
        self.engine_config, self.algo = engine, algo
        if engine.threads_per_worker:
            torch.set_num_threads(engine.threads_per_worker)
        self.device = torch.device(engine.device if engine.device != "cuda"
                                   else f"cuda:{torch.cuda.current_device()}")
        torch.manual_seed(1234 + rank)
        model = AutoModelForCausalLM.from_pretrained(model_path,
                                                     dtype=getattr(torch, engine.dtype))
        model.to(self.device)
        if engine.gradient_checkpointing:
            # Non-reentrant: works with frozen inputs (LoRA) and under autocast.
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.autocast = autocast_dtype(engine, str(self.device))
        trained = top_layers(model, engine.train_layers)
        if engine.lora.rank:
            from peft import LoraConfig as PeftLora
            from peft import get_peft_model
            model = get_peft_model(model, PeftLora(
                r=engine.lora.rank, lora_alpha=engine.lora.alpha,
                lora_dropout=engine.lora.dropout,
                target_modules=list(engine.lora.target_modules), task_type="CAUSAL_LM",
                layers_to_transform=trained or None))
        elif trained is not None:
            freeze_below(model, trained)
        self.model = model
        self.tied = bool(getattr(self._base().config, "tie_word_embeddings", False))
        self.ddp: Any = model
        self.optimizer: Any = None
        self.params: list[Any] = []
        self.steps = 0
        self.loaded_checkpoint = False

    def address(self) -> str:
        """``host:port`` for the process group's rendezvous (called on rank 0)."""
        return f"{_node_ip()}:{free_port()}"

    def init_distributed(self, master: str) -> int:
        torch = self.torch
        if self.world_size > 1:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel
            dist.init_process_group(self.engine_config.backend, init_method=f"tcp://{master}",
                                    rank=self.rank, world_size=self.world_size)
            self.ddp = DistributedDataParallel(self.model)
        o = self.engine_config.optim
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=o.lr, betas=(o.beta1, o.beta2),
                                           eps=o.eps, weight_decay=o.weight_decay)
        return self.rank

    def _base(self) -> Any:
        return self.model.get_base_model() if self.engine_config.lora.rank else self.model

    def ping(self) -> int:
        return self.rank

    # -- one optimizer step ------------------------------------------------------------------

    def _forward(self, module: Any, mb: TrainBatch) -> Any:
        d = self.device
        mb = mb.to(d)
        autocast = self.torch.autocast(device_type=d.type, dtype=self.autocast) \
            if self.autocast is not None else contextlib.nullcontext()
        shared = common_prefix(mb) if (self.engine_config.share_prefix and mb.num_rows > 1
                                       and not self.engine_config.gradient_checkpointing) \
            else 0
        with autocast:
            kwargs: dict[str, Any] = {"use_cache": False, "attention_mask": mb.attention_mask_BT}
            if shared >= MIN_SHARED_PREFIX:
                mb, kwargs = self._prefix_once(mb, shared)
            # Only the positions that predict response tokens: [B, R+1, V], not [B, T, V].
            out = module(input_ids=mb.input_ids_BT, position_ids=mb.position_ids_BT,
                         logits_to_keep=mb.response_len + 1, **kwargs)
        # The log-softmax in fp32: bf16 log-probs would put ~1e-2 noise on the PPO ratio.
        return response_logprobs(out.logits.float(), mb, self.algo.sampling_temperature)

    def _prefix_once(self, mb: TrainBatch, shared: int) -> tuple[TrainBatch, dict[str, Any]]:
        """Run the ``shared`` prompt tokens common to every row once; return the rest of the
        micro-batch and the forward's arguments that put the prefix's keys and values (still
        in the graph: the backward reaches the prefix through them) before every row."""
        from dataclasses import replace

        from transformers import DynamicCache
        torch = self.torch
        p = mb.prompt_len
        lens = mb.attention_mask_BT[:, :p].sum(dim=1)
        start = p - int(lens.max())                  # first column of the longest prompt
        prefix = mb.input_ids_BT[int(lens.argmax()), start:start + shared]
        cache = DynamicCache(config=self._base().config)
        # The inner model, not DDP's wrapper: DDP expects one forward per backward; autograd
        # sums both paths' gradients into each weight before DDP's hooks see them.
        positions = torch.arange(shared, device=prefix.device)[None]
        self.model(input_ids=prefix[None], position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(mb.num_rows)
        # The rest: columns from the longest prompt's first unshared token; a shorter row's
        # shared tokens (and its left padding) in there are masked out. Positions are kept:
        # they already count the prefix.
        cut = start + shared
        cols = torch.arange(cut, mb.input_ids_BT.shape[1], device=lens.device)
        own = cols[None, :] >= (p - lens + shared)[:, None]
        mask = mb.attention_mask_BT[:, cut:] * own.to(mb.attention_mask_BT.dtype)
        rest = replace(mb, input_ids_BT=mb.input_ids_BT[:, cut:], attention_mask_BT=mask,
                       position_ids_BT=mb.position_ids_BT[:, cut:], prompt_len=p - cut)
        full_mask = torch.cat([torch.ones_like(mask[:, :1]).expand(-1, shared), mask], dim=1)
        return rest, {"use_cache": True, "past_key_values": cache,
                      "attention_mask": full_mask}

    def step(self, shard: TrainBatch, global_tokens: int, global_seqs: int,
             ref_logprobs: list[Any] | None = None) -> dict[str, float]:
        """One optimizer step on this rank's ``shard`` (``global_tokens`` / ``global_seqs``:
        trained response tokens / rows of the whole step over all ranks). Returns this rank's
        metrics: ``loss``, ``pg_loss``, ``kl`` are this rank's share (their mean over ranks is
        the step's value); the others are means over this rank's tokens."""
        torch = self.torch
        t0 = time.perf_counter()
        budget = self.engine_config.micro_batch_tokens
        micro = shard.micro_batches(budget, by_length=True) \
            if shard.input_ids_BT.shape[0] else []
        if not micro:
            raise ConfigError(f"rank {self.rank}: empty shard; a step needs at least "
                              f"{self.world_size} rows")
        # One optimizer step per batch: the weights before the step are the weights of every
        # micro-batch's forward, so the "old" log-probs of the PPO ratio are that forward's,
        # detached (verl's on-policy shortcut; a separate no-grad pass would cost a third more).
        self.model.train()              # (gradient checkpointing only acts in train mode)
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for i, mb in enumerate(micro):
            last = i == len(micro) - 1
            sync = contextlib.nullcontext() if (last or self.world_size == 1) \
                else self.ddp.no_sync()
            with sync:
                new = self._forward(self.ddp, mb)
                ref = ref_logprobs[i] if ref_logprobs is not None else None
                loss, metrics = compute_loss(new, new.detach(), mb, self.algo,
                                             batch_num_tokens=global_tokens,
                                             batch_num_seqs=global_seqs,
                                             dp_size=self.world_size, ref_logprobs_BR=ref)
                loss.backward()
            weight = float(mb.num_tokens())
            for k, v in metrics.items():
                share = k in _SHARE_METRICS
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if share else weight)
        t_optim = time.perf_counter()
        clip = self.engine_config.optim.grad_clip
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip)) if clip \
            else float(torch.norm(torch.stack([p.grad.norm() for p in self.params
                                               if p.grad is not None])))
        self.optimizer.step()
        self.steps += 1
        tokens = float(shard.num_tokens()) or 1.0
        out = {k: (v if k in _SHARE_METRICS else v / tokens) for k, v in sums.items()}
        out.update(grad_norm=grad_norm, tokens=float(shard.num_tokens()),
                   rows=float(shard.input_ids_BT.shape[0]), micro_batches=float(len(micro)),
                   fwd_bwd_s=t_optim - t0, optim_s=time.perf_counter() - t_optim,
                   step_s=time.perf_counter() - t0,
                   padded_tokens=float(sum(m.input_ids_BT.numel() for m in micro)),
                   bf16=float(self.autocast is not None))
        return out

    # -- weights and checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The full model in Hugging Face names, on CPU. With LoRA, each adapted weight is
        ``W + delta`` computed aside (peft's ``get_delta_weight``): the base weights are never
        merged and unmerged in place, which would drift them by rounding at every publish."""
        torch = self.torch
        if not self.engine_config.lora.rank:
            return {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
        out: dict[str, Any] = {}
        for k, v in self.model.state_dict().items():
            if "lora_" in k:
                continue
            out[_base_name(k)] = v.detach().to("cpu")
        with torch.no_grad():
            for name, module in self.model.named_modules():
                if not (hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")):
                    continue
                key = _base_name(f"{name}.base_layer.weight")
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                out[key] = (module.base_layer.weight.detach() + delta).to("cpu")
        return out

    def published_state(self) -> dict[str, Any]:
        """What a policy server needs to serve the current weights: with ``train_layers`` (no
        LoRA) only the weights that train (:class:`~consolerl.tensors.PartialWeights`; the
        frozen rest is what every server started from), else (and after a checkpoint was
        loaded) :meth:`state_dict`."""
        if not self.engine_config.train_layers or self.engine_config.lora.rank \
                or self.loaded_checkpoint:
            # After a checkpoint load the frozen layers are the checkpoint's, which need not
            # be what the policy servers started from (it may come from other settings).
            return self.state_dict()
        return PartialWeights({name: p.detach().to("cpu")
                               for name, p in self.model.named_parameters() if p.requires_grad})

    def training_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainable model state, optimizer state) for a checkpoint."""
        model_state = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
        return model_state, self.optimizer.state_dict()

    def load_training_state(self, model_state: dict[str, Any],
                            optimizer_state: dict[str, Any] | None) -> None:
        missing, unexpected = self.model.load_state_dict(model_state, strict=False)
        missing = [m for m in missing if not (self.tied and m.endswith("lm_head.weight"))]
        if missing or unexpected:
            raise ConfigError(f"checkpoint does not fit the model: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.loaded_checkpoint = True

    def save_checkpoint(self, config: Any, step: int, version: int,
                        trainer_state: dict[str, Any]) -> str:
        """Write this rank's model and optimizer as a checkpoint (rank 0; the folder is shared
        storage on a cluster): the tensors never cross the object store."""
        from .checkpoint import CheckpointManager
        model_state, optimizer_state = self.training_state()
        return str(CheckpointManager(config).save(step, version, model_state, optimizer_state,
                                                  trainer_state))

    def load_checkpoint(self, config: Any, path: str) -> int:
        from .checkpoint import CheckpointManager
        ckpt = CheckpointManager(config).load(path)
        self.load_training_state(ckpt.model_state, ckpt.optimizer_state)
        return ckpt.step

    def save_pretrained(self, folder: str) -> str:
        """The merged model as a Hugging Face folder (e.g. for evaluation or serving)."""
        base = self._base()
        state = self.state_dict()
        base.save_pretrained(folder, state_dict=state)
        return folder

    def shutdown(self) -> None:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()

    def weight_transfer(self, op: str, *args: Any) -> Any:
        """The trainer's end of the weight groups to the policy replicas
        (:class:`rollout_service.weight_transfer.WeightSender`, on rank 0), called on every
        rank: ``("open", key, world, backend, timeout_s)`` -> the group's spec,
        ``("close", key)``, ``("send", keys, dtype, chunk_bytes)`` -> per key the outcome."""
        from rollout_service.weight_transfer import WeightSender

        if self.rank != 0:
            return None                    # (FSDP: the other ranks' part of the gather)
        sender = self.__dict__.setdefault("_weight_sender", WeightSender(_node_ip()))
        if op != "send":
            return getattr(sender, op)(*args)
        keys, dtype, chunk_bytes = args
        state = self.published_state()
        return sender.send(state.items(), keys, dtype, chunk_bytes,
                           isinstance(state, PartialWeights))


TrainerWorkerActor = ray.remote(TrainerWorker)


def worker_options(engine: EngineConfig) -> dict[str, Any]:
    """The Ray actor options of every trainer worker: CPUs, GPUs, memory, the custom
    resources its config names (only nodes that offer them host it), its threads."""
    options: dict[str, Any] = {"num_cpus": engine.num_cpus_per_worker}
    if engine.num_gpus_per_worker:
        options["num_gpus"] = engine.num_gpus_per_worker
    if engine.memory_gib:
        options["memory"] = int(engine.memory_gib * 2**30)
    if engine.resources:
        options["resources"] = dict(engine.resources)
    threads = engine.threads_per_worker or max(1, int(engine.num_cpus_per_worker))
    options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(threads)}}
    return options


def start_workers(model_path: str, engine: EngineConfig, algo: AlgoConfig) -> list[Any]:
    """``engine.workers`` ranks as Ray actors, joined in one process group (rendezvous on
    rank 0's node)."""
    options = worker_options(engine)
    workers = [TrainerWorkerActor.options(**options).remote(
        rank, engine.workers, model_path, engine, algo) for rank in range(engine.workers)]
    master = ray.get(workers[0].address.remote())
    ray.get([w.init_distributed.remote(master) for w in workers])
    return workers


def _base_name(peft_key: str) -> str:
    """A peft parameter name in the base model's names."""
    return peft_key.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _node_ip() -> str:
    try:
        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray
        return os.environ.get("CONSOLERL_NODE_IP", "127.0.0.1")
