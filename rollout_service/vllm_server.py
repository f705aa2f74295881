"""The vLLM side of :class:`rollout_service.vllm_engine.VllmEngine`.

Run by the interpreter that has vLLM (``python -m rollout_service.vllm_server``; on CPU machines
the ``.venv-vllm`` environment, whose pins clash with the services'), it builds vLLM's
``AsyncLLM`` and serves requests from the engine's owner over a local authenticated socket
(``multiprocessing.connection``). It imports nothing from console-rl but this module,
:mod:`rollout_service.weight_transfer` and :mod:`consolerl.errors` (standard library only), and
of the rest only vLLM and what vLLM depends on (``prometheus_client``), so the vLLM environment
needs only vLLM.

Messages (tuples), owner -> here: ``("generate", rid, prompt_ids, sampling)``,
``("update", rid, version, path, partial)``, ``("open_group", rid, spec)``,
``("receive", rid, version, key)``, ``("metrics", rid)``, ``("shutdown", rid)``; here -> owner:
``("ready", info)``, ``("result", rid, payload)``, ``("error", rid, message)``,
``("fatal", message)``.

``metrics`` is answered with the Prometheus text of vLLM's registry (its stat logging is on:
``vllm:*`` gauges, counters and histograms) straight from the thread that reads the socket, so
an event loop kept busy by the engine does not delay it.

Weights arrive two ways, both loaded in place by every vLLM worker through
:class:`WeightLoader`, a worker extension that ``collective_rpc`` calls by name; the model's own
``load_weights`` maps Hugging Face names onto vLLM's fused parameters:

- ``update``: a safetensors file (written by the owner, usually in ``/dev/shm``);
- ``receive``: streamed by the trainer over a process group (``open_group`` joins every worker
  to it once; :mod:`rollout_service.weight_transfer`), chunk by chunk, no file.

An update waits for the generations in flight, blocks new ones while it loads, and resets the
prefix cache (its KV entries were computed under the old weights), so every generation is
produced by exactly one version, the one it reports.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import traceback
from multiprocessing.connection import Client, Connection
from typing import Any


class WeightLoader:
    """Mixed into each vLLM worker (``worker_extension_cls``)."""

    def consolerl_load_weights(self, path: str, partial: bool = False) -> int:
        """Load the weights file at ``path``: the whole model, or with ``partial`` some of it
        in whole decoder layers (what a trainer with ``train_layers`` publishes); the layers
        not in the file keep their weights."""
        from safetensors.torch import load_file

        weights = load_file(path)
        model = self.model_runner.model           # type: ignore[attr-defined]
        scope = _scope(weights) if partial else None
        _unpack_cpu_linears(model, scope)
        loaded = model.load_weights(weights=iter(weights.items()))
        _repack_cpu_linears(model, scope)
        if loaded is not None and not partial:
            missing = sorted(set(name for name, _ in model.named_parameters()) - set(loaded))
            if missing:
                raise ValueError(f"weights file {path} left {len(missing)} parameters "
                                 f"unloaded: {missing[:5]}")
        return len(weights)

    def consolerl_open_weight_group(self, spec: dict[str, Any]) -> int:
        """Join the weight group ``spec`` (a :class:`~rollout_service.weight_transfer.GroupSpec`
        as a dict) as rank 1 + this worker's rank; a group of the same key is left first.
        Blocks until the sender and every worker have joined."""
        from rollout_service.weight_transfer import GroupSpec, join_group

        s = GroupSpec(**spec)
        groups = self.__dict__.setdefault("_consolerl_groups", {})
        for old in groups.values():
            old.close()                  # one group per worker: a new one replaces the old
        groups.clear()
        rank = 1 + int(getattr(self, "rank", 0))
        groups[s.key] = join_group(s, rank)
        return rank

    def consolerl_receive_weights(self, key: str) -> dict[str, Any]:
        """Receive one update on the weight group ``key`` and load it chunk by chunk: the
        whole model, or (a partial update) whole decoder layers, the rest kept. A failed
        receive leaves the group (the trainer forms a new one)."""
        from rollout_service.weight_transfer import WeightTransferError, receive

        groups = self.__dict__.get("_consolerl_groups", {})
        if key not in groups:
            raise WeightTransferError(f"weight group {key} is not open on this worker "
                                      f"(open: {sorted(groups)})")
        model = self.model_runner.model           # type: ignore[attr-defined]
        loaded: set[str] = set()
        scope: set[str] = set()
        full: list[bool] = []
        # A tied output head that arrives as a tensor of its own (a sender that cannot see the
        # tie) is dropped: vLLM ties it again, and refuses it in a chunk without the embedding.
        config = getattr(model, "config", None)
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()

        def load(pairs: list[tuple[str, Any]], partial: bool) -> None:
            pairs = [(name, t) for name, t in pairs if name not in tied]
            if not pairs:
                return
            if partial:
                chunk_scope = _scope(dict(pairs))
                _unpack_cpu_linears(model, chunk_scope)
                scope.update(chunk_scope)
            elif not full:
                _unpack_cpu_linears(model, None)
                full.append(True)
            got = model.load_weights(weights=iter(pairs))
            if got is not None:
                loaded.update(got)

        try:
            stats = receive(groups[key], load)
        except BaseException:
            groups.pop(key).close()
            raise
        _repack_cpu_linears(model, tuple(sorted(scope)) if stats["partial"] else None)
        if not stats["partial"] and loaded:
            missing = sorted(set(name for name, _ in model.named_parameters()) - loaded)
            if missing:
                raise ValueError(f"weight update on group {key} left {len(missing)} "
                                 f"parameters unloaded: {missing[:5]}")
        return stats


def _repack_cpu_linears(model: Any, scope: tuple[str, ...] | None) -> None:
    """On CPU, linear layers (and the embedding used as the LM head) run from a packed copy of
    their weight made after loading; pack the new weights again (within ``scope``)."""
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and _within(name, scope):
            method.process_weights_after_loading(module)


def _scope(weights: dict[str, Any]) -> tuple[str, ...]:
    """The module prefixes a partial weights file replaces: each decoder layer it touches
    (``model.layers.N.``, whole: vLLM stacks q/k/v and gate/up into one packed weight) and the
    module of each other tensor."""
    layers = {".".join(k.split(".")[:3]) + "." for k in weights if k.startswith("model.layers.")}
    others = {k.rsplit(".", 1)[0] for k in weights if not k.startswith("model.layers.")}
    return tuple(sorted(layers | others))


def _within(name: str, scope: tuple[str, ...] | None) -> bool:
    return scope is None or any(name == p.rstrip(".") or name.startswith(p if p.endswith(".")
                                                                          else p + ".")
                                for p in scope)


def _unpack_cpu_linears(model: Any, scope: tuple[str, ...] | None = None) -> None:
    """vLLM on CPU packs each linear layer's weight for oneDNN after loading and replaces the
    parameter with an empty one, so ``load_weights`` has nowhere to write. Give those layers
    a full-size weight parameter again (with its weight loader), created by the layer's own
    quantisation method just as at construction. With ``scope`` (a partial update), only the
    layers within it: the others keep their packed weights."""
    from vllm.model_executor.layers.linear import (WEIGHT_LOADER_V2_SUPPORTED, LinearBase,
                                                   UnquantizedLinearMethod)

    for name, module in model.named_modules():
        if not _within(name, scope) or not isinstance(module, LinearBase) \
                or not isinstance(module.quant_method, UnquantizedLinearMethod) \
                or module.weight.numel() != 0:
            continue
        method = module.quant_method
        loader = (module.weight_loader_v2
                  if type(method).__name__ in WEIGHT_LOADER_V2_SUPPORTED
                  else module.weight_loader)
        del module._parameters["weight"]
        method.create_weights(
            layer=module,
            input_size_per_partition=getattr(module, "input_size_per_partition",
                                             module.input_size),
            output_partition_sizes=module.output_partition_sizes,
            input_size=module.input_size, output_size=module.output_size,
            params_dtype=module.params_dtype, weight_loader=loader)


def sampling_params(s: dict[str, Any], classes: tuple[Any, Any] | None = None) -> Any:
    """vLLM's ``SamplingParams`` for the owner's sampling dict ``s`` (``max_tokens``,
    ``temperature``, ``top_p``, ``seed``, and ``json_schema``: the schema as JSON text, which
    constrains the completion through vLLM's structured outputs). ``classes``: vLLM's
    ``(SamplingParams, StructuredOutputsParams)``, imported when not given."""
    if classes is None:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams
    else:
        SamplingParams, StructuredOutputsParams = classes
    # No free whitespace in a constrained reply: its length is then bounded by the schema
    # (a judge's vote fits its token budget, reward_service.judges.VOTE_MAX_CHARS).
    structured = (StructuredOutputsParams(json=s["json_schema"], disable_any_whitespace=True)
                  if s.get("json_schema") else None)
    return SamplingParams(n=1, temperature=float(s["temperature"]),
                          top_p=float(s.get("top_p", 1.0)), max_tokens=int(s["max_tokens"]),
                          seed=s.get("seed"), logprobs=0, detokenize=False,
                          structured_outputs=structured)


class _Server:
    def __init__(self, conn: Connection, args: dict[str, Any]):
        self.conn = conn
        self.args = args
        self.version = int(args.get("version", 0))
        self.active = 0
        self.updating = False
        self.cond = asyncio.Condition()
        self.closed = asyncio.Event()
        self.engine: Any = None
        self._send_lock = threading.Lock()      # the event loop and the reader both send

    def send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError):
            self.closed.set()

    def metrics(self, rid: str) -> None:
        """Answer ``("metrics", rid)`` with the text of vLLM's registry (from any thread:
        ``prometheus_client`` values are locked)."""
        try:
            from prometheus_client import generate_latest
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            text = generate_latest(get_prometheus_registry()).decode()
        except Exception as exc:  # noqa: BLE001 - goes back to the caller
            self.send(("error", rid, f"{type(exc).__name__}: {exc}"))
            return
        self.send(("result", rid, text))

    async def start(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        a = self.args
        engine_args = AsyncEngineArgs(
            model=a["model"], dtype=a.get("dtype", "float32"),
            max_model_len=int(a.get("max_model_len", 4096)),
            gpu_memory_utilization=float(a.get("gpu_memory_utilization", 0.9)),
            kv_cache_memory_bytes=(int(float(a["kv_cache_gib"]) * 2**30)
                                   if a.get("kv_cache_gib") else None),
            seed=int(a.get("seed", 0)), enforce_eager=bool(a.get("enforce_eager", False)),
            # tp > 1: worker processes of this one, on the GPUs Ray gave the PolicyServer
            # actor (its CUDA_VISIBLE_DEVICES, inherited); named rather than left to vLLM,
            # whose default turns to its Ray executor where it sees Ray, and that would ask
            # the cluster for GPUs of its own.
            tensor_parallel_size=int(a.get("tensor_parallel_size", 1)),
            distributed_executor_backend="mp" if int(a.get("tensor_parallel_size", 1)) > 1
            else None,
            # Stats on: vLLM's Prometheus metrics (served through ``metrics``) are only
            # recorded with them.
            enable_prefix_caching=True, disable_log_stats=False,
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rollout_service.vllm_server.WeightLoader")
        self.engine = AsyncLLM.from_engine_args(engine_args)

    async def _admit(self) -> int:
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.active += 1
            return self.version

    async def _leave(self) -> None:
        async with self.cond:
            self.active -= 1
            self.cond.notify_all()

    async def generate(self, rid: str, prompt_ids: list[int], s: dict[str, Any]) -> dict:
        from vllm import TokensPrompt

        params = sampling_params(s)
        version = await self._admit()
        try:
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                                  params, request_id=rid):
                final = out
        finally:
            await self._leave()
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output")
        c = final.outputs[0]
        ids = list(c.token_ids)
        logprobs = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
        return {"token_ids": ids, "logprobs": logprobs, "version": version,
                "finish_reason": "stop" if c.finish_reason == "stop" else "length"}

    async def update(self, version: int, path: str, partial: bool = False) -> dict:
        """Load the weights file ``path`` as ``version``."""
        loaded = await self._exclusive(version, "consolerl_load_weights", (path, partial))
        return {"version": self.version, "tensors": loaded[0] if loaded else 0}

    async def receive(self, version: int, key: str) -> dict:
        """Receive ``version`` over the weight group ``key`` (the trainer sends it now)."""
        stats = await self._exclusive(version, "consolerl_receive_weights", (key,))
        return {"version": self.version, **(stats[0] if stats else {})}

    async def open_group(self, spec: dict[str, Any]) -> dict:
        ranks = await self.engine.collective_rpc("consolerl_open_weight_group", args=(spec,))
        return {"ranks": list(ranks)}

    async def _exclusive(self, version: int, method: str, args: tuple) -> Any:
        """Run the workers' ``method``: after the generations in flight, none started during
        it, the prefix cache reset after it; the version moves only when it succeeded."""
        async with self.cond:
            await self.cond.wait_for(lambda: not self.updating)
            self.updating = True
            await self.cond.wait_for(lambda: self.active == 0)
        try:
            try:
                out = await self.engine.collective_rpc(method, args=args)
            finally:
                # Even a failed update may have replaced some weights (a stream cut short).
                await self.engine.reset_prefix_cache()
            self.version = int(version)
        finally:
            async with self.cond:
                self.updating = False
                self.cond.notify_all()
        return out

    async def handle(self, message: tuple) -> None:
        kind, rid = message[0], message[1]
        try:
            if kind == "generate":
                payload = await self.generate(rid, list(message[2]), dict(message[3]))
            elif kind == "update":
                payload = await self.update(int(message[2]), str(message[3]),
                                            bool(message[4]) if len(message) > 4 else False)
            elif kind == "receive":
                payload = await self.receive(int(message[2]), str(message[3]))
            elif kind == "open_group":
                payload = await self.open_group(dict(message[2]))
            elif kind == "shutdown":
                self.send(("result", rid, {}))
                self.closed.set()
                return
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            self.send(("error", rid, f"{type(exc).__name__}: {exc}"))
            return
        self.send(("result", rid, payload))

    def reader(self, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking receive loop (a thread); the owner closing the socket ends the server."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(self.closed.set)
                return
            if message[0] == "metrics":
                self.metrics(message[1])
                continue
            loop.call_soon_threadsafe(lambda m=message: loop.create_task(self.handle(m)))


async def _main(conn: Connection, args: dict[str, Any]) -> None:
    server = _Server(conn, args)
    try:
        await server.start()
    except Exception:  # noqa: BLE001 - reported to the owner, which raises it
        server.send(("fatal", traceback.format_exc(limit=20)))
        raise
    import vllm
    server.send(("ready", {"vllm": vllm.__version__, "pid": os.getpid()}))
    loop = asyncio.get_running_loop()
    threading.Thread(target=server.reader, args=(loop,), daemon=True,
                     name="vllm-server-reader").start()
    await server.closed.wait()
    server.engine.shutdown()


def main() -> None:
    address = os.environ["CONSOLERL_VLLM_ADDRESS"]
    authkey = bytes.fromhex(os.environ.pop("CONSOLERL_VLLM_AUTHKEY"))
    args = json.loads(sys.argv[1])
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    try:
        asyncio.run(_main(conn, args))
    finally:
        conn.close()
    # vLLM leaves non-daemon threads behind on some platforms; the owner waits for this exit.
    os._exit(0)


if __name__ == "__main__":
    main()
