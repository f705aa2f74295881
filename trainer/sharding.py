"""FSDP2 for the trainer workers, and the conversions between sharded and full state.

:func:`shard_model` applies torch's ``fully_shard`` to each decoder layer, then to the root
(embeddings, final norm, the tied head): each layer's parameters are gathered just before its
forward and backward and freed after, so a rank holds one layer's full weights at a time and
1 / world of the rest. Parameters, gradients and optimizer states stay fp32 and sharded;
with bf16 compute the gathers carry bf16 copies and the gradient reduce-scatter runs in fp32
(``MixedPrecisionPolicy``).

The rest are the state-dict views the engine needs whatever its strategy: the
``torch.distributed.checkpoint`` (DCP) state of a model and its optimizer (sharded DTensors
under FSDP2, plain tensors otherwise: DCP reshards between them on load), a full optimizer
state keyed by parameter name, and the conversion of a plain (index-keyed) optimizer state dict
to names, which lets an FSDP2 run resume from a checkpoint a DDP run wrote.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict, set_state_dict)


def shard_model(model: Any, device_type: str, world_size: int, param_dtype: Any) -> Any:
    """``model`` sharded in place over ``world_size`` ranks of the default process group: each
    decoder layer, then the root. ``param_dtype``: the dtype the gathered weights compute in
    (None: the parameters' own, fp32)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full(t: Any) -> Any:
    """The whole of ``t``: a DTensor is gathered from every rank (a collective: every rank
    calls it with the same tensor, in the same order); a plain tensor is itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def tied_names(model: Any) -> dict[str, str]:
    """``name -> earlier name`` for each parameter that another name already holds (tied
    embeddings), the same on every rank."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def gathered(named: Iterator[tuple[str, Any]], keep: bool, aliases: dict[str, str]
             ) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs with each tensor gathered in full, one at a time, detached on
    CPU where ``keep`` (rank 0), else ``(name, None)`` after taking part in the gather. A name
    in ``aliases`` (:func:`tied_names`) is not gathered again: it gets its original's tensor."""
    wanted = set(aliases.values())
    done: dict[str, Any] = {}
    for name, t in named:
        if name in aliases and aliases[name] in done:
            yield name, done[aliases[name]]
            continue
        whole = full(t.detach())
        out = whole.to("cpu") if keep else None
        del whole
        if name in wanted:
            done[name] = out
        yield name, out


def dcp_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The model's and the optimizer's state as DCP saves and loads it: parameter names as
    keys, this rank's shards (FSDP2) or the whole tensors (otherwise)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def set_dcp_state(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Put a state that DCP loaded into :func:`dcp_state`'s dict back into the model and the
    optimizer."""
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


def named_optimizer_state(optimizer_state: dict[str, Any], names: list[str]
                          ) -> dict[str, Any]:
    """A plain optimizer state dict (parameters by index, in the order the optimizer got
    them) keyed by parameter name instead: ``names[i]`` is parameter ``i``."""
    return {"state": {names[int(i)]: s for i, s in optimizer_state["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                             for g in optimizer_state["param_groups"]]}


def load_full_state(model: Any, optimizer: Any, model_state: dict[str, Any],
                    optimizer_state: dict[str, Any] | None) -> None:
    """Full (unsharded) model and optimizer state into a sharded ``model``: every rank holds
    the whole and keeps its shards. ``optimizer_state``: keyed by parameter name."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    if optimizer_state is not None:
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)


def full_optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The whole optimizer state keyed by parameter name, on CPU, on rank 0 (other ranks: an
    empty dict). It gathers everything at once: for checks, not for the training path."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
