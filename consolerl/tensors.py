"""Tensor helpers shared by the checkpoint writer and the policy servers' weight files."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError


class PartialWeights(dict):
    """Some of a model's weights by Hugging Face name: the ones a trainer can change (with
    ``trainer.engine.train_layers`` the frozen layers never do). A policy engine loads these in
    place and keeps its other weights; a plain dict is the whole model and must cover it."""


def unshared_tensors(model_state: Mapping[str, Any], where: str = "state dict"
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """A state dict as safetensors can store it: CPU, contiguous tensors, and ``alias -> stored
    key`` for keys that are the same view of the same storage as an earlier key (tied
    weights, stored once). Tensors that only overlap another's storage become separate copies
    (safetensors refuses shared storage). ``where`` names the input in errors."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    storages: set[tuple[str, int]] = set()
    for key, t in model_state.items():
        if not isinstance(key, str) or not isinstance(t, torch.Tensor):
            raise ConfigError(f"{where} must map str to tensors; {key!r} holds "
                              f"{type(t).__name__}")
        if t.numel() == 0:
            tensors[key] = t.detach().to("cpu").contiguous().clone()
            continue
        view = (t.device.type, t.device.index, t.untyped_storage().data_ptr(),
                t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in seen:
            aliases[key] = seen[view]
            continue
        seen[view] = key
        cpu = t.detach().to("cpu").contiguous()
        storage = (cpu.device.type, cpu.untyped_storage().data_ptr())
        if storage in storages or cpu.numel() != cpu.untyped_storage().nbytes() // max(
                1, cpu.element_size()):
            cpu = cpu.clone()       # a view into a storage shared with (or bigger than) it
            storage = (cpu.device.type, cpu.untyped_storage().data_ptr())
        storages.add(storage)
        tensors[key] = cpu
    return tensors, aliases
