"""The training job: ``python -m cluster.job --config configs/<name>.yaml [key=value ...]``.

On one machine it starts what is missing (an embedded Ray cluster, Redis on the stream URL's
port, the local cloud on the configured endpoint); under ``ray job submit --address
http://HEAD:8265 --working-dir . -- python -m cluster.job --config ...`` it joins the cluster
(``RAY_ADDRESS``) and uses whatever external Redis and cloud the config names.

Stages: (0) when ``eval.heldout_states``, the oracle's trajectories on the evaluation's
tasks recorded for offline probes, never trained on (:func:`heldout_states_stage`); (1) SFT on
oracle trajectories when ``sft.enabled`` (exported first unless ``sft.data`` names a JSONL
file); (2) GRPO: PolicyServers and trainer workers start from the
SFT output (or ``trainer.model`` / ``policy.model``), the orchestrator fills the experience
stream asynchronously and the trainer consumes it (:class:`trainer.grpo.GRPOTrainer`) for
``trainer.steps`` steps. At the end everything is stopped in order: the orchestrator
finishes its episodes and cleans up their resources, accounts are released, actors, Ray and
the embedded services (last) are stopped. On Ctrl-C or SIGTERM (to the driver or its whole
process group) the same happens, with episodes stopped at their next step; the exit code is
then 128 + the signal's number.

The run folder (``run.dir``) gets ``config.json``, ``metrics.jsonl`` (one line per SFT or
GRPO step), ``checkpoints/``, ``summary.json`` and ``curves.png`` (and the stages' data:
``sft-data.jsonl``, ``heldout-states.jsonl``). ``--resume`` continues from the latest
checkpoint there.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from prometheus_client import CollectorRegistry
from tqdm import tqdm

from cluster.builders import env_pool, rollout_spec, trainer_algo
from cluster.config import JobConfig, check_training
from cluster.fit import dry_run
from cluster.replicas import start_policy
from cluster.rollout import TrainingRolloutsActor, success_by_version
from cluster.runtime import (PeakMemory, Session, handle_stop_signals, on_driver_node,
                             progress, stop_actors, stop_exit_code, stopping)
from consolerl.config import load_config, to_dict
from consolerl.errors import ConfigError, ConsoleRLError
from consolerl.tasks import TASKS_DIR
from env_workers.leases import AccountPool
from env_workers.pool import EnvPoolConfig
from infra.llm import OpenAIChatClient
from rollout_service.experience import ExperienceStream
from datagen.augment import augment_file
from datagen.engine import make_tasks as make_engine_tasks
from datagen.export import ExportConfig, account_secrets, run_export
from env_workers.accounts import load_pool_accounts
from rollout_service.policy import PolicyConfig, PolicyServer
from datagen.src import CollectConfig, ModelStudent, run_collection
from datagen.teacher import ChatTeacher, OracleTeacher
from jobsapi.store import TrainingBeacon
from rollout_service.agent import AgentConfig
from rollout_service.models import HFChatTokenizer, resolve_model, write_agent_settings
from trainer.curves import plot_curves
from trainer.engine import EngineConfig, call_for_rank0, start_workers
from trainer.failures import describe_failure, explain_no_experience
from trainer.grpo import GRPOTrainer, NoExperienceError
from trainer.placement import TrainerRanks
from trainer.sft import train_sft
from trainer.stream import dead_letter_stream, redact_url
from trainer.weight_sync import ReplicaSync, WeightPublisher, generation_paused

log = logging.getLogger("cluster.job")
# The run folder's data files: the oracle's train-split trajectories SFT trains on, and its
# trajectories on the evaluation's tasks that only offline probes read.
SFT_DATA = "sft-data.jsonl"
HELDOUT_STATES = "heldout-states.jsonl"
# The last memory sample of every process of the job, by pid: (kind, PSS bytes), for the
# message when one of them is killed for memory.
LAST_PSS: dict[int, tuple[str, int]] = {}


def run(config: JobConfig) -> dict[str, Any]:
    """The whole job; returns the summary (also written to ``summary.json``)."""
    check_training(config)
    run_dir = Path(config.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not Path(config.trainer.checkpoint.dir).is_absolute():
        config = replace(config, trainer=replace(config.trainer, checkpoint=replace(
            config.trainer.checkpoint, dir=str(run_dir / config.trainer.checkpoint.dir))))
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    if not config.run.resume:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    t_start = time.monotonic()
    memory = PeakMemory(last=LAST_PSS)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "completed": False}
    try:
        with Session(config, run_dir) as session:
            started = Started(session.config)
            try:
                _grpo(session, run_dir, summary, started, t_start)
            except KeyboardInterrupt:
                started.interrupted = True
                raise
            finally:
                summary.update(started.stop())
    except NoExperienceError as exc:
        # Not a crash: the rollouts gave nothing to train on. Everything is stopped and
        # main() explains from the rollout counts why.
        summary["error"] = str(exc)
    finally:
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        summary["peak_memory_gib"] = memory.stop()
        summary["peak_memory_by_process_gib"] = memory.breakdown_gib()
        _write_summary(run_dir, summary)
    return summary


def _grpo(session: Session, run_dir: Path, summary: dict[str, Any], started: Started,
          t_start: float) -> None:
    """SFT when configured, then GRPO to the end; what it starts goes into ``started``."""
    config = session.config
    summary["services"] = {"redis": redact_url(config.stream.url),
                           "cloud": config.cloud.endpoint}
    if not config.run.resume:
        ExperienceStream(config.stream).clear(dead_letter_stream(config.stream,
                                                                 config.trainer.consumer))
    start_model = config.trainer.model or config.policy.model
    if config.eval.heldout_states:
        in_child(_heldout_child, config, str(run_dir), start_model)
    if config.sft.enabled:
        start_model = _sft_stage(config, run_dir, start_model)
    if config.src.enabled:
        start_model = in_child(_src_child, config, str(run_dir), start_model)
    model_path = resolve_model(start_model)
    summary["start_model"] = model_path
    progress(f"GRPO: {config.trainer.steps} steps of {config.orchestrator.groups_per_step} "
             f"groups x {config.orchestrator.group_size}; {config.env.workers} env workers; "
             f"policy {config.policy.backend} x{config.policy.replicas}; "
             f"{config.trainer.engine.workers} trainer worker(s)")
    policy = replace(config.policy, model=model_path)
    started.servers, _ = start_policy(policy, session.metrics)
    started.workers = start_workers(model_path, config.trainer.engine, trainer_algo(config))
    servers = started.servers
    pad = HFChatTokenizer(model_path).tokenizer.pad_token_id
    registry = CollectorRegistry()
    publisher = WeightPublisher(servers, started.workers, config.trainer.weights,
                                config.trainer.engine, registry)
    trainer = started.trainer = GRPOTrainer(
        config.trainer, config.stream, config.orchestrator.groups_per_step, started.workers,
        publisher, pad if pad is not None else 0, run_dir, registry)
    if config.trainer.pause_generation:
        trainer.around_step = lambda: generation_paused(servers, config.trainer.read_timeout_s)
    sync = ReplicaSync(trainer, publisher)
    trainer.while_waiting = lambda: (sync(), _check_rollouts(started.run_ref))
    url = session.announcements.publish([trainer.registry], "trainer", "trainer")
    if url:
        progress(f"metrics announced for Prometheus as run={session.metrics.run} "
                 f"(trainer: {url}; make observe scrapes them)")
    if config.run.resume and trainer.restore():
        progress(f"resumed at step {trainer.step} (version {trainer.version})")
    trainer.start()                 # the trainer version before the orchestrator reads it
    # API jobs on the same cluster keep to their share of the pool while this runs.
    started.beacon = TrainingBeacon(config.stream.url, config.api.prefix).start()
    # On the driver's node: losing a worker node never takes the control plane with it.
    started.rollouts = TrainingRolloutsActor.options(
        num_cpus=0, scheduling_strategy=on_driver_node()).remote(
        rollout_spec(config, policy, session.metrics), config.orchestrator, config.stream,
        servers, config.trainer.algo.step_signal_gamma)
    started.run_ref = started.rollouts.run.remote(None)
    budget = config.trainer.time_budget_s
    summary["history"] = trainer.run(config.trainer.steps, _step_printer(config, trainer),
                                     deadline=t_start + budget if budget else None)
    summary["stopped_by"] = trainer.stopped_by
    summary["final_model"] = _save_final(started.workers, config.trainer.engine, model_path,
                                         run_dir / "final", config.agent)
    progress(f"final model: {summary['final_model']}")
    summary["completed"] = True


class Started:
    """What the GRPO stage started, stopped in order by :meth:`stop`: the training beacon,
    the rollouts (episodes end, their resources are destroyed, accounts released), the
    trainer's final checks, then the trainer workers (and their placement group) and the
    policy replicas. After an interrupt (``interrupted``) episodes stop at their next step
    and the actors get a short grace, so the whole stop fits in seconds."""

    def __init__(self, config: JobConfig):
        self.config = config
        self.interrupted = False
        self.beacon: TrainingBeacon | None = None
        self.rollouts: Any = None
        self.run_ref: Any = None
        self.trainer: GRPOTrainer | None = None
        self.servers: list[Any] = []
        self.workers = TrainerRanks()

    def stop(self) -> dict[str, Any]:
        stopping()
        out: dict[str, Any] = {}
        if self.interrupted:
            progress("stopping: episodes end at their next step, accounts are released")
        if self.beacon is not None:
            self.beacon.stop()
        pool = env_pool(self.config, None)
        if self.rollouts is not None:
            out.update(_stop_rollouts(self.rollouts, self.run_ref, pool.pool.lease_ttl_s,
                                      self.interrupted))
        if self.trainer is not None:
            out.update(_final_checks(self.trainer, self.servers, pool))
        stop_actors(self.workers + self.servers, timeout_s=10 if self.interrupted else 60)
        self.workers.remove_placement()
        return out


def _save_final(workers: list[Any], engine: EngineConfig, model_path: str,
                folder: Path, agent: AgentConfig) -> str:
    """The trained weights as a model folder (config, weights, tokenizer, and ``agent.json``:
    the run's agent settings) that the policy, ``cluster.evaluate`` and Hugging Face load;
    written beside (by rank 0; under FSDP2 every rank takes part in gathering the weights),
    then swapped in."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rank0, others = call_for_rank0(workers, engine, "save_pretrained", str(tmp))
    ray.get([rank0, *others])
    for f in Path(model_path).iterdir():
        if f.is_file() and (f.name.startswith("tokenizer") or f.name in (
                "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")):
            shutil.copy2(f, tmp / f.name)
    write_agent_settings(tmp, agent)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return str(folder)


def _sft_stage(config: JobConfig, run_dir: Path, start_model: str) -> str:
    """SFT in a child process: its model, optimizer and allocator arenas (several GB on CPU)
    are returned to the system before GRPO starts its own."""
    return in_child(_sft_child, config, str(run_dir), start_model)


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh (spawned) process; its result or its exception. Interrupted
    (Ctrl-C, SIGTERM), the child is killed at once."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return pool.submit(fn, *args).result()
    except BaseException:
        # Interrupted (or failed): stop the child now. The executor's own exit would wait
        # for the whole SFT to finish (measured: a Ctrl-C during SFT waited on it).
        for child in list((getattr(pool, "_processes", None) or {}).values()):
            child.kill()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _sft_child(config: JobConfig, run_dir: str, start_model: str) -> str:
    return sft_stage(config, Path(run_dir), start_model, progress=progress)


def _concat_jsonl(out: Path, first: str | Path, then: Path) -> None:
    """``first``'s lines then ``then``'s, into ``out`` (a newline between them when ``first``
    does not end with one)."""
    head = Path(first).read_text(encoding="utf-8")
    out.write_text(head + ("\n" if head and not head.endswith("\n") else "")
                   + then.read_text(encoding="utf-8"), encoding="utf-8")


def augmented_sft_data(config: JobConfig, run_dir: Path, data: str, model: str,
                       progress: Callable[[str], None] = progress) -> str:
    """What SFT trains on: ``data`` itself, or with ``sft.augment_copies`` the variants of its
    trajectories (:func:`datagen.augment.augment_file`, ``model``'s tokenizer, the cloud's
    account secrets refused) written beside it to ``<run_dir>/sft-augment.jsonl``, and the
    originals then the variants in ``<run_dir>/sft-train.jsonl``, whose path it returns."""
    augment = config.sft.augment()
    if not augment.copies:
        return data
    augmented, train = Path(run_dir) / "sft-augment.jsonl", Path(run_dir) / "sft-train.jsonl"
    secrets = account_secrets(load_pool_accounts(env_pool(config, None).pool))
    summary = augment_file(data, augmented, augment, HFChatTokenizer(resolve_model(model)),
                           secrets, progress=lambda _: None)
    _concat_jsonl(train, data, augmented)
    progress(f"SFT: {summary['records_out']} augmented trajectories ({summary['turns_out']} "
             f"turns, {augment.copies} per trajectory) in {summary['wall_s']} s")
    return str(train)


def engine_sft_data(config: JobConfig, run_dir: Path, data: str, model: str,
                    progress: Callable[[str], None] = progress) -> str:
    """``data``, or with ``sft.engine_tasks`` ``data`` then the teacher's confirmed
    trajectories on the data engine's tasks (:func:`datagen.engine.make_tasks` into
    ``<run_dir>/engine/tasks``, the evaluation's ``eval.tasks`` kept out; exported with the
    job's cloud and agent settings into ``<run_dir>/sft-engine.jsonl``) in
    ``<run_dir>/sft-data-engine.jsonl``, whose path it returns."""
    sft = config.sft
    if not sft.engine_tasks:
        return data
    run_dir = Path(run_dir)
    made = make_engine_tasks(run_dir / "engine" / "tasks", sft.engine_tasks, sft.engine_wrong,
                             sft.seed, config.eval.tasks)
    (run_dir / "engine" / "summary.json").write_text(json.dumps(made, indent=2) + "\n")
    engine = run_dir / "sft-engine.jsonl"
    exported = export_oracle(config, str(engine), "all", "", 1, model,
                             suite=str(run_dir / "engine" / "tasks"))
    progress(f"SFT: the data engine made {made['tasks']} tasks and {made['wrong_docs']} "
             f"wrong documents; the teacher's trajectories confirmed on {exported['written']} "
             f"({exported['turns']} turns) in {exported['wall_s']} s")
    combined = run_dir / "sft-data-engine.jsonl"
    _concat_jsonl(combined, data, engine)
    return str(combined)


def sft_stage(config: JobConfig, run_dir: Path, start_model: str,
              progress: Callable[[str], None] = progress) -> str:
    """The training job's SFT stage: export oracle trajectories of train-split ``sft.tasks`` into
    ``<run_dir>/sft-data.jsonl`` unless ``sft.data`` names a file (the job's own cloud, Redis,
    lease prefix, env workers and agent prompt settings), train ``start_model`` on them into
    ``<run_dir>/sft``, append the steps to ``<run_dir>/metrics.jsonl`` as ``"stage": "sft"``.
    Returns the trained folder; a run folder that already has one (resume) reuses it."""
    sft = config.sft
    out = Path(run_dir) / "sft"
    if (out / "sft_summary.json").exists():
        progress(f"SFT: reusing {out}")
        return str(out)
    data = sft.data
    if not data:
        data = str(Path(run_dir) / SFT_DATA)
        exported = export_oracle(config, data, "train", sft.tasks, sft.episodes_per_task,
                                 start_model)
        progress(f"SFT: exported {exported['written']} oracle trajectories "
                 f"({exported['turns']} turns) in {exported['wall_s']} s")
    data = engine_sft_data(config, Path(run_dir), data, start_model, progress)
    data = augmented_sft_data(config, Path(run_dir), data, start_model, progress)
    _train_stage(replace(sft, data=data, out=str(out), model=start_model), config.agent,
                 run_dir, "sft", "SFT", progress)
    return str(out)


def export_oracle(config: JobConfig, out: str, split: str, tasks: str,
                  episodes_per_task: int, model: str, suite: str = "") -> dict[str, Any]:
    """The oracle's trajectories on ``split``'s tasks matching ``tasks`` (of ``suite``; ""
    the task suite) into ``out`` (:func:`datagen.export.run_export`, the SFT record format)
    with the job's own cloud, Redis, lease prefix, env workers and agent settings; ``model``
    names the tokenizer. Returns the export's summary."""
    pool = env_pool(config, None)
    return asyncio.run(run_export(ExportConfig(
        out=out, split=split, tasks=tasks, episodes_per_task=episodes_per_task,
        workers=pool.workers, agent=config.agent, model=model, suite=suite or str(TASKS_DIR),
        cloud_endpoint=config.cloud.endpoint, console_url=pool.worker.console_url,
        redis_url=pool.pool.redis_url, accounts_file=config.cloud.accounts_file,
        lease_prefix=pool.pool.key_prefix)))


def _heldout_child(config: JobConfig, run_dir: str, model: str) -> str:
    return heldout_states_stage(config, Path(run_dir), model, progress=progress)


def heldout_states_stage(config: JobConfig, run_dir: Path, model: str,
                         progress: Callable[[str], None] = progress) -> str:
    """The oracle's trajectories on the evaluation's tasks (``eval.split``, ``eval.tasks``),
    one episode per task, into ``<run_dir>/heldout-states.jsonl``: the SFT export's record
    format and agent settings (:func:`export_oracle`), the held-out states
    ``benchmarks.dose`` probes a trained model on. No training stage reads this file (SFT
    trains on ``sft-data.jsonl``, SRC collects on train-split tasks, GRPO samples
    ``orchestrator.split``). A run folder that already has it (resume) keeps it. Returns its
    path."""
    out = Path(run_dir) / HELDOUT_STATES
    if out.exists():
        progress(f"held-out states: reusing {out}")
        return str(out)
    ev = config.eval
    exported = export_oracle(config, str(out), ev.split, ev.tasks, 1, model)
    progress(f"held-out states: recorded {exported['written']} oracle trajectories "
             f"({exported['turns']} turns) of {exported['tasks']} {ev.split} tasks in "
             f"{exported['wall_s']} s")
    return str(out)


def _train_stage(sft: Any, agent: AgentConfig, run_dir: Path, stage: str, name: str,
                 progress: Callable[[str], None]) -> None:
    """SFT with ``sft`` (its ``out`` the stage's folder, with ``agent.json`` from ``agent``);
    its steps appended to ``<run_dir>/metrics.jsonl`` as ``"stage": stage``."""
    summary = train_sft(sft, agent)
    with (Path(run_dir) / "metrics.jsonl").open("a", encoding="utf-8") as f:
        for line in (Path(sft.out) / "metrics.jsonl").read_text().splitlines():
            f.write(json.dumps({"stage": stage, **json.loads(line)}) + "\n")
    progress(f"{name}: {summary['steps']} steps, loss {summary['first_loss']:.4f} -> "
             f"{summary['last_loss']:.4f}, {summary['wall_s']} s")


def _src_child(config: JobConfig, run_dir: str, start_model: str) -> str:
    return src_stage(config, Path(run_dir), start_model, progress=progress)


def src_teacher(src: Any) -> Any:
    """The SRC stage's teacher (:class:`cluster.config.SrcSection`)."""
    if src.teacher == "oracle":
        return OracleTeacher()
    return ChatTeacher(OpenAIChatClient(src.teacher, src.teacher_model,
                                        api_key_env=src.teacher_api_key_env, max_tokens=256))


def src_stage(config: JobConfig, run_dir: Path, start_model: str,
              progress: Callable[[str], None] = progress) -> str:
    """The job's SRC stage (:class:`cluster.config.SrcSection`): ``start_model`` (the oracle
    SFT model) as the student, corrections and the archive into ``<run_dir>/src-data.jsonl``
    (its figures into ``<run_dir>/src_summary.json``) unless ``src.data`` names a file, then
    ``src.epochs`` of SFT on them into ``<run_dir>/sft-src``. Resumes like the SFT stage."""
    src, sft = config.src, config.sft
    out = Path(run_dir) / "sft-src"
    if (out / "sft_summary.json").exists():
        progress(f"SRC: reusing {out}")
        return str(out)
    data = src.data
    if not data:
        data = str(Path(run_dir) / "src-data.jsonl")
        pool = env_pool(config, None)
        agent = replace(config.agent, temperature=config.agent.temperature
                        if src.temperature is None else src.temperature)
        server = PolicyServer(PolicyConfig(model=resolve_model(start_model),
                                           backend="transformers", dtype="float32"))
        tokenizer = HFChatTokenizer(resolve_model(start_model))
        try:
            figures = asyncio.run(run_collection(CollectConfig(
                src=src,
                split="train", tasks=src.tasks or sft.tasks,
                attempts_per_task=src.attempts_per_task, workers=pool.workers, out=data,
                cloud_endpoint=config.cloud.endpoint, console_url=pool.worker.console_url,
                redis_url=pool.pool.redis_url, accounts_file=config.cloud.accounts_file,
                lease_prefix=pool.pool.key_prefix), src_teacher(src),
                ModelStudent(server, tokenizer, agent), agent, tokenizer))
        finally:
            asyncio.run(server.shutdown())
        (Path(run_dir) / "src_summary.json").write_text(json.dumps(figures, indent=2) + "\n")
        progress(f"SRC: {figures['attempts']} attempts, {figures['trajectories']} passed, "
                 f"{figures['corrections']} corrections, {figures['archived']} archived, "
                 f"replay fidelity {figures['replay_fidelity']} ({figures['wall_s']} s)")
    _train_stage(replace(sft, data=data, out=str(out), model=start_model, epochs=src.epochs,
                         lr=sft.lr if src.lr is None else src.lr), config.agent, run_dir,
                 "sft-src", "SRC SFT", progress)
    return str(out)


def _step_printer(config: JobConfig, trainer: Any):
    bar = tqdm(total=config.trainer.steps, initial=trainer.step, desc="GRPO", unit="step",
               file=sys.stderr, dynamic_ncols=True)

    def on_step(m: dict[str, Any]) -> None:
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward_mean']:.2f}", success=f"{m['success_rate']:.2f}",
                        v=m["version"])
        bar.write(f"step {m['step']}: reward {m['reward_mean']:.3f} success "
                  f"{m['success_rate']:.2f} loss {m['loss']:.4f} step {m['step_s']:.1f}s "
                  f"sync {m.get('weight_sync_s', 0):.2f}s staleness {m['max_staleness']}",
                  file=sys.stderr)
        if m["step"] >= config.trainer.steps:
            bar.close()
    return on_step


def _check_rollouts(run_ref: Any) -> None:
    """While the trainer waits: the rollouts ending on their own (an error in the rollout
    actor, the actor lost) would leave it waiting for nothing; stop the job instead."""
    if run_ref is None or not ray.wait([run_ref], timeout=0)[0]:
        return
    try:
        result = ray.get(run_ref)
    except Exception as exc:  # noqa: BLE001 - report the rollout side's own error
        raise RolloutsStopped(f"the rollouts stopped: {describe_failure(exc)}") from exc
    raise RolloutsStopped(f"the rollouts stopped before training ended: {result}")


class RolloutsStopped(ConsoleRLError, RuntimeError):
    """The rollout actor's run ended while the trainer still waited for experience."""


def _stop_rollouts(rollouts: Any, run_ref: Any, lease_ttl_s: float, interrupted: bool
                   ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        ray.get(rollouts.stop.remote(interrupted), timeout=30)
        out["rollout"] = ray.get(run_ref, timeout=20 if interrupted else 600)
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["rollout_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        out["train_curve"] = success_by_version(ray.get(rollouts.results.remote(),
                                                        timeout=120))
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["train_curve_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        # What dead holders (this run's, or a killed run's before a --resume) left behind.
        out["orphans_cleaned"] = ray.get(rollouts.sweep.remote(lease_ttl_s + 15),
                                         timeout=lease_ttl_s + 120)
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["sweep_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        ray.get(rollouts.drain.remote(), timeout=120)
    except Exception as exc:  # noqa: BLE001
        out["drain_error"] = f"{type(exc).__name__}: {exc}"[:500]
    ray.kill(rollouts)
    return out


def _final_checks(trainer: Any, servers: list[Any], pool: EnvPoolConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": trainer.step, "version": trainer.version,
                           "weight_sync_s": trainer.sync_times}
    try:
        out["replica_versions"] = ray.get([s.version.remote() for s in servers], timeout=60)
    except Exception as exc:  # noqa: BLE001
        out["replica_versions_error"] = str(exc)[:300]
    try:
        out["pending_entries"] = trainer.consumer.pending()
        out["leases_held"] = _leases_left(pool)
    except Exception as exc:  # noqa: BLE001
        out["pending_error"] = str(exc)[:300]
    return out


def _leases_left(config: EnvPoolConfig) -> int:
    """Leases still held once the rollouts stopped. A worker that died mid-episode (its
    process killed, its node lost) leaves its lease to expire on its own: wait out the TTL
    for those; one that outlives it is a leak."""
    ttl_s = config.pool.lease_ttl_s
    deadline = time.monotonic() + ttl_s + 5
    said = False
    pool = AccountPool.from_config(config.pool)
    try:
        while True:
            held = pool.status().leased
            if not held or time.monotonic() > deadline:
                return held
            if not said:
                progress(f"waiting for {held} lease(s) of a lost env worker to expire "
                         f"(env.pool.lease_ttl_s={ttl_s:g})")
                said = True
            time.sleep(min(1.0, ttl_s))
    finally:
        pool.close()


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if not (run_dir / "metrics.jsonl").exists():
        return                   # stopped before its first step: nothing to plot
    try:
        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    except Exception as exc:  # noqa: BLE001 - a missing plot never fails the run
        log.warning("no curves: %s", exc)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--dry-run" in argv:
        # Nothing starts: the memory, GPU, /dev/shm, disk and mount checks (cluster.fit).
        return dry_run([a for a in argv if a != "--dry-run"],
                       prog="python -m cluster.job --dry-run")
    parser = argparse.ArgumentParser(prog="python -m cluster.job", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file (configs/*.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from run.dir's "
                        "latest checkpoint")
    parser.add_argument("--run-dir", default="", help="run.dir")
    parser.add_argument("--dry-run", action="store_true", help="start nothing: check that "
                        "the config fits the cluster (python -m cluster.fit --help)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.resume:
        overrides.append("run.resume=true")
    if args.run_dir:
        overrides.append(f"run.dir={args.run_dir}")
    try:
        config = load_config(JobConfig, args.config, overrides)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    handle_stop_signals()
    try:
        summary = run(config)
    except KeyboardInterrupt:
        progress("interrupted: stopped everything; the latest checkpoint is in "
                 f"{config.run.dir} (--resume continues)")
        return stop_exit_code()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a component failed mid-run: say what, and how on
        log.error("the job failed", exc_info=True)
        print(f"error: {describe_failure(exc, LAST_PSS)}. Everything was stopped; the latest "
              "checkpoint "
              f"is in {config.run.dir} (--resume continues from it)", file=sys.stderr)
        return 1
    if "error" in summary:
        print(f"error: {explain_no_experience(summary)}", file=sys.stderr)
    ok = _healthy(summary, config)
    if summary.get("train_curve"):
        progress("train success by policy version: " + ", ".join(
            f"v{c['version']} {c['success']:.2f} ({c['episodes']})"
            for c in summary["train_curve"]))
    progress(("done" if ok else "done with problems") + f" in {summary['wall_s']} s; "
             f"summary in {config.run.dir}/summary.json")
    return 0 if ok else 1


def _healthy(summary: dict[str, Any], config: JobConfig) -> bool:
    rollout = summary.get("rollout", {})
    return (summary.get("completed", False)
            and summary.get("pending_entries", 1) == 0
            and summary.get("leases_held", 1) == 0
            and set(summary.get("replica_versions", [])) == {summary.get("version")}
            and rollout.get("leaked_resources", 1) == 0
            and "drain_error" not in summary)


if __name__ == "__main__":
    sys.exit(main())
