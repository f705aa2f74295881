"""The training job: ``python -m trainer.main --config configs/<name>.yaml [key=value ...]``.

On one machine it starts what is missing (an embedded Ray cluster, Redis on the stream URL's
port, the local cloud on the configured endpoint); under ``ray job submit --address
http://HEAD:8265 --working-dir . -- python -m trainer.main --config ...`` it joins the cluster
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
import json
import logging
import os
import signal
import sys
import threading
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

from consolerl.config import load_config, to_dict
from consolerl.errors import ConfigError

from .config import JobConfig

log = logging.getLogger("trainer.main")


def _progress(msg: str) -> None:
    print(f"[console-rl] {msg}", file=sys.stderr, flush=True)


class _Services:
    """Redis and the local cloud, started here when nothing answers at the configured
    addresses."""

    def __init__(self, config: JobConfig, run_dir: Path):
        self.config, self.run_dir = config, run_dir
        self.redis: Any = None
        self.cloud: Any = None

    def start(self) -> None:
        import redis as redis_lib

        from infra.local_cloud import LocalCloud
        from infra.redis_local import RedisServer

        url = urllib.parse.urlparse(self.config.stream.url)
        try:
            redis_lib.Redis.from_url(self.config.stream.url, socket_timeout=2).ping()
        except redis_lib.ConnectionError:
            if not self.config.run.redis or url.hostname not in ("127.0.0.1", "localhost"):
                raise ConfigError(f"stream.url: no Redis answers at {self.config.stream.url} "
                                  "(run.redis=true starts one on a loopback URL)") from None
            self.redis = RedisServer(self.run_dir / "redis", port=url.port or 6390).start()
            _progress(f"started Redis on {self.redis.url}")
        if self.config.cloud.local:
            host, _, port = self.config.cloud.endpoint.rpartition(":")
            if not _answers(f"http://{self.config.cloud.endpoint}/healthz"):
                if host not in ("127.0.0.1", "localhost"):
                    raise ConfigError(f"cloud.endpoint: {self.config.cloud.endpoint} does not "
                                      "answer and is not a loopback address")
                self.cloud = LocalCloud(self.run_dir / "cloud", port=int(port)).start()
                _progress(f"started the local cloud on {self.cloud.endpoint}")

    def stop(self) -> None:
        if self.cloud is not None:
            self.cloud.stop()
        if self.redis is not None:
            self.redis.stop()


def _answers(url: str) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _ray_init(config: JobConfig) -> None:
    """Join the configured or ``RAY_ADDRESS`` cluster, else start an embedded one (which
    ``ray.shutdown()`` stops again; an external one it only disconnects from). ``ray.init``
    replaces the SIGTERM handler (and its core worker then aborts on the signal, skipping every
    ``finally``): ours goes back, so SIGTERM stops everything the way Ctrl-C does."""
    import ray
    address = config.run.ray_address or os.environ.get("RAY_ADDRESS", "")
    kwargs: dict[str, Any] = {"log_to_driver": False}
    if address:
        kwargs["address"] = address
    else:
        kwargs["include_dashboard"] = False
        if config.run.ray_num_cpus:
            kwargs["num_cpus"] = config.run.ray_num_cpus
    ray.init(**kwargs)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


class _PeakMemory:
    """Peak memory of this process and everything it started (an embedded Ray cluster's
    actors, vLLM, Chromium, Redis, the local cloud), sampled every 2 s as the sum of
    proportional set sizes (PSS: shared pages such as the object store counted once)."""

    def __init__(self) -> None:
        import threading
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")
        self._thread.start()

    def _run(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.wait(2.0):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_full_info().pss
                except (psutil.Error, AttributeError):
                    pass
            self.peak = max(self.peak, total)

    def stop(self) -> float:
        self._stop.set()
        return round(self.peak / 2**30, 2)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(config: JobConfig) -> dict[str, Any]:
    """The whole job; returns the summary (also written to ``summary.json``)."""
    import ray

    from rollout_service.experience import ExperienceStream
    from rollout_service.models import HFChatTokenizer, resolve_model
    from rollout_service.service import OrchestratorActor, start_policy

    from .engine import start_workers
    from .grpo import GRPOTrainer, NoExperienceError

    if config.orchestrator.mode == "sync" and config.trainer.publish_every != 1:
        raise ConfigError("orchestrator.mode=sync needs trainer.publish_every=1 (its batch "
                          "barrier waits for each step's version)")
    run_dir = Path(config.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not Path(config.trainer.checkpoint.dir).is_absolute():
        config = replace(config, trainer=replace(config.trainer, checkpoint=replace(
            config.trainer.checkpoint, dir=str(run_dir / config.trainer.checkpoint.dir))))
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    if not config.run.resume:
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    t_start = time.monotonic()
    memory = _PeakMemory()
    services = _Services(config, run_dir)
    orchestrator = run_ref = None
    servers: list[Any] = []
    workers: list[Any] = []
    summary: dict[str, Any] = {"run_dir": str(run_dir), "completed": False}
    trainer: GRPOTrainer | None = None
    try:
        services.start()
        _ray_init(config)
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
        _progress(f"GRPO: {config.trainer.steps} steps of {config.orchestrator.groups_per_step} "
                  f"groups x {config.orchestrator.group_size}; {config.env.workers} env workers; "
                  f"policy {config.policy.backend} x{config.policy.replicas}; "
                  f"{config.trainer.engine.workers} trainer worker(s)")
        servers, _router = start_policy(replace(config.policy, model=model_path))
        workers = start_workers(model_path, config.trainer.engine, config.trainer.algo)
        pad = HFChatTokenizer(model_path).tokenizer.pad_token_id
        trainer = GRPOTrainer(config.trainer, config.stream, config.orchestrator.groups_per_step,
                              workers, lambda v, ref: ray.get(
                                  [s.update_weights.remote(v, ref) for s in servers]),
                              pad if pad is not None else 0, run_dir)
        if config.run.metrics_port:
            from prometheus_client import start_http_server
            start_http_server(config.run.metrics_port, registry=trainer.registry)
            _progress(f"trainer metrics on :{config.run.metrics_port}/metrics")
        if config.run.resume and trainer.restore():
            _progress(f"resumed at step {trainer.step} (version {trainer.version})")
        trainer.start()                 # the trainer version before the orchestrator reads it
        orchestrator = OrchestratorActor.options(num_cpus=0).remote(config, None, servers)
        run_ref = orchestrator.run.remote(None)
        budget = config.trainer.time_budget_s
        summary["history"] = trainer.run(config.trainer.steps, _step_printer(config, trainer),
                                         deadline=t_start + budget if budget else None)
        summary["stopped_by"] = trainer.stopped_by
        summary["final_model"] = _save_final(workers[0], model_path, run_dir / "final")
        _progress(f"final model: {summary['final_model']}")
        summary["completed"] = True
    except NoExperienceError as exc:
        # Not a crash: the rollouts gave nothing to train on. Everything is stopped below and
        # main() explains from the rollout counts why.
        summary["error"] = str(exc)
    finally:
        if orchestrator is not None:
            summary.update(_stop_rollouts(orchestrator, run_ref))
        if trainer is not None:
            summary.update(_final_checks(trainer, servers, config.env.lease_prefix))
        stop_actors(workers + servers)
        if ray.is_initialized():
            ray.shutdown()       # stops an embedded cluster; disconnects from an external one
        services.stop()
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        summary["peak_memory_gib"] = memory.stop()
        _write_summary(run_dir, summary)
    return summary


def stop_actors(actors: list[Any], timeout_s: float = 60) -> None:
    """Ask each actor to ``shutdown()`` (its child processes, process groups), then kill it."""
    import ray
    for actor in actors:
        try:
            ray.get(actor.shutdown.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        ray.kill(actor)


def _save_final(rank0: Any, model_path: str, folder: Path) -> str:
    """The trained weights as a model folder (config, weights, tokenizer) that the policy,
    ``trainer.evaluate`` and Hugging Face load; written beside, then swapped in."""
    import shutil

    import ray
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
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_sft_child, config, str(run_dir), start_model).result()


def _sft_child(config: JobConfig, run_dir: str, start_model: str) -> str:
    from .sft import sft_stage
    return sft_stage(config, Path(run_dir), start_model, progress=_progress)


def _step_printer(config: JobConfig, trainer: Any):
    from tqdm import tqdm
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


def _stop_rollouts(orchestrator: Any, run_ref: Any) -> dict[str, Any]:
    import ray
    out: dict[str, Any] = {}
    try:
        ray.get(orchestrator.stop.remote(), timeout=30)
        out["rollout"] = ray.get(run_ref, timeout=600)
    except Exception as exc:  # noqa: BLE001 - still drain below
        out["rollout_error"] = f"{type(exc).__name__}: {exc}"[:500]
    try:
        ray.get(orchestrator.drain.remote(), timeout=120)
    except Exception as exc:  # noqa: BLE001
        out["drain_error"] = f"{type(exc).__name__}: {exc}"[:500]
    ray.kill(orchestrator)
    return out


def _final_checks(trainer: Any, servers: list[Any], lease_prefix: str) -> dict[str, Any]:
    import ray
    out: dict[str, Any] = {"steps": trainer.step, "version": trainer.version,
                           "weight_sync_s": trainer.sync_times}
    try:
        out["replica_versions"] = ray.get([s.version.remote() for s in servers], timeout=60)
    except Exception as exc:  # noqa: BLE001
        out["replica_versions_error"] = str(exc)[:300]
    try:
        out["pending_entries"] = trainer.consumer.pending()
        out["leases_held"] = sum(1 for _ in trainer.stream.redis.scan_iter(
            f"{lease_prefix}:lease:*"))
    except Exception as exc:  # noqa: BLE001
        out["pending_error"] = str(exc)[:300]
    return out


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    try:
        from .curves import plot_curves
        plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    except Exception as exc:  # noqa: BLE001 - a missing plot never fails the run
        log.warning("no curves: %s", exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.main", description=__doc__.split(
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
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        summary = run(config)
    except KeyboardInterrupt:
        _progress("interrupted: stopped everything; the latest checkpoint is in "
                  f"{config.run.dir} (--resume continues)")
        return 130
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "error" in summary:
        print(f"error: {explain_no_experience(summary)}", file=sys.stderr)
    ok = _healthy(summary, config)
    _progress(("done" if ok else "done with problems") + f" in {summary['wall_s']} s; "
              f"summary in {config.run.dir}/summary.json")
    return 0 if ok else 1


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
