"""Will this config fit where it is sent? ``python -m cluster.job --config C --dry-run`` (or
``python -m cluster.fit --config C``) estimates, without starting anything, what the job needs
and compares it with what the cluster offers; it prints a table and refuses (exit 2) with the
numbers when something cannot fit.

What it reads: the job config; the model's ``config.json`` (``<trainer.model or
policy.model>/config.json``; ``--model-config PATH`` when that folder is not mounted here); the
cluster from the KubeRay manifests (``--manifest``, default ``cluster/deploy/raycluster.yaml``
and ``volumes.yaml``), from this machine (``--local``: its GPUs, ``/dev/shm``, free disk) or
from a running Ray cluster (``--ray-address``: its GPU and CPU totals).

The estimates (bytes; P parameters, P_t the trained ones, W trainer ranks, h hidden size, I
intermediate size, kv = KV heads x head dim, L layers, V vocabulary, T =
``trainer.engine.micro_batch_tokens``):

* Trainer, per GPU. ``dtype: bfloat16`` is bf16 compute over fp32 master weights: fp32
  weights (4P), fp32 gradients (4P_t), AdamW m and v in fp32 (8P_t). DDP holds all of it on
  every rank, plus its gradient bucket copy (4P_t, with W > 1) and autocast's bf16 copy of the
  weights (2P, cached for the forward). FSDP2 (``strategy: fsdp2``, one ``fully_shard`` unit
  per decoder layer and the root holding the embeddings and head) divides weights, gradients
  and optimizer by W and adds the units that are unsharded at a time: bf16 parameters and
  their bf16 gradients of the root and two layers (the current one and the prefetched one),
  4 x (P_root + 2 P_layer); the fp32 copy of the root's gradients for the reduce-scatter
  (4 P_root) comes after the activations are freed, so the larger of the two counts.
  ``float32`` (no autocast) is fp32 throughout.
* Activations of one micro-batch of T padded tokens, from bytes saved for the backward per
  token and decoder layer, a.h + b.kv + c.I, with (a, b, c) measured on CPU by counting the
  tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``; the growth with both
  layers and tokens, so that the weights' bf16 copies drop out) in six Llama shapes of
  head dim 64 and fitted (max error 0.01%; ``tests/unit/test_fit.py`` measures a seventh
  shape): (30.1, 4.0, 8.0) for autocast over fp32 weights, (20.1, 4.0, 8.0) for bf16
  weights, (32.1, 8.0, 16.0) for fp32. What is saved does not depend on the device (flash attention saves q, k, v, the output
  and its log-sum-exp on either). Without gradient checkpointing: L x that x T. With it: the
  residual stream at every layer's input (L x h x 4 bytes, 2 with bf16 weights, x T) plus one
  layer recomputed (1 x that x T). Plus the embeddings and final norm (at most 14h bytes per token,
  measured) and the logits: the loss needs them only at the response positions,
  ``logits_to_keep = response_len + 1`` per row, i.e. K = rows x (agent.max_new_tokens + 1)
  positions with rows = T // ``--min-row-tokens`` (default 1024: an assumption, the shortest
  row a micro-batch packs), each costing 10V bytes at the peak (the fp32 scaled logits saved
  for the backward, 4V, measured; their gradient and the bf16 logits' gradient in flight,
  6V). The attention mask (bool, T^2 / rows) is added.
* Margin: 3 GiB for the CUDA context, NCCL's buffers and cuBLAS workspaces, plus 5% of the
  estimate for the caching allocator's fragmentation.
* vLLM, per GPU: the weights at ``policy.dtype`` divided by ``policy.tensor_parallel_size``, 3
  GiB for vLLM's profiled activations, CUDA graphs and context, and the KV cache of one
  sequence of ``policy.max_model_len`` tokens (2 x L x KV heads per GPU x head dim x dtype
  bytes per token) must fit in ``gpu_memory_utilization`` x the card; the table says how many
  full-length sequences the rest holds.
* ``/dev/shm`` on a GPU node: ``trainer.weights.transport: object_store`` keeps the state dict
  (P at ``policy.dtype``) in Ray's object store there and writes one safetensors file per
  replica on the node; ``collective`` needs one copy and one file (the fallback for a replica
  Ray restarted); 1 GiB more for NCCL and Ray's small objects.
* Disk: a checkpoint is the fp32 model and the AdamW states (4P + 8P_t); ``keep`` of them plus
  the one being written. The final model folder in ``run.dir`` (fp32, 4P) twice: it is written
  beside the old one and swapped in; plus the SFT output when ``sft.enabled``.
* GPUs: ``trainer.engine.workers`` x ``num_gpus_per_worker`` + ``policy.replicas`` x
  ``tensor_parallel_size`` (``num_gpus_per_replica`` when that is 1) against the GPU worker
  groups (pods x GPUs per pod); ``engine.nodes`` and each replica's GPUs must fit on the pods.
* Paths: ``trainer.checkpoint.dir`` is written by the trainer ranks (GPU pods) and read by the
  driver on ``--resume`` (head); ``run.dir`` by the driver; ``run.dir/final`` by rank 0 and
  swapped into place by the driver; the model folder is read by all of them. Each must be on a
  volume mounted in every pod that uses it, and the same shared claim where two pods use it.

The estimate is a model, not a measurement on a GPU (none has run it); it errs on the large
side where the code's behaviour is not known in detail (the unsharded root, the transients
around the logits).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.config import JobConfig
from consolerl.config import load_config
from consolerl.errors import ConfigError

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MANIFESTS = ("cluster/deploy/raycluster.yaml", "cluster/deploy/volumes.yaml")
DEFAULT_GPU_GIB = 79.6          # an 80 GB H100 or A100 (81,559 MiB as nvidia-smi reports it)
CUDA_MARGIN_GIB = 3.0
FRAGMENTATION = 0.05
VLLM_OVERHEAD_GIB = 3.0
SHM_FLOOR_GIB = 1.0
DEFAULT_MIN_ROW_TOKENS = 1024
LOGIT_BYTES_PER_VOCAB = 10

# Bytes saved for the backward per token and decoder layer: (a, b, c) of a.h + b.kv + c.I, and
# the residual stream's bytes per element (see the module docstring for how they were measured).
ACTIVATION_FIT = {"autocast": ((30.1, 4.0, 8.0), 4), "bf16": ((20.1, 4.0, 8.0), 2),
                  "fp32": ((32.1, 8.0, 16.0), 4)}
EMBED_BYTES_PER_H = 14

# Architectures whose parameters are counted from config.json: attention biases (q, k, v, o),
# per-head q/k norms (Qwen3).
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The shape numbers of a decoder-only causal LM, from its ``config.json``."""

    architecture: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    max_positions: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, path: str | Path) -> ModelShape:
        """Read ``path`` (a config.json); a :class:`ConfigError` for an architecture it does
        not know."""
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model config {path}: {exc}") from exc
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ConfigError(f"model config {path}: architecture {arch!r} is not one the dry "
                              f"run can count (it knows {', '.join(ARCHITECTURES)})")
        try:
            heads = int(cfg["num_attention_heads"])
            bias = bool(cfg.get("attention_bias", False))
            return cls(architecture=arch, hidden=int(cfg["hidden_size"]),
                       intermediate=int(cfg["intermediate_size"]),
                       layers=int(cfg["num_hidden_layers"]), heads=heads,
                       kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                       vocab=int(cfg["vocab_size"]),
                       tied=bool(cfg.get("tie_word_embeddings", False)),
                       max_positions=int(cfg.get("max_position_embeddings") or 0),
                       qkv_bias=arch == "Qwen2ForCausalLM" or bias,
                       o_bias=bias and arch in ("LlamaForCausalLM", "Qwen3ForCausalLM"),
                       mlp_bias=bool(cfg.get("mlp_bias", False)),
                       qk_norm=arch == "Qwen3ForCausalLM")
        except KeyError as exc:
            raise ConfigError(f"model config {path}: no {exc.args[0]!r}") from exc

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * kv + q * h
        attn += (q + 2 * kv) * self.qkv_bias + h * self.o_bias + 2 * self.head_dim * self.qk_norm
        mlp = 3 * h * i + (2 * i + h) * self.mlp_bias
        return attn + mlp + 2 * h                     # two RMSNorm weights

    @property
    def root_params(self) -> int:
        """Embeddings, the output head (unless tied) and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        return 2 * self.layers * math.ceil(self.kv_heads / tp) * self.head_dim * dtype_bytes


# -- the cluster ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Volume:
    """A pod's volume: ``kind`` persistentVolumeClaim | emptyDir | hostPath | ...; ``claim``:
    the PVC's name; ``size``: the emptyDir's sizeLimit (bytes; None: none)."""

    name: str
    kind: str
    claim: str = ""
    size: int | None = None

    @property
    def shared(self) -> bool:
        return self.kind == "persistentVolumeClaim"


@dataclass(frozen=True)
class PodGroup:
    name: str
    pods: int
    gpus: float
    cpus: float
    mounts: dict[str, Volume] = field(default_factory=dict)
    memory: int | None = None           # the container's memory limit, bytes
    object_store: int | None = None     # rayStartParams object-store-memory, bytes

    def volume_at(self, path: str) -> tuple[str, Volume] | None:
        """The mount that holds ``path`` (the longest mount path above it)."""
        best = None
        for mount, vol in self.mounts.items():
            m = mount.rstrip("/") or "/"
            if path == m or path.startswith(m.rstrip("/") + "/"):
                if best is None or len(m) > len(best[0]):
                    best = (m, vol)
        return best


@dataclass(frozen=True)
class Claim:
    size: int
    access_modes: tuple[str, ...]


@dataclass(frozen=True)
class Cluster:
    """What the config is checked against. None: not known from this source (not checked)."""

    source: str
    gpu_gib: float
    gpu_note: str
    head: PodGroup | None = None
    gpu_groups: tuple[PodGroup, ...] = ()
    gpus: float | None = None
    cpus: float | None = None
    claims: dict[str, Claim] = field(default_factory=dict)
    local: bool = False

    @property
    def gpu_pods(self) -> int:
        return sum(g.pods for g in self.gpu_groups)

    @property
    def gpus_per_pod(self) -> float | None:
        return max((g.gpus for g in self.gpu_groups), default=None)


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("64Gi", "500G", "8", "500m") as a number (bytes, cores)."""
    s = str(value).strip()
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "k": 1e3,
             "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3}
    for suffix in sorted(units, key=len, reverse=True):
        if s.endswith(suffix):
            return float(s[:-len(suffix)]) * units[suffix]
    return float(s)


def _pod_group(name: str, pods: int, params: dict[str, Any], spec: dict[str, Any]) -> PodGroup:
    container = (spec.get("containers") or [{}])[0]
    limits = (container.get("resources") or {}).get("limits") or {}
    gpus = float(params.get("num-gpus") or quantity(limits.get("nvidia.com/gpu", 0)))
    cpus = float(params.get("num-cpus") or quantity(limits.get("cpu", 0)))
    volumes = {}
    for v in spec.get("volumes") or []:
        kind = next((k for k in v if k != "name"), "?")
        body = v.get(kind) or {}
        size = body.get("sizeLimit") if kind == "emptyDir" else None
        volumes[v["name"]] = Volume(v["name"], kind, body.get("claimName", ""),
                                    int(quantity(size)) if size else None)
    mounts = {}
    for m in container.get("volumeMounts") or []:
        mounts[m["mountPath"]] = volumes.get(m["name"], Volume(m["name"], "missing"))
    memory = limits.get("memory")
    store = params.get("object-store-memory")
    return PodGroup(name, pods, gpus, cpus, mounts, int(quantity(memory)) if memory else None,
                    int(quantity(store)) if store else None)


def cluster_from_manifests(paths: list[str], gpu_gib: float, gpu_note: str) -> Cluster:
    """The RayCluster (or a RayJob's ``rayClusterSpec``) and the PersistentVolumeClaims in
    ``paths``."""
    spec, claims = None, {}
    for path in paths:
        p = Path(path) if Path(path).is_absolute() else ROOT / path
        try:
            docs = [d for d in yaml.safe_load_all(p.read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--manifest {path}: {exc}") from exc
        for doc in docs:
            kind = doc.get("kind")
            if kind == "RayCluster":
                spec = doc["spec"]
            elif kind == "RayJob" and doc["spec"].get("rayClusterSpec"):
                spec = doc["spec"]["rayClusterSpec"]
            elif kind == "PersistentVolumeClaim":
                s = doc["spec"]
                claims[doc["metadata"]["name"]] = Claim(
                    int(quantity(s["resources"]["requests"]["storage"])),
                    tuple(s.get("accessModes") or ()))
    if spec is None:
        raise ConfigError(f"--manifest: no RayCluster in {', '.join(paths)}")
    head = spec["headGroupSpec"]
    head_group = _pod_group("head", 1, head.get("rayStartParams") or {}, head["template"]["spec"])
    autoscale = bool(spec.get("enableInTreeAutoscaling"))
    groups = []
    for g in spec.get("workerGroupSpecs") or []:
        pods = int(g.get("maxReplicas" if autoscale else "replicas", 1))
        groups.append(_pod_group(g["groupName"], pods, g.get("rayStartParams") or {},
                                 g["template"]["spec"]))
    gpu_groups = tuple(g for g in groups if g.gpus > 0)
    return Cluster(source=f"manifests {', '.join(paths)}", gpu_gib=gpu_gib, gpu_note=gpu_note,
                   head=head_group, gpu_groups=gpu_groups,
                   gpus=sum(g.pods * g.gpus for g in gpu_groups),
                   cpus=head_group.cpus + sum(g.pods * g.cpus for g in groups), claims=claims)


def cluster_here(gpu_gib: float, gpu_note: str, num_cpus: int = 0) -> Cluster:
    """This machine as the whole cluster (an embedded one-machine run; ``num_cpus``: the
    embedded Ray's, ``run.ray_num_cpus``, 0 = the machine's)."""
    gpus = _visible_gpus()
    cpus = float(num_cpus or os.cpu_count() or 1)
    shm = shutil.disk_usage("/dev/shm").total if os.path.isdir("/dev/shm") else 0
    mounts = {"/dev/shm": Volume("dshm", "emptyDir", size=shm), "/": Volume("root", "local")}
    node = PodGroup("this machine", 1, float(gpus), cpus, mounts)
    return Cluster(source="this machine", gpu_gib=gpu_gib, gpu_note=gpu_note, head=node,
                   gpu_groups=(node,), gpus=float(gpus), cpus=cpus, local=True)


def cluster_from_ray(address: str, gpu_gib: float, gpu_note: str) -> Cluster:
    """GPU and CPU totals of a running Ray cluster (connects as a client, starts nothing)."""
    import ray
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        res = ray.cluster_resources()
        gpu_nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU")]
    finally:
        ray.shutdown()
    per_pod = max((n["Resources"]["GPU"] for n in gpu_nodes), default=0.0)
    groups = (PodGroup("ray GPU nodes", len(gpu_nodes), per_pod, 0.0),) if gpu_nodes else ()
    return Cluster(source=f"ray cluster {address}", gpu_gib=gpu_gib, gpu_note=gpu_note,
                   gpu_groups=groups, gpus=float(res.get("GPU", 0)), cpus=float(res.get("CPU", 0)))


def _visible_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def card_gib(given: float | None) -> tuple[float, str]:
    """The GPU memory per card: ``--gpu-gib``, else the visible GPU's, else an 80 GB card."""
    if given:
        return given, f"{given:g} GiB per GPU (--gpu-gib)"
    try:
        import torch
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory / GIB, f"{props.name}, {props.total_memory / GIB:.1f} GiB"
    except ImportError:
        pass
    return DEFAULT_GPU_GIB, (f"no GPU visible here: assumed an 80 GB card ({DEFAULT_GPU_GIB} "
                             "GiB); --gpu-gib for another")


# -- the estimates -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One line of the table: ``need`` and ``limit`` in ``unit`` (None: not known)."""

    check: str
    need: float | None
    limit: float | None
    unit: str
    ok: bool | None          # None: not checked (nothing to check it against)
    detail: str = ""
    per: str = ""            # "per GPU": the need is each GPU's

    def figure(self, x: float | None, per: str = "") -> str:
        if x is None:
            return "?"
        text = f"{x:.1f} {self.unit}" if self.unit == "GiB" else f"{x:g} {self.unit}".strip()
        return f"{text} {per}" if per else text

    @property
    def verdict(self) -> str:
        return {True: "ok", False: "REFUSED", None: "not checked"}[self.ok]


def _row(check: str, need: float, limit: float | None, unit: str, detail: str,
         per: str = "") -> Row:
    return Row(check, need, limit, unit, None if limit is None else need <= limit + 1e-9,
               detail, per)


def trained_params(shape: ModelShape, config: JobConfig) -> int:
    engine = config.trainer.engine
    if engine.lora.rank:
        dims = {"q_proj": (shape.hidden, shape.heads * shape.head_dim),
                "k_proj": (shape.hidden, shape.kv_dim), "v_proj": (shape.hidden, shape.kv_dim),
                "o_proj": (shape.heads * shape.head_dim, shape.hidden),
                "gate_proj": (shape.hidden, shape.intermediate),
                "up_proj": (shape.hidden, shape.intermediate),
                "down_proj": (shape.intermediate, shape.hidden)}
        layers = engine.train_layers or shape.layers
        return layers * sum(engine.lora.rank * sum(dims.get(m, (0, 0)))
                            for m in engine.lora.target_modules)
    if engine.train_layers:
        return engine.train_layers * shape.layer_params + shape.hidden
    return shape.params


def precision(config: JobConfig) -> str:
    """``autocast`` (bf16 compute over fp32 weights: DDP in bf16), ``bf16`` (bf16 parameters
    in compute: FSDP2's mixed precision) or ``fp32``."""
    engine = config.trainer.engine
    if engine.dtype in ("bfloat16", "float16"):
        return "bf16" if engine.strategy == "fsdp2" else "autocast"
    if engine.autocast == "bfloat16" or (engine.autocast == "auto" and engine.device == "cuda"):
        return "autocast"
    return "fp32"


def activation_bytes(shape: ModelShape, config: JobConfig, min_row_tokens: int
                     ) -> dict[str, float]:
    """One micro-batch's activations at their peak (see the module docstring)."""
    engine, agent = config.trainer.engine, config.agent
    (a, b, c), residual = ACTIVATION_FIT[precision(config)]
    per_layer = a * shape.hidden + b * shape.kv_dim + c * shape.intermediate
    t = engine.micro_batch_tokens
    if engine.gradient_checkpointing:
        layers = (shape.layers * residual * shape.hidden + per_layer) * t
    else:
        layers = shape.layers * per_layer * t
    rows = max(1, t // min_row_tokens)
    kept = min(t, rows * (agent.max_new_tokens + 1))
    return {"layers": layers, "embeddings": EMBED_BYTES_PER_H * shape.hidden * t,
            "logits": LOGIT_BYTES_PER_VOCAB * shape.vocab * kept, "mask": t * t / rows}


def trainer_memory(shape: ModelShape, config: JobConfig, min_row_tokens: int
                   ) -> dict[str, float]:
    """Bytes per trainer GPU by part (see the module docstring)."""
    engine = config.trainer.engine
    p, pt, w = shape.params, trained_params(shape, config), engine.workers
    mode = precision(config)
    parts: dict[str, float] = {}
    act = sum(activation_bytes(shape, config, min_row_tokens).values())
    if engine.strategy == "fsdp2":
        unit_bytes = 4 if mode == "bf16" else 8       # bf16 param + grad, or fp32
        parts.update(weights=4 * p / w, gradients=4 * pt / w, optimizer=8 * pt / w,
                     gathered=unit_bytes * (shape.root_params + 2 * shape.layer_params))
        parts["activations"] = max(act, 4 * shape.root_params)
    else:
        parts.update(weights=4 * p, gradients=4 * pt, optimizer=8 * pt)
        if w > 1:
            parts["ddp_bucket"] = 4 * pt
        if mode == "autocast":
            parts["bf16_copy"] = 2 * p
        parts["activations"] = act
    parts["margin"] = CUDA_MARGIN_GIB * GIB + FRAGMENTATION * sum(parts.values())
    return parts


def vllm_memory(shape: ModelShape, config: JobConfig) -> dict[str, float]:
    policy = config.policy
    nbytes = _DTYPE_BYTES[policy.dtype]
    tp = policy.tensor_parallel_size
    return {"weights": shape.params * nbytes / tp, "overhead": VLLM_OVERHEAD_GIB * GIB,
            "kv_one_sequence": shape.kv_bytes_per_token(nbytes, tp) * policy.max_model_len}


def _gib(parts: dict[str, float]) -> str:
    return " + ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items())


def _replica_gpus(config: JobConfig) -> float:
    policy = config.policy
    if policy.backend != "vllm" or policy.device != "cuda":
        return 0.0
    return float(policy.tensor_parallel_size) if policy.tensor_parallel_size > 1 \
        else policy.num_gpus_per_replica


def check(config: JobConfig, shape: ModelShape, cluster: Cluster,
          min_row_tokens: int = DEFAULT_MIN_ROW_TOKENS) -> list[Row]:
    """Every row of the table."""
    engine, policy = config.trainer.engine, config.policy
    rows: list[Row] = []
    card = cluster.gpu_gib * GIB
    p_b = shape.params / 1e9
    if engine.device == "cuda":
        parts = trainer_memory(shape, config, min_row_tokens)
        share = min(1.0, engine.num_gpus_per_worker or 1.0)
        label = (f"{engine.strategy}/{engine.workers}, {engine.dtype}"
                 f"{', ckpt' if engine.gradient_checkpointing else ''}, {p_b:.2f}B params, "
                 f"micro-batch {engine.micro_batch_tokens} tokens")
        rows.append(_row(f"trainer ({label})", sum(parts.values()) / GIB,
                         share * card / GIB, "GiB", _gib(parts), "per GPU"))
    if policy.backend == "vllm" and policy.device == "cuda":
        parts = vllm_memory(shape, config)
        room = policy.gpu_memory_utilization * card
        kv_room = room - parts["weights"] - parts["overhead"]
        seqs = max(0, int(kv_room // parts["kv_one_sequence"]))
        rows.append(_row(f"vLLM (tp {policy.tensor_parallel_size}, {policy.dtype}, "
                         f"max_model_len {policy.max_model_len})", sum(parts.values()) / GIB,
                         room / GIB, "GiB", f"{_gib(parts)}; room for {seqs} sequences of "
                         f"max_model_len (limit: gpu_memory_utilization "
                         f"{policy.gpu_memory_utilization:g} x card)", "per GPU"))
    if policy.backend == "vllm":
        rows.extend(_lengths(config, shape))
    rows.extend(_gpus(config, cluster))
    rows.extend(_shm(config, shape, cluster))
    rows.extend(_paths_and_disk(config, shape, cluster))
    return rows


def _lengths(config: JobConfig, shape: ModelShape) -> list[Row]:
    agent, policy = config.agent, config.policy
    need = agent.max_prompt_tokens + agent.max_new_tokens
    rows = [_row("policy.max_model_len vs a turn", need, policy.max_model_len, "tokens",
                 f"agent.max_prompt_tokens {agent.max_prompt_tokens} + max_new_tokens "
                 f"{agent.max_new_tokens}")]
    if shape.max_positions:
        rows.append(_row("policy.max_model_len vs the model", policy.max_model_len,
                         shape.max_positions, "tokens", "max_position_embeddings"))
    tp = policy.tensor_parallel_size
    if shape.heads % tp:
        rows.append(Row("tensor parallel", tp, None, "", False,
                        f"{shape.heads} attention heads do not divide over tp {tp}"))
    return rows


def _gpus(config: JobConfig, cluster: Cluster) -> list[Row]:
    engine, policy, env = config.trainer.engine, config.policy, config.env
    trainer = engine.workers * engine.num_gpus_per_worker if engine.device == "cuda" else 0.0
    per_replica = _replica_gpus(config)
    # A judge served in the cluster (reward.judges.endpoint policy:<model>) is one more
    # replica with the policy's settings.
    judge = 1 if config.reward.judges.active and config.reward.judges.policy_model else 0
    replicas = policy.replicas + judge
    judged = " (one of them the judge)" if judge else ""
    need = trainer + replicas * per_replica
    rows = [_row("GPUs", need, cluster.gpus, "GPUs",
                 f"trainer {engine.workers} x {engine.num_gpus_per_worker:g} + vLLM "
                 f"{replicas} x {per_replica:g}{judged}; offered by {cluster.gpu_pods} GPU "
                 f"pod(s) x {cluster.gpus_per_pod or 0:g}")]
    per_pod = cluster.gpus_per_pod
    if need and per_pod is not None:
        ranks = engine.workers // engine.nodes * engine.num_gpus_per_worker
        rows.append(_row("trainer ranks per node", ranks, per_pod, "GPUs",
                         f"{engine.workers} ranks over trainer.engine.nodes {engine.nodes}"))
        if engine.nodes > 1:
            rows.append(_row("trainer nodes", engine.nodes, cluster.gpu_pods, "nodes",
                             "GPU pods the group starts"))
        if per_replica > 1:
            rows.append(_row("GPUs per vLLM replica", per_replica, per_pod, "GPUs",
                             "a replica's tensor-parallel ranks share one node"))
    cpus = (env.workers * env.num_cpus_per_worker + engine.workers * engine.num_cpus_per_worker
            + replicas * policy.num_cpus_per_replica)
    rows.append(_row("CPUs", cpus, cluster.cpus, "CPUs",
                     f"env {env.workers} x {env.num_cpus_per_worker:g} + trainer "
                     f"{engine.workers} x {engine.num_cpus_per_worker:g} + policy "
                     f"{replicas} x {policy.num_cpus_per_replica:g}{judged}"))
    return rows


def _shm(config: JobConfig, shape: ModelShape, cluster: Cluster) -> list[Row]:
    """Ray's object store and the replicas' weight files on a GPU node's ``/dev/shm``."""
    policy = config.policy
    if policy.backend != "vllm":
        return []
    state = shape.params * _DTYPE_BYTES[policy.dtype]
    per_replica = _replica_gpus(config) or 1.0
    per_pod = cluster.gpus_per_pod or 1.0
    on_node = min(policy.replicas, max(1, int(per_pod // per_replica)))
    transport = config.trainer.weights.transport
    files = on_node if transport == "object_store" else 1
    what = (f"{on_node} replica file(s)" if transport == "object_store"
            else "1 file for a restarted replica")
    group = cluster.gpu_groups[0] if cluster.gpu_groups else None
    shm = group.mounts.get("/dev/shm") if group else None
    limit = shm.size if shm is not None and shm.size else None
    rows = []
    if cluster.local or group is None:
        need = (1 + files) * state + SHM_FLOOR_GIB * GIB
        return [_row(f"/dev/shm (weights.transport {transport})", need / GIB,
                     None if limit is None else limit / GIB, "GiB",
                     f"object store copy + {what}, {state / GIB:.1f} GiB each at "
                     f"{policy.dtype}, + {SHM_FLOOR_GIB:g} for NCCL and Ray")]
    store, store_note = group.object_store, "rayStartParams object-store-memory"
    if store is None:
        # Ray's default: 30% of the node's memory, in /dev/shm (else in /tmp, on disk).
        store = int(0.3 * (group.memory or 0))
        store_note = "Ray's default, 30% of the pod's memory: set object-store-memory"
        rows.append(Row("Ray object store per GPU node", state / GIB, None, "GiB", None,
                        f"one state dict; {store_note}"))
    else:
        rows.append(_row("Ray object store per GPU node", state / GIB, store / GIB, "GiB",
                         f"one state dict at {policy.dtype} ({store_note})"))
    if limit is None:
        limit, shm_note = 64 * 2**20, "; no /dev/shm volume: a container's default is 64 MiB"
    else:
        shm_note = ""
    need = store + files * state + SHM_FLOOR_GIB * GIB
    rows.append(_row(f"/dev/shm per GPU node (weights.transport {transport})", need / GIB,
                     limit / GIB, "GiB",
                     f"object store {store / GIB:.1f} + {what} {files * state / GIB:.1f} + "
                     f"{SHM_FLOOR_GIB:g} for NCCL{shm_note}"))
    return rows


def _abs(path: str, run_dir: str) -> str | None:
    """``path`` as the job resolves it (a relative checkpoint dir is inside run.dir); None
    when it stays relative (it lands in the job's working-directory copy)."""
    p = Path(path)
    if not p.is_absolute():
        if not Path(run_dir).is_absolute():
            return None
        p = Path(run_dir) / p
    return os.path.normpath(str(p))


def _paths_and_disk(config: JobConfig, shape: ModelShape, cluster: Cluster) -> list[Row]:
    trainer = config.trainer
    run_dir = config.run.dir
    ckpt = _abs(trainer.checkpoint.dir, run_dir)
    run = _abs(run_dir, "")
    model = trainer.model or config.policy.model
    pt = trained_params(shape, config)
    ckpt_bytes = (4 * shape.params + 8 * pt) * (trainer.checkpoint.keep + 1)
    run_bytes = 2 * 4 * shape.params + (4 * shape.params if config.sft.enabled else 0)
    rows: list[Row] = []
    if cluster.local:
        for label, path, need in (("checkpoint.dir", ckpt or trainer.checkpoint.dir, ckpt_bytes),
                                  ("run.dir", run or run_dir, run_bytes)):
            free = shutil.disk_usage(_existing(path)).free
            rows.append(_row(f"disk: {label} {path}", need / GIB, free / GIB, "GiB",
                             "free on this machine"))
        return rows
    if cluster.head is None:
        return [Row("paths and volumes", None, None, "", None,
                    f"{cluster.source} says nothing of volumes")]
    gpu = cluster.gpu_groups
    uses = [("trainer.checkpoint.dir", ckpt, trainer.checkpoint.dir,
             [("GPU pods (trainer ranks write)", gpu), ("head (driver reads on --resume)",
                                                        (cluster.head,))]),
            ("run.dir", run, run_dir, [("head (driver writes)", (cluster.head,))]),
            ("final model (run.dir/final)", run and f"{run}/final", run_dir,
             [("GPU pods (rank 0 writes)", gpu), ("head (driver swaps it in)", (cluster.head,))])]
    if model.startswith("/"):
        uses.append(("model folder (read)", model, model,
                     [("GPU pods", gpu), ("head (tokenizer)", (cluster.head,))]))
    disk: dict[str, list[tuple[str, int]]] = {}
    for label, path, given, who in uses:
        if path is None:
            rows.append(Row(f"mount: {label}", None, None, "", False,
                            f"{given!r} is relative: on a cluster it lands in the job's "
                            "working-directory copy, on no volume; give an absolute path on a "
                            "mounted volume"))
            continue
        seen, problems = set(), []
        for role, groups in who:
            for g in groups:
                found = g.volume_at(path)
                if found is None:
                    problems.append(f"not mounted in {g.name} ({role})")
                    continue
                seen.add((found[1].kind, found[1].claim or f"{g.name}:{found[1].name}"))
                if len(groups) > 1 or len(who) > 1:
                    if not found[1].shared:
                        problems.append(f"{g.name} has it on {found[1].kind}, not shared")
        if len(seen) > 1:
            problems.append("different volumes in different pods: " +
                            ", ".join(sorted(c for _, c in seen)))
        claim = next((c for kind, c in seen if kind == "persistentVolumeClaim"), "")
        where = f"on claim {claim}" if claim else ""
        rows.append(Row(f"mount: {label} {path}", None, None, "", not problems,
                        "; ".join(problems) or f"{where} in " + ", ".join(r for r, _ in who)))
        if claim and label != "model folder (read)":
            need = ckpt_bytes if label.startswith("trainer.checkpoint") else \
                (run_bytes if label.startswith("final") else 0)
            disk.setdefault(claim, []).append((label, need))
    ckpt_one = (4 * shape.params + 8 * pt) / GIB
    for claim, items in disk.items():
        need = sum(n for _, n in items)
        size = cluster.claims.get(claim)
        detail = " + ".join(f"{label} {n / GIB:.0f}" for label, n in items if n)
        if any(label.startswith("trainer.checkpoint") for label, _ in items):
            detail += (f" (a checkpoint: fp32 model + AdamW, {ckpt_one:.0f} GiB, x keep "
                       f"{trainer.checkpoint.keep} + the one being written)")
        if any(label.startswith("final") for label, _ in items):
            detail += " (the final model in fp32, written beside the old one)"
        rows.append(_row(f"disk: claim {claim}", need / GIB,
                         None if size is None else size.size / GIB, "GiB",
                         detail + ("" if size else "; the claim's size is not in the manifests")))
        if size and "ReadWriteMany" not in size.access_modes:
            rows.append(Row(f"access: claim {claim}", None, None, "", False,
                            f"mounted by several pods but accessModes {list(size.access_modes)}"
                            " has no ReadWriteMany"))
    return rows


def _existing(path: str) -> str:
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return str(p)


# -- output --------------------------------------------------------------------------------------

def table(rows: list[Row]) -> str:
    head = ("check", "need", "limit", "verdict")
    lines = [(r.check, r.figure(r.need, r.per) if r.need is not None else "",
              r.figure(r.limit) if r.limit is not None else "", r.verdict) for r in rows]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(4)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out.append("  ".join("-" * w for w in widths))
    for r, line in zip(rows, lines):
        out.append("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
        if r.detail:
            out.append(f"    {r.detail}")
    return "\n".join(out)


def refusals(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        if r.ok is False:
            numbers = (f": {r.figure(r.need, r.per)} > {r.figure(r.limit)}"
                       if r.need is not None and r.limit is not None else "")
            out.append(f"{r.check}{numbers} ({r.detail})")
    return out


def model_config_path(config: JobConfig, given: str) -> tuple[str, str]:
    """The config.json to read and a note on where it came from."""
    if given:
        return given, f"--model-config {given}"
    model = config.trainer.model or config.policy.model
    if not model or model in ("default", "tiny"):
        from rollout_service.models import resolve_model
        model = resolve_model(model)
    path = Path(model) / "config.json"
    if not path.exists():
        raise ConfigError(f"{path} is not here (the model folder is not mounted on this "
                          "machine?); pass --model-config PATH to the same model's config.json")
    return str(path), str(path)


def dry_run(argv: list[str] | None = None, prog: str = "python -m cluster.fit") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--model-config", default="",
                        help="the model's config.json when its folder is not here")
    parser.add_argument("--gpu-gib", type=float, default=0.0, help="GPU memory per card")
    parser.add_argument("--manifest", action="append", default=None,
                        help=f"KubeRay manifests (default: {' '.join(DEFAULT_MANIFESTS)})")
    parser.add_argument("--local", action="store_true", help="check against this machine")
    parser.add_argument("--ray-address", default="", help="check against a running cluster")
    parser.add_argument("--min-row-tokens", type=int, default=DEFAULT_MIN_ROW_TOKENS,
                        help="the shortest row a micro-batch packs (sets the logits' rows)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default="")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides) + ([f"run.dir={args.run_dir}"] if args.run_dir else [])
    try:
        config = load_config(JobConfig, args.config, overrides)
        path, source = model_config_path(config, args.model_config)
        shape = ModelShape.from_config(path)
        gib, note = card_gib(args.gpu_gib)
        if args.local:
            cluster = cluster_here(gib, note, config.run.ray_num_cpus)
        elif args.ray_address:
            cluster = cluster_from_ray(args.ray_address, gib, note)
        else:
            cluster = cluster_from_manifests(args.manifest or list(DEFAULT_MANIFESTS), gib, note)
        rows = check(config, shape, cluster, args.min_row_tokens)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refused = refusals(rows)
    if args.json:
        print(json.dumps({"config": args.config, "model_config": source,
                          "architecture": shape.architecture, "params": shape.params,
                          "cluster": cluster.source, "gpu": note, "ok": not refused,
                          "rows": [r.__dict__ for r in rows], "refused": refused}, indent=2))
    else:
        print(f"{args.config}: model {source} ({shape.architecture}, "
              f"{shape.params / 1e9:.2f}B params); against {cluster.source}; {note}")
        print(table(rows))
        for line in refused:
            print(f"REFUSED: {line}")
        print("fits" if not refused else f"does not fit: {len(refused)} refusal(s)")
    return 2 if refused else 0


if __name__ == "__main__":
    sys.exit(dry_run())
