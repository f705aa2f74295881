"""Weights from a trainer to a running policy engine over a process group of their own.

One group per policy replica: the trainer's rank 0 is rank 0 (the sender) and the replica's
engine workers are ranks 1..N (with tensor parallelism every TP worker receives the full
tensors; vLLM's ``load_weights`` keeps its shard). The group is not torch's default group (the
trainer's data-parallel ranks and vLLM's workers already have theirs): the sender hosts a
``TCPStore`` and every member builds a ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU)
on it directly.

Wire protocol, per update, all broadcasts from rank 0:

1. a header of :data:`HEADER_BYTES` (an 8-byte length, then JSON): the chunk's byte count and
   its tensors as ``[name, dtype, shape, offset]``, whether the update is partial
   (:class:`consolerl.tensors.PartialWeights`: some whole layers), or ``end`` (with ``error``
   when the sender gave up, so the receivers raise at once instead of timing out);
2. the chunk: the tensors packed into one flat byte buffer (offsets aligned to
   :data:`ALIGN`), cast on the way to the dtype the receiver's engine holds (a bf16 policy gets
   bf16: half the bytes of an fp32 trainer's weights).

Chunks hold up to ``chunk_bytes``; a tensor larger than that travels alone in a chunk of its
size. Both sides keep two chunk buffers: the sender packs chunk k+1 while chunk k is in flight,
the receiver loads chunk k (hands ``(name, tensor)`` views to a callback: vLLM's
``load_weights``, a module's ``copy_``) while chunk k+1 arrives. The whole state dict is never
assembled on either side. Every operation has the group's timeout: a dead peer is an error
(``Connection closed by peer`` at once when its process is gone; a timeout when it hangs),
never a hang.

Imports only torch, the standard library and :mod:`consolerl.errors` (itself standard library
only): :mod:`rollout_service.vllm_server` runs it in vLLM's interpreter.
"""
from __future__ import annotations

import datetime
import json
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from consolerl.errors import ConsoleRLError

HEADER_BYTES = 256 * 1024
ALIGN = 64
BACKENDS = ("gloo", "nccl")
_PREFIX = "consolerl-weights"


class WeightTransferError(ConsoleRLError, RuntimeError):
    """A weight transfer failed: a peer died or did not answer within the group's timeout,
    the sender gave up, or the stream did not fit the receiver."""


@dataclass(frozen=True)
class GroupSpec:
    """How to join one transfer group: ``key`` names it (unique per formation), the sender's
    store at ``host:port``, ``world`` members (the sender and the receivers), ``backend``
    ``gloo`` | ``nccl``, ``timeout_s`` for forming it and for every operation on it."""

    key: str
    host: str
    port: int
    world: int
    backend: str = "gloo"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"GroupSpec.backend: must be gloo or nccl, got {self.backend!r}")
        if self.world < 2:
            raise ValueError(f"GroupSpec.world: needs the sender and a receiver, got "
                             f"{self.world}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WeightGroup:
    """One member's handle on a formed group."""

    def __init__(self, spec: GroupSpec, rank: int, pg: Any, store: Any, device: Any):
        self.spec, self.rank, self.pg, self.store, self.device = spec, rank, pg, store, device

    def broadcast(self, tensor: Any) -> Any:
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        return self.pg.broadcast([tensor], opts)

    def wait(self, work: Any) -> None:
        work.wait(datetime.timedelta(seconds=self.spec.timeout_s))

    def close(self) -> None:
        """Leave the group (its other members' next operation on it fails)."""
        pg, self.pg = self.pg, None
        if pg is not None:
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - best effort: the group is dropped either way
                pass


def host_store(host: str, world: int, timeout_s: float) -> Any:
    """The sender's ``TCPStore`` on a free port of ``host`` (``store.port`` says which)."""
    import torch.distributed as dist
    return dist.TCPStore(host, 0, world, True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def join_group(spec: GroupSpec, rank: int, store: Any = None) -> WeightGroup:
    """Join the group ``spec`` as ``rank`` (0: the sender, with the ``store`` it hosts);
    blocks until every member has joined, at most ``spec.timeout_s``. The device is the CPU
    for gloo, the current CUDA device for NCCL."""
    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=spec.timeout_s)
    if store is None:
        store = dist.TCPStore(spec.host, spec.port, spec.world, False, timeout=timeout)
    prefixed = dist.PrefixStore(f"{_PREFIX}/{spec.key}/", store)
    try:
        if spec.backend == "gloo":
            pg = dist.ProcessGroupGloo(prefixed, rank, spec.world, timeout)
            device = torch.device("cpu")
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, spec.world, options)
            device = torch.device("cuda", torch.cuda.current_device())
    except Exception as exc:
        raise WeightTransferError(f"weight group {spec.key}: rank {rank} of {spec.world} could "
                                  f"not join at {spec.host}:{spec.port} within "
                                  f"{spec.timeout_s:g} s: {exc}") from exc
    return WeightGroup(spec, rank, pg, store, device)


# -- the sender -----------------------------------------------------------------------------------


class WeightSender:
    """Rank 0's side: groups by key, formed in the background (:meth:`open` returns the spec
    at once, the receivers join with it, :meth:`send` waits for the formation)."""

    def __init__(self, host: str):
        self.host = host
        self.groups: dict[str, WeightGroup] = {}
        self._forming: dict[str, tuple[threading.Thread, list[Any]]] = {}

    def open(self, key: str, world: int, backend: str = "gloo",
             timeout_s: float = 120.0) -> GroupSpec:
        self.close(key)
        store = host_store(self.host, world, timeout_s)
        spec = GroupSpec(key, self.host, int(store.port), world, backend, timeout_s)
        outcome: list[Any] = []

        def form() -> None:
            try:
                outcome.append(join_group(spec, 0, store))
            except Exception as exc:  # noqa: BLE001 - raised by send()
                outcome.append(exc)

        thread = threading.Thread(target=form, daemon=True, name=f"weight-group-{key}")
        thread.start()
        self._forming[key] = (thread, outcome)
        return spec

    def group(self, key: str) -> WeightGroup:
        """The formed group ``key`` (waits for its formation)."""
        if key in self._forming:
            thread, outcome = self._forming.pop(key)
            thread.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            self.groups[key] = outcome[0]
        if key not in self.groups:
            raise WeightTransferError(f"weight group {key} is not open on the sender")
        return self.groups[key]

    def close(self, key: str) -> None:
        forming = self._forming.pop(key, None)
        if forming is not None:
            forming[0].join()            # joins or times out; then dropped like a formed one
            if not isinstance(forming[1][0], BaseException):
                forming[1][0].close()
        group = self.groups.pop(key, None)
        if group is not None:
            group.close()

    def send(self, pairs: Iterable[tuple[str, Any]], keys: Iterable[str], dtype: str = "",
             chunk_bytes: int = 256 * 2**20, partial: bool = False) -> dict[str, dict]:
        """Stream ``pairs`` (name, tensor) to the groups ``keys``; returns per key
        ``{"ok", "error", "bytes", "tensors", "seconds"}``. A tensor that is the same view
        of the same storage as an earlier one still alive is a tied weight, sent once: an
        iterator must not hand out one tensor object (refilled) for several weights. A group that fails (its receiver
        died, timed out) is dropped and closed, the others go on; ``pairs`` is consumed to
        its end whatever happens (an iterator that gathers weights collectively must run in
        step on every rank)."""
        t0 = time.perf_counter()
        results: dict[str, dict] = {}
        groups: dict[str, WeightGroup] = {}
        for key in keys:
            try:
                groups[key] = self.group(key)
            except Exception as exc:  # noqa: BLE001 - reported per key
                results[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                self.close(key)
        stream = _Stream(groups, dtype, chunk_bytes, partial)
        try:
            for name, tensor in pairs:
                if tensor is not None and stream.live:
                    stream.add(name, tensor)
            stream.finish()
        except BaseException as exc:
            stream.abort(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            for _ in _rest(pairs):
                pass
        seconds = time.perf_counter() - t0
        for key in groups:
            error = stream.failed.get(key)
            if error is not None:
                self.close(key)
            results[key] = {"ok": error is None, "error": error or "", "bytes": stream.bytes,
                            "tensors": stream.tensors, "seconds": seconds}
        return results


def _rest(pairs: Iterable[Any]) -> Iterable[Any]:
    """What is left of ``pairs`` when it is an iterator (nothing for a collection)."""
    return pairs if iter(pairs) is pairs else ()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _dtype(name: str) -> Any:
    import torch
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightTransferError(f"unknown dtype {name!r}")
    return dtype


class _Stream:
    """The sender's packing and double buffering over one update."""

    def __init__(self, groups: dict[str, WeightGroup], dtype: str, chunk_bytes: int,
                 partial: bool):
        import torch
        self.torch = torch
        self.groups = groups
        self.live = dict(groups)
        self.failed: dict[str, str] = {}
        self.dtype = _dtype(dtype) if dtype else None
        self.chunk_bytes = int(chunk_bytes)
        self.partial = bool(partial)
        self.device = next(iter(groups.values())).device if groups else torch.device("cpu")
        self.slot = 0
        self.buffers: list[Any] = [None, None]
        self.headers = [torch.zeros(HEADER_BYTES, dtype=torch.uint8, device=self.device)
                        for _ in range(2)]
        self.works: list[list[tuple[str, Any]]] = [[], []]
        self.entries: list[list] = []
        self.used = 0
        self.header_size = 0
        self.seen: dict[tuple, Any] = {}
        self.bytes = 0
        self.tensors = 0

    def add(self, name: str, tensor: Any) -> None:
        t = tensor.detach()
        if t.numel():
            # A tied weight (the same view of the same storage as an earlier tensor still
            # alive: a freed one's address may be reused by the next) is sent once; the
            # receiver's model ties it again.
            view = (t.device.type, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
            earlier = self.seen.get(view)
            if earlier is not None and earlier() is not None:
                return
            self.seen[view] = weakref.ref(tensor)
        dtype = self.dtype if self.dtype is not None and t.is_floating_point() else t.dtype
        nbytes = t.numel() * dtype.itemsize
        entry_size = len(name) + 64 + 8 * t.dim()
        if self.entries and (_align(self.used) + nbytes > self.chunk_bytes
                             or self.header_size + entry_size > HEADER_BYTES - 1024):
            self._flush()
        if not self.entries:
            self._take_slot(max(self.chunk_bytes, nbytes))
        offset = _align(self.used)
        buf = self.buffers[self.slot]
        target = buf[offset:offset + nbytes].view(dtype).view(t.shape)
        target.copy_(t)
        self.entries.append([name, str(dtype).removeprefix("torch."), list(t.shape), offset])
        self.used = offset + nbytes
        self.header_size += entry_size
        self.tensors += 1

    def _take_slot(self, capacity: int) -> None:
        """Wait until this slot's previous chunk has left, then make its buffer big enough."""
        self._wait(self.slot)
        buf = self.buffers[self.slot]
        if buf is None or buf.numel() < capacity:
            self.buffers[self.slot] = None          # the old one is freed first
            self.buffers[self.slot] = self.torch.empty(capacity, dtype=self.torch.uint8,
                                                       device=self.device)

    def _wait(self, slot: int) -> None:
        for key, work in self.works[slot]:
            if key not in self.live:
                continue
            try:
                self.live[key].wait(work)
            except Exception as exc:  # noqa: BLE001 - this group is dropped, others go on
                self._fail(key, exc)
        self.works[slot] = []

    def _fail(self, key: str, exc: BaseException) -> None:
        group = self.live.pop(key, None)
        if group is not None:
            self.failed[key] = (f"weight group {key}: {type(exc).__name__}: {exc} (timeout "
                                f"{group.spec.timeout_s:g} s)")

    def _send_header(self, header: dict[str, Any], slot: int) -> None:
        data = json.dumps(header, separators=(",", ":")).encode()
        if len(data) + 8 > HEADER_BYTES:
            raise WeightTransferError(f"chunk header of {len(data)} bytes exceeds "
                                      f"{HEADER_BYTES}")
        raw = self.torch.frombuffer(bytearray(struct.pack("<q", len(data)) + data),
                                    dtype=self.torch.uint8)
        hdr = self.headers[slot]
        hdr[:raw.numel()].copy_(raw)
        for key, group in list(self.live.items()):
            try:
                self.works[slot].append((key, group.broadcast(hdr)))
            except Exception as exc:  # noqa: BLE001
                self._fail(key, exc)

    def _flush(self) -> None:
        if not self.entries:
            return
        size = self.used
        self._send_header({"bytes": size, "partial": self.partial, "end": False,
                           "tensors": self.entries}, self.slot)
        data = self.buffers[self.slot][:size]
        for key, group in list(self.live.items()):
            try:
                self.works[self.slot].append((key, group.broadcast(data)))
            except Exception as exc:  # noqa: BLE001
                self._fail(key, exc)
        self.bytes += size
        self.entries, self.used, self.header_size = [], 0, 0
        self.slot = 1 - self.slot

    def finish(self) -> None:
        self._flush()
        self._wait(self.slot)
        self._send_header({"end": True, "partial": self.partial}, self.slot)
        self._wait(self.slot)
        self._wait(1 - self.slot)

    def abort(self, error: str) -> None:
        """Tell the receivers the update is off (they raise at once); best effort."""
        try:
            self._wait(self.slot)
            self._send_header({"end": True, "error": error}, self.slot)
            self._wait(self.slot)
            self._wait(1 - self.slot)
        except Exception:  # noqa: BLE001 - the original error is what the caller sees
            pass


# -- the receiver ---------------------------------------------------------------------------------


def receive(group: WeightGroup,
            load: Callable[[list[tuple[str, Any]], bool], Any]) -> dict[str, Any]:
    """Receive one update on ``group`` and hand each chunk's ``(name, tensor)`` views to
    ``load(pairs, partial)`` (the views live until ``load`` returns: copy, do not keep).
    Returns ``{"tensors", "bytes", "partial", "seconds"}``. Raises
    :class:`WeightTransferError` when the sender gave up, died or went silent past the
    group's timeout; the group is then unusable (the caller closes it)."""
    import torch

    t0 = time.perf_counter()
    header_buf = torch.empty(HEADER_BYTES, dtype=torch.uint8, device=group.device)
    buffers: list[Any] = [None, None]
    slot = 0
    ready: tuple[list[tuple[str, Any]], bool] | None = None
    stats = {"tensors": 0, "bytes": 0, "partial": False}
    failed: list[BaseException] = []

    def hand_over(pairs: list[tuple[str, Any]], partial: bool) -> None:
        # After a failed load the rest is still received (and dropped): the sender finishes
        # its stream, and the group stays in step for the next update.
        if not failed:
            try:
                load(pairs, partial)
            except Exception as exc:  # noqa: BLE001 - raised after the stream's end
                failed.append(exc)

    try:
        while True:
            group.wait(group.broadcast(header_buf))
            header = _decode(header_buf)
            if header.get("end"):
                if header.get("error"):
                    raise WeightTransferError(f"the sender gave up: {header['error']}")
                stats["partial"] = bool(header.get("partial"))
                break
            size = int(header["bytes"])
            if buffers[slot] is None or buffers[slot].numel() < size:
                buffers[slot] = None
                buffers[slot] = torch.empty(max(size, 1), dtype=torch.uint8,
                                            device=group.device)
            work = group.broadcast(buffers[slot][:size])
            if ready is not None:              # load chunk k while chunk k+1 arrives
                hand_over(*ready)
                ready = None
            group.wait(work)
            pairs = []
            for name, dtype, shape, offset in header["tensors"]:
                dt = _dtype(dtype)
                n = dt.itemsize
                for d in shape:
                    n *= d
                pairs.append((name, buffers[slot][offset:offset + n].view(dt).view(shape)))
            ready = (pairs, bool(header.get("partial")))
            stats["tensors"] += len(pairs)
            stats["bytes"] += size
            slot = 1 - slot
        if ready is not None:
            hand_over(*ready)
    except WeightTransferError:
        raise
    except RuntimeError as exc:
        raise WeightTransferError(f"weight group {group.spec.key}: receive failed "
                                  f"(timeout {group.spec.timeout_s:g} s): {exc}") from exc
    if failed:
        raise failed[0]
    stats["seconds"] = time.perf_counter() - t0
    return stats


def _decode(header_buf: Any) -> dict[str, Any]:
    (length,) = struct.unpack("<q", bytes(header_buf[:8].tolist()))
    if not 0 < length <= HEADER_BYTES - 8:
        raise WeightTransferError(f"corrupt chunk header (length {length})")
    return json.loads(bytes(header_buf[8:8 + length].tolist()))
