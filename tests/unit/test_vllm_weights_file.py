"""The vLLM engine's weights file (the object-store fallback): written under a lock that the
replicas of a node share, in the shared-memory folder when it has room, in the engine's own
folder when that folder fills up while writing, and a clear error naming the size and the free
space when both do. The disk filling up is simulated (``save_file`` raising ENOSPC); the lock,
the folders and the fallback logic are the engine's own. No vLLM process is started."""
from __future__ import annotations

import errno
import threading
import time

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from rollout_service import vllm_engine  # noqa: E402
from rollout_service.vllm_engine import EngineError, VllmEngine  # noqa: E402


@pytest.fixture
def engine(tmp_path):
    e = VllmEngine.__new__(VllmEngine)          # no vLLM process: only the file logic
    e._dir = tmp_path / "own"
    e._dir.mkdir()
    e.shm_dir = tmp_path / "shm"
    e.shm_dir.mkdir()
    return e


TENSORS = {"w": torch.ones(256, 256)}


def test_the_file_goes_to_shared_memory_when_it_has_room(engine):
    path = engine._write_weights(TENSORS, "weights-1.safetensors")
    assert path.parent == engine.shm_dir
    assert torch.equal(safetensors_torch.load_file(str(path))["w"], TENSORS["w"])


def test_a_full_shared_memory_falls_back_to_the_engines_folder(engine, monkeypatch):
    real = safetensors_torch.save_file

    def save(tensors, path):
        if path.startswith(str(engine.shm_dir)):
            open(path, "wb").write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path)
    monkeypatch.setattr(safetensors_torch, "save_file", save)
    path = engine._write_weights(TENSORS, "weights-2.safetensors")
    assert path.parent == engine._dir and path.exists()
    assert not (engine.shm_dir / "weights-2.safetensors").exists()   # the partial file: gone


def test_no_room_anywhere_is_an_engine_error_naming_size_and_free_space(engine, monkeypatch):
    def save(tensors, path):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(safetensors_torch, "save_file", save)
    with pytest.raises(EngineError, match=r"0\.00 GiB.*shm \(.*GiB free.*own \(.*GiB free"):
        engine._write_weights(TENSORS, "weights-3.safetensors")


def test_other_write_errors_are_not_taken_for_a_full_disk(engine, monkeypatch):
    def save(tensors, path):
        raise OSError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(safetensors_torch, "save_file", save)
    with pytest.raises(PermissionError):
        engine._write_weights(TENSORS, "weights-4.safetensors")


def test_replicas_write_one_at_a_time(engine):
    """A second writer waits while another holds the node's lock (flock: separate opens of the
    lock file exclude each other, across processes as across threads)."""
    done = threading.Event()
    with vllm_engine._locked(engine.shm_dir / "consolerl-weights.lock"):
        writer = threading.Thread(target=lambda: (engine._write_weights(
            TENSORS, "weights-5.safetensors"), done.set()))
        writer.start()
        time.sleep(0.5)
        assert not done.is_set()
    writer.join(10)
    assert done.is_set()
