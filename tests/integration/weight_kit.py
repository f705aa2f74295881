"""A collective weight update driven from the test process, which plays the trainer's rank 0."""
from __future__ import annotations

import ray


def stream_update(sender, server, key: str, version: int, state: dict, partial: bool = False,
                  *, timeout_s: float, receive_timeout_s: float, chunk_bytes: int):
    """One collective update of ``server`` by ``sender`` (a WeightSender) over the group
    ``key``, formed first if it is not open; returns what the server's receive returned.
    ``timeout_s``: the group's (forming it waits twice that); ``receive_timeout_s``: the wait
    for the server's receive."""
    info = ray.get(server.weight_receivers.remote())
    if key not in sender.groups:
        spec = sender.open(key, 1 + info["ranks"], "gloo", timeout_s)
        ray.get(server.open_weight_group.remote(spec), timeout=2 * timeout_s)
    ref = server.receive_weights.remote(version, key)
    out = sender.send(iter(state.items()), [key], info["dtype"], chunk_bytes, partial)
    assert out[key]["ok"], out
    return ray.get(ref, timeout=receive_timeout_s)
