"""The training job: ``python -m cluster.job --config configs/<name>.yaml [key=value ...]``
(``python -m trainer.main`` forwards here, so older ``ray job submit`` commands still work).

On one machine it starts what is missing (an embedded Ray cluster, Redis on the stream URL's
port, the local cloud on the configured endpoint); under ``ray job submit --address
http://HEAD:8265 --working-dir . -- python -m cluster.job --config ...`` it joins the cluster
(``RAY_ADDRESS``) and uses whatever external Redis and cloud the config names.

Stages: (1) SFT on oracle trajectories when ``sft.enabled`` (exported first unless
``sft.data`` names a JSONL file); (2) GRPO: PolicyServers and trainer workers start from the
SFT output (or ``trainer.model`` / ``policy.model``), the orchestrator fills the experience
stream asynchronously and the trainer consumes it (:class:`trainer.grpo.GRPOTrainer`) for
``trainer.steps`` steps. At the end, or on Ctrl-C / SIGTERM, everything is stopped: the
orchestrator finishes its episodes and cleans up their resources, accounts are released,
actors and embedded services are stopped.

The run folder (``run.dir``) gets ``config.json``, ``metrics.jsonl`` (one line per SFT or
GRPO step), ``checkpoints/``, ``summary.json`` and ``curves.png``. ``--resume`` continues from
the latest checkpoint there.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import multiprocessing
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from cluster.builders import rollout_parts
from cluster.config import JobConfig, check_training, metrics_publish
from cluster.export import ExportConfig, run_export
from cluster.rollout import RolloutActor, start_policy, success_by_version
from cluster.runtime import (LocalServices, Observed, PeakMemory, TrainingBeacon, progress,
                             on_driver_node, raise_interrupt, ray_init, stop_actors)
from consolerl.config import load_config, to_dict
from consolerl.errors import ConfigError, ConsoleRLError
from rollout_service.experience import ExperienceStream
from rollout_service.models import HFChatTokenizer, resolve_model
from trainer.curves import plot_curves
from trainer.engine import start_workers
from trainer.grpo import GRPOTrainer, NoExperienceError
from trainer.sft import SftConfig, train_sft
from trainer.stream import redact_url

log = logging.getLogger("cluster.job")
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
    services = LocalServices(config, run_dir)
    orchestrator = run_ref = beacon = None
    servers: list[Any] = []
    workers: list[Any] = []
    summary: dict[str, Any] = {"run_dir": str(run_dir), "completed": False}
    trainer: GRPOTrainer | None = None
    observed = Observed(None)
    try:
        ray_init(config.run)
        config = services.start()      # the addresses every Ray node reaches
        observed = Observed(metrics_publish(config))
        observed.local_cloud(config.cloud)
        summary["services"] = {"redis": redact_url(config.stream.url),
                               "cloud": config.cloud.endpoint}
        stream = ExperienceStream(config.stream)
        if not config.run.resume:
            # A fresh run starts from an empty stream: groups of an earlier run were sampled
            # by other weights.
            stream.redis.delete(config.stream.stream, stream.version_key,
                                config.stream.stream + config.trainer.consumer.dead_letter_suffix)
        start_model = config.trainer.model or config.policy.model
        if config.sft.enabled:
            start_model = _sft_stage(config, run_dir, start_model)
        model_path = resolve_model(start_model)
        summary["start_model"] = model_path
        progress(f"GRPO: {config.trainer.steps} steps of {config.orchestrator.groups_per_step} "
                 f"groups x {config.orchestrator.group_size}; {config.env.workers} env workers; "
                 f"policy {config.policy.backend} x{config.policy.replicas}; "
                 f"{config.trainer.engine.workers} trainer worker(s)")
        servers, _router = start_policy(replace(config.policy, model=model_path), observed.config)
        workers = start_workers(model_path, config.trainer.engine, config.trainer.algo)
        pad = HFChatTokenizer(model_path).tokenizer.pad_token_id
        trainer = GRPOTrainer(config.trainer, config.stream, config.orchestrator.groups_per_step,
                              workers, lambda v, ref: publish_weights(servers, v, ref),
                              pad if pad is not None else 0, run_dir)
        if config.trainer.pause_generation:
            trainer.around_step = lambda: generation_paused(servers, config.trainer.read_timeout_s)
        sync = ReplicaSync(trainer, servers)
        trainer.while_waiting = lambda: (sync(), _check_rollouts(run_ref))
        url = observed.publish([trainer.registry], "trainer", "trainer")
        if url:
            progress(f"metrics announced for Prometheus as run={observed.config.run} "
                     f"(trainer: {url}; make observe scrapes them)")
        if config.run.resume and trainer.restore():
            progress(f"resumed at step {trainer.step} (version {trainer.version})")
        trainer.start()                 # the trainer version before the orchestrator reads it
        # API jobs on the same cluster keep to their share of the pool while this runs.
        beacon = TrainingBeacon(config.stream.url, f"{config.api.prefix}:training").start()
        # On the driver's node: losing a worker node never takes the control plane with it.
        orchestrator = RolloutActor.options(num_cpus=0, scheduling_strategy=on_driver_node()
                                            ).remote(rollout_parts(config), servers)
        run_ref = orchestrator.run.remote(None)
        budget = config.trainer.time_budget_s
        summary["history"] = trainer.run(config.trainer.steps, _step_printer(config, trainer),
                                         deadline=t_start + budget if budget else None)
        summary["stopped_by"] = trainer.stopped_by
        summary["final_model"] = _save_final(workers[0], model_path, run_dir / "final")
        progress(f"final model: {summary['final_model']}")
        summary["completed"] = True
    except NoExperienceError as exc:
        # Not a crash: the rollouts gave nothing to train on. Everything is stopped below and
        # main() explains from the rollout counts why.
        summary["error"] = str(exc)
    finally:
        if beacon is not None:
            beacon.stop()
        if orchestrator is not None:
            summary.update(_stop_rollouts(orchestrator, run_ref, config.env.lease_ttl_s))
        if trainer is not None:
            summary.update(_final_checks(trainer, servers, config.env.lease_prefix,
                                         config.env.lease_ttl_s))
        stop_actors(workers + servers)
        observed.close()
        if ray.is_initialized():
            ray.shutdown()       # stops an embedded cluster; disconnects from an external one
        services.stop()
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        summary["peak_memory_gib"] = memory.stop()
        summary["peak_memory_by_process_gib"] = memory.breakdown_gib()
        _write_summary(run_dir, summary)
    return summary


def _save_final(rank0: Any, model_path: str, folder: Path) -> str:
    """The trained weights as a model folder (config, weights, tokenizer) that the policy,
    ``cluster.evaluate`` and Hugging Face load; written beside, then swapped in."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ray.get(rank0.save_pretrained.remote(str(tmp)))
    for f in Path(model_path).iterdir():
        if f.is_file() and (f.name.startswith("tokenizer") or f.name in (
                "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt")):
            shutil.copy2(f, tmp / f.name)
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
        data = str(Path(run_dir) / "sft-data.jsonl")
        exported = asyncio.run(run_export(ExportConfig(
            out=data, split="train", tasks=sft.tasks, episodes_per_task=sft.episodes_per_task,
            workers=config.env.workers, agent=config.agent, model=start_model,
            cloud_endpoint=config.cloud.endpoint, console_url=config.env.worker.console_url,
            redis_url=config.stream.url, accounts_file=config.cloud.accounts_file,
            lease_prefix=config.env.lease_prefix)))
        progress(f"SFT: exported {exported['written']} oracle trajectories "
                 f"({exported['turns']} turns) in {exported['wall_s']} s")
    summary = train_sft(SftConfig(data=data, out=str(out), model=start_model,
                                  epochs=sft.epochs, lr=sft.lr,
                                  max_tokens_per_batch=sft.max_tokens_per_batch,
                                  micro_batch_tokens=sft.micro_batch_tokens,
                                  gradient_checkpointing=sft.gradient_checkpointing,
                                  train_layers=sft.train_layers))
    with (Path(run_dir) / "metrics.jsonl").open("a", encoding="utf-8") as f:
        for line in (out / "metrics.jsonl").read_text().splitlines():
            f.write(json.dumps({"stage": "sft", **json.loads(line)}) + "\n")
    progress(f"SFT: {summary['steps']} steps, loss {summary['first_loss']:.4f} -> "
             f"{summary['last_loss']:.4f}, {summary['wall_s']} s")
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


@contextlib.contextmanager
def generation_paused(servers: list[Any], max_s: float) -> Iterator[None]:
    """The policy replicas hold new requests while the block runs (a trainer step on the cores
    they share); a replica that is down is skipped, and each pause lifts itself after
    ``max_s`` should the trainer die inside the block."""
    paused = []
    for s in servers:
        try:
            ray.get(s.pause.remote(max_s), timeout=30)
            paused.append(s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError):
            pass
    try:
        yield
    finally:
        for s in paused:
            try:
                ray.get(s.resume.remote(), timeout=30)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError):
                pass


def publish_weights(servers: list[Any], version: int, state_ref: Any) -> list[float]:
    """``version``'s weights to every policy replica. A replica that is down (crashed,
    being restarted by Ray) is skipped: :class:`ReplicaSync` brings it up to date when it
    is back. Fails only when no replica took the weights."""
    refs = [s.update_weights.remote(version, state_ref) for s in servers]
    times, failed = [], []
    for i, ref in enumerate(refs):
        try:
            times.append(ray.get(ref, timeout=600))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.GetTimeoutError) as exc:
            failed.append(f"policy-{i}: {type(exc).__name__}")
    if failed:
        log.warning("weights v%d not delivered to %s; sent again when they are back",
                    version, ", ".join(failed))
    if not times:
        raise RuntimeError(f"no policy replica took the weights of version {version}: "
                           f"{', '.join(failed)}")
    return times


class ReplicaSync:
    """Every ``interval_s`` while the trainer waits for experience: a policy replica whose
    version differs from the trainer's (restarted by Ray after a crash: it reports -1 and
    refuses to generate until then) gets the current weights from rank 0."""

    def __init__(self, trainer: Any, servers: list[Any], interval_s: float = 2.0):
        self.trainer, self.servers, self.interval_s = trainer, servers, interval_s
        self.last = 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last < self.interval_s:
            return
        self.last = time.monotonic()
        version = self.trainer.version
        for i, server in enumerate(self.servers):
            try:
                served = ray.get(server.version.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError):
                continue                              # still restarting: next time
            if served == version:
                continue
            try:
                ray.get(server.update_weights.remote(
                    version, self.trainer.workers[0].published_state.remote()), timeout=600)
                progress(f"policy-{i} was restarted: sent it the weights of version {version}")
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError) as exc:
                log.warning("policy-%d: weights not delivered: %s", i, type(exc).__name__)


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


def _stop_rollouts(orchestrator: Any, run_ref: Any, lease_ttl_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        ray.get(orchestrator.stop.remote(), timeout=30)
        out["rollout"] = ray.get(run_ref, timeout=600)
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["rollout_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        out["train_curve"] = success_by_version(ray.get(orchestrator.results.remote(),
                                                        timeout=120))
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["train_curve_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        # What dead holders (this run's, or a killed run's before a --resume) left behind.
        out["orphans_cleaned"] = ray.get(orchestrator.sweep.remote(lease_ttl_s + 15),
                                         timeout=lease_ttl_s + 120)
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["sweep_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        ray.get(orchestrator.drain.remote(), timeout=120)
    except Exception as exc:  # noqa: BLE001
        out["drain_error"] = f"{type(exc).__name__}: {exc}"[:500]
    ray.kill(orchestrator)
    return out


def _final_checks(trainer: Any, servers: list[Any], lease_prefix: str, lease_ttl_s: float
                  ) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": trainer.step, "version": trainer.version,
                           "weight_sync_s": trainer.sync_times}
    try:
        out["replica_versions"] = ray.get([s.version.remote() for s in servers], timeout=60)
    except Exception as exc:  # noqa: BLE001
        out["replica_versions_error"] = str(exc)[:300]
    try:
        out["pending_entries"] = trainer.consumer.pending()
        out["leases_held"] = _leases_left(trainer.stream.redis, lease_prefix, lease_ttl_s)
    except Exception as exc:  # noqa: BLE001
        out["pending_error"] = str(exc)[:300]
    return out


def _leases_left(redis: Any, prefix: str, ttl_s: float) -> int:
    """Leases still held once the rollouts stopped. A worker that died mid-episode (its
    process killed, its node lost) leaves its lease to expire on its own: wait out the TTL
    for those; one that outlives it is a leak."""
    deadline = time.monotonic() + ttl_s + 5
    said = False
    while True:
        held = sum(1 for _ in redis.scan_iter(f"{prefix}:lease:*"))
        if not held or time.monotonic() > deadline:
            return held
        if not said:
            progress(f"waiting for {held} lease(s) of a lost env worker to expire "
                     f"(env.lease_ttl_s={ttl_s:g})")
            said = True
        time.sleep(min(1.0, ttl_s))


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    try:
        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    except Exception as exc:  # noqa: BLE001 - a missing plot never fails the run
        log.warning("no curves: %s", exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.job", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file (configs/*.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from run.dir's "
                        "latest checkpoint")
    parser.add_argument("--run-dir", default="", help="run.dir")
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
    signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        summary = run(config)
    except KeyboardInterrupt:
        progress("interrupted: stopped everything; the latest checkpoint is in "
                 f"{config.run.dir} (--resume continues)")
        return 130
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


# What to change when Ray's memory monitor kills an actor of the job, by the actor's class.
_MEMORY_SETTINGS = {
    "TrainerWorker": "lower trainer.engine.micro_batch_tokens or set "
                     "trainer.engine.gradient_checkpointing: true (or LoRA: "
                     "trainer.engine.lora.rank), and reserve it with trainer.engine.memory_gib",
    "PolicyServer": "lower policy.kv_cache_gib or policy.max_model_len",
    "EnvWorker": "run fewer browsers per node (env.workers)",
    "RolloutBody": "lower orchestrator.group_size or orchestrator.groups_per_step",
}


def describe_oom(exc: BaseException, last_pss: dict[int, tuple[str, int]] | None = None
                 ) -> str | None:
    """The line for an actor that Ray's memory monitor killed (None when ``exc`` is not
    that): which actor, how much it used (from Ray's message, else from ``last_pss``, the
    job's own last sample per pid), and which setting to change."""
    text = str(exc)
    if not (isinstance(exc, ray.exceptions.OutOfMemoryError) or any(
            s in text for s in ("low on memory", "memory usage threshold",
                                "killed due to memory pressure", "OutOfMemoryError"))):
        return None
    name = _first(text, r"class_name: (\w+)", r"name=(\w+)", r"task name=(\w+)") or "an actor"
    pid = _first(text, r"pid[=:] ?(\d+)")
    used = _first(text, r"memory used=([\d.]+) ?GB")
    if used is None and pid and last_pss and int(pid) in last_pss:
        used = f"{last_pss[int(pid)][1] / 2**30:.1f}"
    node = re.search(r"was ([\d.]+) ?GB(?: used)? / ([\d.]+) ?GB", text)
    setting = next((v for k, v in _MEMORY_SETTINGS.items() if name.startswith(k)),
                   "give the node more memory or run fewer actors on it")
    return (f"Ray's memory monitor killed {name}" + (f" (pid {pid})" if pid else "")
            + (f" at {used} GB" if used else "")
            + (f" with the node at {node.group(1)} of {node.group(2)} GB" if node else "")
            + f": {setting}")


def _first(text: str, *patterns: str) -> str | None:
    for pattern in patterns:
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return None


def describe_failure(exc: BaseException, last_pss: dict[int, tuple[str, int]] | None = None
                     ) -> str:
    """One line on why the run stopped (the original error inside a Ray task error)."""
    oom = describe_oom(exc, last_pss)
    if oom is not None:
        return oom
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, OSError) and cause.errno == errno.ENOSPC or \
            "No space left on device" in str(cause):        # safetensors, torch.save say so
        where = f" writing {cause.filename}" if getattr(cause, "filename", None) else ""
        return (f"no space left on the device{where}: free some space where checkpoints go "
                "(trainer.checkpoint.dir)")
    if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        return f"an actor of the run died: {str(exc).splitlines()[0][:300]}"
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return f"{type(cause).__name__}: {first}"


def explain_no_experience(summary: dict[str, Any]) -> str:
    """The summary's error, with what the rollouts did meanwhile (why nothing was pushed)."""
    text = summary["error"]
    r = summary.get("rollout")
    if not r:
        return text
    finished = r["groups_pushed"] + r["groups_dropped_uniform"] + r["groups_abandoned"]
    text += (f"; the rollouts ran {r['episodes']} episodes ({r['env_errors']} env errors) and "
             f"finished {finished} groups: {r['groups_pushed']} pushed, "
             f"{r['groups_dropped_uniform']} dropped as uniform, {r['groups_abandoned']} "
             "abandoned")
    if r["groups_dropped_uniform"] and not r["groups_pushed"]:
        text += (". Uniform groups (every episode the same reward: the policy solves all of "
                 "them or none) carry no GRPO signal and orchestrator.drop_uniform_groups drops "
                 "them; start from a model that succeeds on some episodes of the train tasks, "
                 "choose other tasks, or use larger groups")
    elif r["groups_abandoned"] and not r["groups_pushed"]:
        text += (". Groups are abandoned when env errors exceed orchestrator.max_env_retries: "
                 "see the env workers' errors")
    elif not finished:
        text += ". No group finished in time: raise trainer.read_timeout_s or add env workers"
    return text


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
