"""Atomic training checkpoints: model weights, optimizer state and the trainer's own state.

Layout of ``CheckpointConfig.dir``::

    step-000012/                 one committed checkpoint, full (DDP):
        model.safetensors        model tensors (CPU, contiguous; tied tensors stored once)
        optimizer.pt             torch.save of the optimizer state dict (absent when None)
        state.json               step, version, trainer_state, extra, aliases, file sizes
    step-000013/                 or sharded (FSDP2, :meth:`CheckpointManager.save_sharded`):
        sharded/                 torch.distributed.checkpoint: every rank's shards of the
                                 model and optimizer ({"model": ..., "optim": ...} by
                                 parameter name), .metadata
        state.json               as above, "layout": "sharded", every file's size
    latest                       "step-000012": the commit point
    .tmp-...                     a checkpoint being written, or one being deleted

:meth:`CheckpointManager.save` writes into a ``.tmp-`` folder beside the others, fsyncs every
file, renames the folder into place, then replaces ``latest`` (temp file + ``os.replace`` +
directory fsync). **A step is committed when ``latest`` names it**: the trainer acknowledges
its stream entries only after :meth:`save` returns. A crash before that leaves at most a
``.tmp-`` folder (ignored, removed by the next save) or a ``step-`` folder newer than
``latest`` (uncommitted: ignored, replaced when that step is saved again, removed by the next
save). Old checkpoints beyond ``keep`` go after the commit.

Corrupt latest checkpoint policy: :meth:`CheckpointManager.latest` raises
:class:`CheckpointCorrupt` naming the path and what is wrong; it never falls back silently.
Falling back would resume at an older step while the stream entries trained after it are
already acknowledged (lost to training) and the weight versions after it already published
to the policy servers under the same numbers. An operator who accepts that loads an older one
explicitly: ``manager.load(manager.checkpoints()[-2])``.

A sharded checkpoint is written by every rank into the same ``.tmp-`` folder (rank 0 makes it
and broadcasts its name); DCP fsyncs each rank's file and writes ``.metadata`` once all are
written; then rank 0 commits as above. It loads at any world size and under either strategy
(DCP reshards); a full checkpoint loads under either strategy too.

Single writer: one trainer job saves into a directory at a time (readers are fine).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from consolerl.config import AtLeast, Checked
from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.tensors import unshared_tensors

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SHARDED_DIR = "sharded"
DCP_METADATA = f"{SHARDED_DIR}/.metadata"
STATE_FILE = "state.json"
LATEST_FILE = "latest"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


class CheckpointCorrupt(ConsoleRLError, RuntimeError):
    """The checkpoint at ``path`` cannot be loaded: ``reason`` says what is wrong."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"checkpoint {path} is corrupt: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


@dataclass(frozen=True)
class CheckpointConfig(Checked):
    """``dir``: where checkpoints go (``cluster.job`` puts a relative one inside ``run.dir``);
    ``every_steps``: :meth:`CheckpointManager.should_save`
    is true every k optimizer steps; ``keep``: committed checkpoints kept (the newest)."""

    dir: str = "checkpoints"
    every_steps: Annotated[int, AtLeast(1)] = 1
    keep: Annotated[int, AtLeast(1)] = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.dir, os.PathLike):
            object.__setattr__(self, "dir", os.fspath(self.dir))
        if not isinstance(self.dir, str) or not self.dir.strip():
            raise ConfigError(f"CheckpointConfig.dir: must be a non-empty path, "
                              f"got {self.dir!r}")


@dataclass
class Checkpoint:
    """A loaded checkpoint. ``model_state`` holds CPU tensors; keys that were tied when saved
    map to the same tensor object again. ``trainer_state`` and ``extra`` are what was given to
    :meth:`CheckpointManager.save` (JSON round-tripped)."""

    step: int
    version: int
    path: Path
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None
    trainer_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    # A sharded checkpoint: no tensors here (model_state empty, optimizer_state None); every
    # rank reads its part with CheckpointManager.read_sharded.
    sharded: bool = False


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


class CheckpointManager:
    """Saves and loads checkpoints under ``config.dir`` (see the module docstring)."""

    def __init__(self, config: CheckpointConfig):
        self.config = config
        self.dir = Path(config.dir)

    # -- queries ----------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        return step > 0 and step % self.config.every_steps == 0

    def checkpoints(self) -> list[Path]:
        """Committed checkpoint folders, oldest first (those newer than ``latest`` are
        uncommitted leftovers of a crash and not listed)."""
        latest = self._latest_name()
        if latest is None:
            return []
        latest_step = self._step_of(latest)
        return [p for s, p in self._step_dirs() if latest_step is None or s <= latest_step]

    def latest(self) -> Checkpoint | None:
        """The committed checkpoint ``latest`` names, or None before the first commit;
        :class:`CheckpointCorrupt` if it cannot be loaded (no fallback: see the module)."""
        path = self.latest_path()
        return None if path is None else self.load(path)

    def latest_path(self) -> Path | None:
        """The folder of the committed checkpoint ``latest`` names (nothing loaded), or None."""
        name = self._latest_name()
        if name is None:
            if self._step_dirs():
                log.warning("%s holds step folders but no '%s' pointer: none was committed",
                            self.dir, LATEST_FILE)
            return None
        if self._step_of(name) is None:
            raise CheckpointCorrupt(str(self.dir / LATEST_FILE),
                                    f"names {name!r}, not a step-NNNNNN folder")
        return self.dir / name

    def read_state(self, path: str | os.PathLike) -> dict[str, Any]:
        """A checkpoint's ``state.json`` (step, version, trainer_state, ...) without its
        tensors: what a controller needs while the workers load the weights themselves."""
        return self._read_state(Path(path))

    def load(self, path: str | os.PathLike) -> Checkpoint:
        """The checkpoint in folder ``path``; :class:`CheckpointCorrupt` naming what is
        missing or malformed."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointCorrupt(str(path), "the folder does not exist")
        state = self._read_state(path)
        for fname, size in state["files"].items():
            fpath = path / fname
            if not fpath.is_file():
                raise CheckpointCorrupt(str(path), f"{fname} is missing")
            if fpath.stat().st_size != size:
                raise CheckpointCorrupt(str(path), f"{fname} has {fpath.stat().st_size} "
                                        f"bytes, {size} were written")
        if state.get("layout") == "sharded":
            return Checkpoint(state["step"], state["version"], path, {}, None,
                              state["trainer_state"], state.get("extra", {}),
                              state.get("time", 0.0), sharded=True)
        try:
            stored = load_file(path / MODEL_FILE, device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointCorrupt(str(path), f"{MODEL_FILE}: {exc}") from None
        aliases: dict[str, str] = state["aliases"]
        model_state: dict[str, torch.Tensor] = {}
        for key in state["model_keys"]:
            source = aliases.get(key, key)
            if source not in stored:
                raise CheckpointCorrupt(str(path), f"{MODEL_FILE} lacks tensor {source!r}")
            model_state[key] = stored[source]
        optimizer_state = None
        if OPTIMIZER_FILE in state["files"]:
            try:
                optimizer_state = torch.load(path / OPTIMIZER_FILE, map_location="cpu",
                                             weights_only=True)
            except Exception as exc:  # torch raises many types for a damaged pickle/zip
                raise CheckpointCorrupt(str(path), f"{OPTIMIZER_FILE}: "
                                        f"{type(exc).__name__}: {exc}") from None
        return Checkpoint(state["step"], state["version"], path, model_state, optimizer_state,
                          state["trainer_state"], state.get("extra", {}),
                          state.get("time", 0.0))

    def read_sharded(self, path: str | os.PathLike, state: dict[str, Any]) -> None:
        """Fill ``state`` (every rank's own tensors, shaped as this run shards them) from the
        sharded checkpoint at ``path`` (:meth:`load` checked its files); every rank calls it.
        DCP reshards: the checkpoint may come from another world size or strategy."""
        import torch.distributed.checkpoint as dcp
        try:
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(Path(path) / SHARDED_DIR)))
        except Exception as exc:  # DCP raises CheckpointException and others for bad files
            raise CheckpointCorrupt(str(path), f"{SHARDED_DIR}: {type(exc).__name__}: "
                                    f"{str(exc)[:500]}") from None

    # -- saving -----------------------------------------------------------------------------

    def save(self, step: int, version: int, model_state: dict[str, torch.Tensor],
             optimizer_state: dict[str, Any] | None, trainer_state: dict[str, Any],
             extra: dict[str, Any] | None = None) -> Path:
        """Write and commit checkpoint ``step``; returns its folder. ``trainer_state`` and
        ``extra`` must be JSON-serialisable (group ids, entry ids, metrics). Tensors are
        copied to CPU; tensors that are the same view of one storage (tied embeddings) are
        stored once and come back as one object under every key."""
        state_json = _json_state(step, version, trainer_state, extra)
        tensors, aliases = unshared_tensors(model_state, "save: 'model_state'")
        tmp = self._stage(step)
        try:
            files: dict[str, int] = {}
            save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "pt"})
            _fsync_file(tmp / MODEL_FILE)
            files[MODEL_FILE] = (tmp / MODEL_FILE).stat().st_size
            if optimizer_state is not None:
                with open(tmp / OPTIMIZER_FILE, "wb") as f:
                    torch.save(optimizer_state, f)
                    f.flush()
                    os.fsync(f.fileno())
                files[OPTIMIZER_FILE] = (tmp / OPTIMIZER_FILE).stat().st_size
            state = {"format": FORMAT_VERSION, "step": step, "version": version,
                     "time": time.time(), "model_keys": list(model_state),
                     "aliases": aliases, "files": files, **state_json}
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self._commit(tmp, step, state)

    def save_sharded(self, step: int, version: int, state: dict[str, Any],
                     trainer_state: dict[str, Any], extra: dict[str, Any] | None = None
                     ) -> Path | None:
        """Write and commit checkpoint ``step`` from every rank's shards: a collective, every
        rank of the default process group calls it with its own ``state`` (DCP's state dict:
        DTensor shards or whole tensors by name). Rank 0 returns the committed folder, the
        other ranks None."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        state_json = _json_state(step, version, trainer_state, extra)
        distributed = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if distributed else 0
        name: list[Any] = [None]
        if rank == 0:
            try:
                name = [str(self._stage(step))]
            except Exception as exc:
                name = [exc]                     # the other ranks must not wait for a name
        if distributed:
            dist.broadcast_object_list(name, src=0)
        if isinstance(name[0], BaseException):
            raise name[0]
        tmp = Path(name[0])
        try:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp / SHARDED_DIR),
                                                                sync_files=True))
        except BaseException:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if rank != 0:
            return None
        try:
            _fsync_dir(tmp / SHARDED_DIR)
            files = {str(f.relative_to(tmp)): f.stat().st_size
                     for f in sorted((tmp / SHARDED_DIR).iterdir()) if f.is_file()}
            if DCP_METADATA not in files:
                raise CheckpointCorrupt(str(tmp), f"DCP wrote no {DCP_METADATA}")
            meta = {"format": FORMAT_VERSION, "layout": "sharded", "step": step,
                    "version": version, "time": time.time(), "model_keys": [], "aliases": {},
                    "files": files, **state_json}
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self._commit(tmp, step, meta)

    def _stage(self, step: int) -> Path:
        """A fresh ``.tmp-`` folder for checkpoint ``step`` (leftovers of a crash removed)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cleanup()
        tmp = self.dir / f"{TMP_PREFIX}{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def _commit(self, tmp: Path, step: int, state: dict[str, Any]) -> Path:
        """``state.json`` into ``tmp``, then ``tmp`` renamed into place, ``latest`` moved to
        it, old checkpoints removed."""
        final = self.dir / step_dir_name(step)
        try:
            with open(tmp / STATE_FILE, "w") as f:
                json.dump(state, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            replaced = None
            if final.exists():
                # Usually an uncommitted folder from a crash after the rename, before the
                # pointer; if it is the committed one (the same step saved twice), a crash
                # between these two renames leaves 'latest' naming a missing folder.
                replaced = self.dir / f"{TMP_PREFIX}delete-{final.name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, replaced)
            os.rename(tmp, final)
            _fsync_dir(self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
        self._write_latest(final.name)
        self._retain(step)
        return final

    def cleanup(self) -> None:
        """Remove ``.tmp-`` folders and files left by a crashed save or delete (the single
        writer calls this; :meth:`save` does)."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if p.name.startswith(TMP_PREFIX) or p.name.startswith(f".{LATEST_FILE}.tmp"):
                log.info("removing the leftover %s", p)
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)

    # -- internals --------------------------------------------------------------------------

    def _write_latest(self, name: str) -> None:
        tmp = self.dir / f".{LATEST_FILE}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / LATEST_FILE)
        _fsync_dir(self.dir)

    def _retain(self, step: int) -> None:
        """Keep the newest ``keep`` committed folders up to ``step``; folders after ``step``
        are uncommitted leftovers of an earlier run's crash."""
        committed = [(s, p) for s, p in self._step_dirs() if s <= step]
        stale = committed[:-self.config.keep] + [(s, p) for s, p in self._step_dirs()
                                                if s > step]
        for _, p in stale:
            self._remove(p)

    def _remove(self, path: Path) -> None:
        # Rename first: a crash half-way through rmtree leaves a .tmp- folder, never a
        # step folder with files missing.
        doomed = self.dir / f"{TMP_PREFIX}delete-{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _latest_name(self) -> str | None:
        try:
            return (self.dir / LATEST_FILE).read_text().strip()
        except FileNotFoundError:
            return None

    def _step_dirs(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        found = [(self._step_of(p.name), p) for p in self.dir.iterdir() if p.is_dir()]
        return sorted((s, p) for s, p in found if s is not None)

    @staticmethod
    def _step_of(name: str) -> int | None:
        m = _STEP_DIR.match(name)
        return int(m.group(1)) if m else None

    @staticmethod
    def _read_state(path: Path) -> dict[str, Any]:
        try:
            state = json.loads((path / STATE_FILE).read_text())
        except FileNotFoundError:
            raise CheckpointCorrupt(str(path), f"{STATE_FILE} is missing") from None
        except (ValueError, OSError) as exc:
            raise CheckpointCorrupt(str(path), f"{STATE_FILE} is not valid JSON: "
                                    f"{exc}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
            raise CheckpointCorrupt(str(path), f"{STATE_FILE} is not format {FORMAT_VERSION}")
        types = {"step": int, "version": int, "model_keys": list, "aliases": dict,
                 "files": dict, "trainer_state": dict}
        for key, kind in types.items():
            if not isinstance(state.get(key), kind):
                raise CheckpointCorrupt(str(path), f"{STATE_FILE} field {key!r} is missing or "
                                        f"not a {kind.__name__}")
        layout = state.get("layout", "full")
        needed = {"full": MODEL_FILE, "sharded": DCP_METADATA}.get(layout)
        if needed is None:
            raise CheckpointCorrupt(str(path), f"{STATE_FILE}: unknown layout {layout!r}")
        if needed not in state["files"]:
            raise CheckpointCorrupt(str(path), f"{STATE_FILE} lists no {needed}")
        return state


def _json_state(step: int, version: int, trainer_state: dict[str, Any],
                extra: dict[str, Any] | None) -> dict[str, Any]:
    """``trainer_state`` and ``extra`` as JSON holds them; a ConfigError for a bad step,
    version or a value JSON cannot hold."""
    for name, value in (("step", step), ("version", version)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"save: {name!r} must be an integer >= 0, got {value!r}")
    try:
        return {"trainer_state": json.loads(json.dumps(trainer_state)),
                "extra": json.loads(json.dumps(dict(extra or {})))}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"save: 'trainer_state' and 'extra' must be JSON-serialisable "
                          f"dicts: {exc}") from None


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
