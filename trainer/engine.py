"""The update engine: data-parallel trainer workers (Ray actors) around one causal LM each.

Two strategies (``EngineConfig.strategy``), both over ``gloo`` on CPU and ``nccl`` on GPU:

- ``ddp``: each :class:`TrainerWorker` holds a full replica of the model wrapped in torch's
  ``DistributedDataParallel``, optionally with LoRA adapters (peft);
- ``fsdp2``: torch's ``fully_shard`` over each decoder layer and the root
  (:mod:`trainer.sharding`): parameters, gradients and optimizer states are split over the
  ranks, so reading the full weights (:meth:`TrainerWorker.iter_published`) and writing a
  checkpoint are collective: every rank is called, rank 0 gets the result.

Weights, gradients and optimizer states are fp32 (the master copy) whatever the compute
dtype; ``dtype: bfloat16`` computes the forward and backward in bf16 (autocast; under FSDP2
the gathered weights are bf16 copies and gradients are reduced in fp32).

One optimizer step (:meth:`TrainerWorker.step`) on a rank's shard of the batch:

1. micro-batches by a token budget; each one's forward gives the log-probs of the sampled
   tokens under the current weights, and those, detached, are the "old" policy of the PPO
   ratio (one update per batch: the weights before the step are the ones in use), while the
   rollout log-probs enter through the staleness importance weights;
2. gradients accumulated locally (DDP's ``no_sync``, FSDP2's
   ``set_requires_gradient_sync(False)``) and averaged across ranks on the last micro-batch; the loss (:func:`trainer.algo.compute_loss`) is scaled by the global token
   count so that the accumulated, averaged gradient is the gradient of the global token-mean
   loss;
3. gradient clipping (the norm over all shards), the optimizer step.

:meth:`state_dict` gives the full model in Hugging Face names (LoRA merged in), which is what
PolicyServers load; checkpoints store it (DDP) or every rank's shards (FSDP2, through
``torch.distributed.checkpoint``; :mod:`trainer.checkpoint`).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import ray

from consolerl.config import AtLeast, Between, Checked, OneOf, Satisfies, check_resources
from consolerl.errors import ConfigError
from consolerl.tensors import PartialWeights
from infra.local_cloud import free_port

from .algo import AlgoConfig, TrainBatch, compute_loss, response_logprobs
from .placement import TrainerRanks, place_ranks, worker_resources


@dataclass(frozen=True)
class OptimConfig(Checked):
    """AdamW's settings; ``grad_clip`` 0 = off."""

    lr: Annotated[float, Between(0, 1, low_open=True, high_open=True)] = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: Annotated[float, AtLeast(0)] = 1.0


@dataclass(frozen=True)
class LoraConfig(Checked):
    """``rank`` 0 trains every weight; > 0 trains LoRA adapters on ``target_modules``."""

    rank: Annotated[int, AtLeast(0)] = 0
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class EngineConfig(Checked):
    """``workers``: data-parallel ranks (Ray actors); ``strategy``: ``ddp`` (a full replica per
    rank) or ``fsdp2`` (parameters, gradients and optimizer states sharded over the ranks; no
    LoRA); ``backend``: ``gloo`` (CPU) or ``nccl`` (GPU); ``dtype``: the compute dtype:
    ``float32``, or ``bfloat16`` = bf16 autocast over fp32 master weights and fp32 optimizer
    states, on any device (``float16`` is refused: it needs loss scaling, which the engine does
    not do); ``micro_batch_tokens``: padded tokens (rows x length) per forward/backward, rows
    sorted by length first so that a micro-batch pads little. ``autocast`` (with ``dtype:
    float32``): the forward and backward in bf16 autocast over fp32 weights: ``auto`` where the
    device computes bf16 natively (a GPU with bf16, a CPU with AVX512-BF16 or AMX; elsewhere
    emulated bf16 is slower than fp32), ``bfloat16`` always, ``off`` never. ``memory_gib``: what Ray reserves for each
    worker (0 = nothing): Ray then places workers where that much memory is free instead of
    letting its memory monitor kill them. ``train_layers``: 0 trains the whole model; N > 0
    trains only the top N decoder layers and the final norm (LoRA: adapters on those layers
    only); the embeddings, the (tied) output head and the layers below run forward only, keep
    no activations for the backward and have no optimizer state. The gradient of what trains
    is exact; on prompt-heavy batches a step then costs about (L - N) / 3L + N / L of full
    fine-tuning for a model of L layers. ``share_prefix``: the prompt prefix common to every
    row of a micro-batch (the system prompt; a group's task) runs once and its keys and values
    serve every row; the log-probs and the gradient are the same as without (not with gradient
    checkpointing, whose recomputation cannot replay a cache). ``nodes``: the ranks go on
    that many nodes, ``workers / nodes`` each, a node's ranks consecutive, all in one Ray
    placement group (:mod:`trainer.placement`) that is waited for up to
    ``placement_timeout_s`` before a clear error."""

    workers: Annotated[int, AtLeast(1)] = 1
    strategy: Annotated[str, OneOf(STRATEGIES)] = "ddp"
    nodes: Annotated[int, AtLeast(1)] = 1
    backend: Literal["gloo", "nccl"] = "gloo"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"
    micro_batch_tokens: Annotated[int, AtLeast(64)] = 8192
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    gradient_checkpointing: bool = False
    autocast: Annotated[str, OneOf(AUTOCAST_MODES)] = "auto"
    memory_gib: Annotated[float, AtLeast(0)] = 0.0    # 0 = no reservation
    # How long to wait for the ranks' placement group.
    placement_timeout_s: Annotated[float, AtLeast(0, open=True)] = 300.0
    threads_per_worker: int = 0                 # torch intra-op threads; 0 = torch's default
    train_layers: Annotated[int, AtLeast(0)] = 0
    share_prefix: bool = True
    # Ray custom resources each worker needs (e.g. {"trainer": 1}).
    resources: Annotated[dict[str, float], Satisfies(check_resources)] = field(
        default_factory=dict)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if self.dtype == "float16":     # say why, not only what is allowed
            raise ConfigError("EngineConfig.dtype: float16 training needs loss scaling, which "
                              "the engine does not do; use bfloat16 (bf16 compute over fp32 "
                              "master weights) or float32")
        super().__post_init__()
        if self.workers % self.nodes:
            raise ConfigError(f"EngineConfig.nodes: {self.workers} workers do not divide "
                              f"evenly over {self.nodes} nodes")
        if self.dtype == "bfloat16" and self.autocast == "off":
            raise ConfigError("EngineConfig.autocast: off contradicts dtype: bfloat16 (bf16 "
                              "compute); set dtype: float32 for fp32 compute")
        if self.strategy == "fsdp2" and self.lora.rank:
            raise ConfigError(f"EngineConfig.lora.rank: {self.lora.rank} with strategy fsdp2; "
                              f"LoRA trains under strategy ddp only (set lora.rank: 0 or "
                              f"strategy: ddp)")


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
    """The compute dtype of ``engine`` on ``device``, which the forward and backward autocast
    to over fp32 weights (None: fp32 compute)."""
    import torch
    if engine.dtype == "bfloat16":
        return torch.bfloat16
    if engine.autocast == "off":
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
        # fp32 master weights whatever the compute dtype: AdamW's updates at small learning
        # rates are far below a bf16 weight's rounding step and would be lost.
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
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
        self.sharded = engine.strategy == "fsdp2"
        self._gathered = False
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
        """Join the process group at ``master`` (``""`` with one rank: a group of its own,
        which FSDP2 needs even alone), wrap or shard the model, build the optimizer."""
        torch = self.torch
        if self.world_size > 1 or self.sharded:
            import torch.distributed as dist
            dist.init_process_group(self.engine_config.backend,
                                    init_method=f"tcp://{master or f'127.0.0.1:{free_port()}'}",
                                    rank=self.rank, world_size=self.world_size)
        if self.sharded:
            from .sharding import shard_model
            shard_model(self.model, self.device.type, self.world_size, self.autocast)
        elif self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
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

    def _shared_prefix(self, mb: TrainBatch) -> int:
        """The prompt tokens :meth:`_forward` runs once for ``mb`` (0: none)."""
        shared = common_prefix(mb) if (self.engine_config.share_prefix and mb.num_rows > 1
                                       and not self.engine_config.gradient_checkpointing) \
            else 0
        return shared if shared >= MIN_SHARED_PREFIX else 0

    def _forward(self, module: Any, mb: TrainBatch, shared: int | None = None) -> Any:
        """Log-probs of ``mb``'s response tokens; ``shared``: the prefix to run once (None:
        :meth:`_shared_prefix`)."""
        d = self.device
        mb = mb.to(d)
        autocast = self.torch.autocast(device_type=d.type, dtype=self.autocast) \
            if self.autocast is not None else contextlib.nullcontext()
        if shared is None:
            shared = self._shared_prefix(mb)
        with autocast:
            kwargs: dict[str, Any] = {"use_cache": False, "attention_mask": mb.attention_mask_BT}
            if shared:
                if self.sharded:
                    self._keep_gathered(True)
                mb, kwargs = self._prefix_once(mb, shared)
            # Only the positions that predict response tokens: [B, R+1, V], not [B, T, V].
            out = module(input_ids=mb.input_ids_BT, position_ids=mb.position_ids_BT,
                         logits_to_keep=mb.response_len + 1, **kwargs)
        # The log-softmax in fp32: bf16 log-probs would put ~1e-2 noise on the PPO ratio.
        return response_logprobs(out.logits.float(), mb, self.algo.sampling_temperature)

    def _plan(self, micro: list[TrainBatch]) -> list[tuple[TrainBatch, int, bool]]:
        """``(micro-batch, shared prefix, filler)`` in the order to run. Under FSDP2 every
        forward and backward gathers each layer's weights from all ranks, so the ranks must
        run alike: as many micro-batches (the largest split in two, or a zero-weighted filler
        row, until each rank has the most any has) and a shared prefix in micro-batch i only
        where every rank has one there."""
        plan = [(mb, self._shared_prefix(mb), False) for mb in micro]
        if not self.sharded or self.world_size == 1:
            return plan
        torch = self.torch
        import torch.distributed as dist
        n = torch.tensor([len(plan)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        while len(plan) < int(n):
            i = max(range(len(plan)), key=lambda j: plan[j][0].num_rows)
            mb = plan[i][0]
            if mb.num_rows < 2:
                plan.append((plan[-1][0].rows([0]), 0, True))
                continue
            half = mb.num_rows // 2
            parts = [mb.rows(range(half)), mb.rows(range(half, mb.num_rows))]
            plan[i:i + 1] = [(part, self._shared_prefix(part), False) for part in parts]
        agreed = torch.tensor([1 if shared else 0 for _, shared, _ in plan])
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        return [(mb, shared if int(agreed[i]) else 0, filler)
                for i, (mb, shared, filler) in enumerate(plan)]

    def _keep_gathered(self, keep: bool) -> None:
        """FSDP2: keep each layer's gathered weights from its forward to the end of the
        micro-batch's backward (``keep``), or free them now. A shared prefix needs it: its keys
        and values reach the weights in the backward outside the hooks FSDP2 gathers them by.
        The cost: the whole model's gathered weights (in the compute dtype) for that while."""
        self.model.set_reshard_after_forward(not keep)
        self.model.set_reshard_after_backward(not keep)
        if not keep:
            for module in self.model.modules():
                if hasattr(module, "reshard") and hasattr(module, "unshard"):
                    module.reshard()
        self._gathered = keep

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
        # sums both paths' gradients into each weight before DDP's hooks see them. (FSDP2
        # has no wrapper: each layer's gradient is reduce-scattered after each path's
        # backward and accumulated into its shard.)
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
        plan = self._plan(micro)
        if ref_logprobs is not None and (len(plan) != len(micro) or any(
                mb is not m for (mb, _, _), m in zip(plan, micro))):
            raise ConfigError("ref_logprobs: per micro-batch, but FSDP2 re-split this rank's "
                              "micro-batches to match the other ranks'")
        for i, (mb, shared, filler) in enumerate(plan):
            last = i == len(plan) - 1
            if self.sharded:
                # Reduce-scatter the gradients only after the last micro-batch's backward.
                self.model.set_requires_gradient_sync(last)
            sync = contextlib.nullcontext() if (last or self.world_size == 1 or self.sharded) \
                else self.ddp.no_sync()
            with sync:
                new = self._forward(self.ddp, mb, shared)
                ref = ref_logprobs[i] if ref_logprobs is not None else None
                loss, metrics = compute_loss(new, new.detach(), mb, self.algo,
                                             batch_num_tokens=global_tokens,
                                             batch_num_seqs=global_seqs,
                                             dp_size=self.world_size, ref_logprobs_BR=ref)
                # A filler runs only for the collectives; it adds nothing to the gradient.
                (loss * 0.0 if filler else loss).backward()
            if self._gathered:
                self._keep_gathered(False)
            if filler:
                continue
            weight = float(mb.num_tokens())
            for k, v in metrics.items():
                share = k in _SHARE_METRICS
                sums[k] = sums.get(k, 0.0) + float(v) * (1.0 if share else weight)
        t_optim = time.perf_counter()
        clip = self.engine_config.optim.grad_clip
        # Under FSDP2 the gradients are DTensor shards: the norm is the total over every
        # rank's shards (and the same on every rank).
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.nn.utils.clip_grad_norm_(self.params, clip) if clip \
            else torch.nn.utils.get_total_norm(grads)
        grad_norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        self.optimizer.step()
        self.steps += 1
        tokens = float(shard.num_tokens()) or 1.0
        out = {k: (v if k in _SHARE_METRICS else v / tokens) for k, v in sums.items()}
        out.update(grad_norm=grad_norm, tokens=float(shard.num_tokens()),
                   rows=float(shard.input_ids_BT.shape[0]), micro_batches=float(len(micro)),
                   fwd_bwd_s=t_optim - t0, optim_s=time.perf_counter() - t_optim,
                   step_s=time.perf_counter() - t0,
                   padded_tokens=float(sum(m.input_ids_BT.numel() for m in micro)),
                   bf16=float(self.autocast is not None), sharded=float(self.sharded))
        return out

    # -- weights and checkpoints ---------------------------------------------------------------
    #
    # Under FSDP2 (``self.sharded``) every method here that reads the full weights or writes a
    # checkpoint is collective: every rank calls it, in the same order; rank 0 returns the
    # result, the others None (:func:`call_for_rank0` does that from the driver). Under DDP any
    # rank answers alone.

    def _full_state(self, keep: bool) -> Iterator[tuple[str, Any]]:
        """The full model in Hugging Face names, one tensor at a time, on CPU where ``keep``.
        With LoRA, each adapted weight is ``W + delta`` computed aside (peft's
        ``get_delta_weight``): the base weights are never merged and unmerged in place, which
        would drift them by rounding at every publish."""
        torch = self.torch
        if self.sharded:
            from .sharding import gathered, tied_names
            yield from gathered(iter(self.model.state_dict().items()), keep,
                                tied_names(self.model))
            return
        if not self.engine_config.lora.rank:
            for k, v in self.model.state_dict().items():
                yield k, (v.detach().to("cpu") if keep else None)
            return
        merged = {}
        with torch.no_grad():
            for name, module in self.model.named_modules():
                if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
                    merged[f"{name}.base_layer.weight"] = module
        for k, v in self.model.state_dict().items():
            if "lora_" in k:
                continue
            if not keep:
                yield _base_name(k), None
            elif k in merged:
                module = merged[k]
                with torch.no_grad():
                    delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                    yield _base_name(k), (v.detach() + delta).to("cpu")
            else:
                yield _base_name(k), v.detach().to("cpu")

    def published_partial(self) -> bool:
        """Whether :meth:`iter_published` gives only the weights that train (``train_layers``
        without LoRA; the frozen rest is what every server started from) rather than the whole
        model. After a checkpoint was loaded it is the whole model: the frozen layers are then
        the checkpoint's, which need not be what the servers started from."""
        return bool(self.engine_config.train_layers and not self.engine_config.lora.rank
                    and not self.loaded_checkpoint)

    def iter_published(self) -> Iterator[tuple[str, Any]]:
        """``(hf_name, full tensor on CPU)`` for each weight a policy server needs
        (:meth:`published_partial` says whether that is the whole model) on rank 0,
        ``(hf_name, None)`` on the other ranks. Under FSDP2 each weight is gathered as it is
        reached (one parameter at a time; a collective, so every rank must run this generator
        to its end in lockstep); under DDP nothing crosses ranks."""
        yield from self._published(self.rank == 0)

    def _published(self, keep: bool) -> Iterator[tuple[str, Any]]:
        if not self.published_partial():
            yield from self._full_state(keep)
            return
        trained = ((n, p) for n, p in self.model.named_parameters() if p.requires_grad)
        if self.sharded:
            from .sharding import gathered, tied_names
            yield from gathered(trained, keep, tied_names(self.model))
        else:
            for n, p in trained:
                yield n, (p.detach().to("cpu") if keep else None)

    def state_dict(self) -> dict[str, Any] | None:
        """The full model in Hugging Face names, on CPU (LoRA merged in). Under FSDP2 every
        rank calls it, rank 0 gets the dict, the others None."""
        if not self.sharded:
            return dict(self._full_state(True))
        state = dict(self._full_state(self.rank == 0))
        return state if self.rank == 0 else None

    def published_state(self) -> dict[str, Any] | None:
        """What a policy server needs to serve the current weights (:meth:`iter_published`
        collected): :class:`~consolerl.tensors.PartialWeights` when only the weights that train,
        else the whole model. Under FSDP2 every rank calls it, rank 0 gets the dict, the others
        None."""
        keep = self.rank == 0 or not self.sharded      # DDP: any rank holds the weights
        items = dict(self._published(keep))
        if not keep:
            return None
        return PartialWeights(items) if self.published_partial() else items

    def training_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model state, optimizer state) for a full (DDP) checkpoint."""
        if self.sharded:
            raise ConfigError("training_state: strategy fsdp2 checkpoints through "
                              "save_checkpoint on every rank (sharded)")
        model_state = {k: v.detach().to("cpu") for k, v in self.model.state_dict().items()}
        return model_state, self.optimizer.state_dict()

    def load_training_state(self, model_state: dict[str, Any],
                            optimizer_state: dict[str, Any] | None) -> None:
        """A full checkpoint's model and optimizer state (every rank loads the same)."""
        if self.sharded:
            # A DDP checkpoint into FSDP2: the same parameters in the same order, so the
            # optimizer's indexes map to this model's names.
            from .sharding import load_full_state, named_optimizer_state
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            state = dict(model_state)
            if self.tied and "lm_head.weight" not in state and \
                    "model.embed_tokens.weight" in state:
                state["lm_head.weight"] = state["model.embed_tokens.weight"]
            load_full_state(self.model, self.optimizer, state,
                            None if optimizer_state is None
                            else named_optimizer_state(optimizer_state, names))
            self.loaded_checkpoint = True
            return
        missing, unexpected = self.model.load_state_dict(model_state, strict=False)
        missing = [m for m in missing if not (self.tied and m.endswith("lm_head.weight"))]
        if missing or unexpected:
            raise ConfigError(f"checkpoint does not fit the model: missing {missing[:5]}, "
                              f"unexpected {unexpected[:5]}")
        if optimizer_state is not None:
            self.optimizer.load_state_dict(optimizer_state)
        self.loaded_checkpoint = True

    def full_optimizer_state(self) -> dict[str, Any] | None:
        """The whole optimizer state keyed by parameter name on rank 0 (others: None). Every
        rank calls it under FSDP2. It holds everything at once: for checks and tools."""
        from .sharding import full_optimizer_state
        state = full_optimizer_state(self.model, self.optimizer)
        return state if self.rank == 0 else None

    def save_checkpoint(self, config: Any, step: int, version: int,
                        trainer_state: dict[str, Any]) -> str | None:
        """Write the model and optimizer as checkpoint ``step`` (the folder is shared storage
        on a cluster; the tensors never cross the object store). DDP: rank 0 writes the full
        state. FSDP2: every rank calls it and writes its shards; rank 0 commits and returns
        the folder, the others None."""
        from .checkpoint import CheckpointManager
        manager = CheckpointManager(config)
        if self.sharded:
            from .sharding import dcp_state
            path = manager.save_sharded(step, version, dcp_state(self.model, self.optimizer),
                                        trainer_state)
            return None if path is None else str(path)
        model_state, optimizer_state = self.training_state()
        return str(manager.save(step, version, model_state, optimizer_state, trainer_state))

    def load_checkpoint(self, config: Any, path: str) -> int:
        """Load checkpoint ``path`` (every rank calls it): a sharded one is resharded to this
        run's strategy and world size, a full one loads on DDP and FSDP2 alike."""
        from .checkpoint import CheckpointManager
        manager = CheckpointManager(config)
        ckpt = manager.load(path)
        if ckpt.sharded:
            from .sharding import dcp_state, set_dcp_state
            state = dcp_state(self.model, self.optimizer)
            manager.read_sharded(ckpt.path, state)
            set_dcp_state(self.model, self.optimizer, state)
            self.loaded_checkpoint = True
        else:
            self.load_training_state(ckpt.model_state, ckpt.optimizer_state)
        return ckpt.step

    def save_pretrained(self, folder: str) -> str | None:
        """The merged model as a Hugging Face folder (e.g. for evaluation or serving). Under
        FSDP2 every rank calls it; rank 0 writes and returns the folder, the others None."""
        state = self.state_dict()
        if state is None:
            return None
        self._base().save_pretrained(folder, state_dict=state)
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
            if op == "send" and self.sharded:
                for _ in self.iter_published():       # this rank's part of each gather
                    pass
            return None
        sender = self.__dict__.setdefault("_weight_sender", WeightSender(_node_ip()))
        if op != "send":
            return getattr(sender, op)(*args)
        keys, dtype, chunk_bytes = args
        # One tensor at a time from the model (gathered under FSDP2) into the stream's chunks:
        # the whole state dict is never assembled.
        return sender.send(self.iter_published(), keys, dtype, chunk_bytes,
                           self.published_partial())


TrainerWorkerActor = ray.remote(TrainerWorker)


def worker_options(engine: EngineConfig, scheduling: Any = None) -> dict[str, Any]:
    """The Ray actor options of every trainer worker: CPUs, GPUs, memory, the custom
    resources its config names (only nodes that offer them host it), its threads, and
    ``scheduling`` (its bundle of the placement group) when given."""
    options: dict[str, Any] = {"num_cpus": engine.num_cpus_per_worker}
    if engine.num_gpus_per_worker:
        options["num_gpus"] = engine.num_gpus_per_worker
    if engine.memory_gib:
        options["memory"] = int(engine.memory_gib * 2**30)
    if engine.resources:
        options["resources"] = dict(engine.resources)
    threads = engine.threads_per_worker or max(1, int(engine.num_cpus_per_worker))
    options["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(threads)}}
    if scheduling is not None:
        options["scheduling_strategy"] = scheduling
    return options


def start_workers(model_path: str, engine: EngineConfig, algo: AlgoConfig) -> TrainerRanks:
    """``engine.workers`` ranks as Ray actors in one placement group (a node's ranks together:
    :mod:`trainer.placement`), joined in one process group (rendezvous on rank 0's node).
    The caller stops the actors, then calls ``remove_placement()`` on what this returns; a
    start that fails kills what it started and removes the group itself."""
    placement = place_ranks(engine.workers, engine.nodes,
                            worker_resources(worker_options(engine)), engine.placement_timeout_s)
    workers = TrainerRanks(placement=placement)
    try:
        for rank in range(engine.workers):
            options = worker_options(engine, placement.scheduling(rank))
            workers.append(TrainerWorkerActor.options(**options).remote(
                rank, engine.workers, model_path, engine, algo))
        master = ray.get(workers[0].address.remote())
        ray.get([w.init_distributed.remote(master) for w in workers])
    except BaseException:
        for w in workers:
            ray.kill(w)
        workers.remove_placement()
        raise
    return workers


def call_for_rank0(workers: Sequence[Any], engine: EngineConfig, method: str,
                   *args: Any) -> tuple[Any, list[Any]]:
    """Rank 0's answer to ``method(*args)``: under DDP only rank 0 is called (every rank holds
    the whole model); under FSDP2 every rank is, in the same order (gathering the shards is a
    collective). Returns rank 0's ObjectRef and the other ranks' (their value is None; wait on
    them so that an error on any rank surfaces)."""
    if engine.strategy != "fsdp2":
        return getattr(workers[0], method).remote(*args), []
    refs = [getattr(w, method).remote(*args) for w in workers]
    return refs[0], refs[1:]


def _base_name(peft_key: str) -> str:
    """A peft parameter name in the base model's names."""
    return peft_key.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _node_ip() -> str:
    try:
        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray
        return os.environ.get("CONSOLERL_NODE_IP", "127.0.0.1")
