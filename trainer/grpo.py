"""The GRPO trainer's control loop: groups from the experience stream, one optimizer step on
the data-parallel workers, weights to the PolicyServers, a checkpoint, then the acknowledgement.

Per step ``v -> v+1``:

1. read ``groups_per_step`` groups through the consumer group (``XREADGROUP``); a group whose
   id a checkpoint already holds as trained (a crash between checkpoint and ``XACK``) is
   acknowledged and skipped, so nothing is trained twice;
2. build the batch (one row per turn, advantages from verl's estimator, plus step-level ones
   with ``algo.step_advantage_weight``), shard it over the workers, one step each (DDP
   averages the gradients);
3. every ``publish_every`` steps: the weights of rank 0 go to every PolicyServer
   (:class:`trainer.weight_sync.WeightPublisher`: streamed over a process group, or through
   the Ray object store), then the trainer version in Redis moves to ``v+1``: the
   orchestrator's staleness control reads it;
4. every ``checkpoint.every_steps`` steps (and at the end): model, optimizer, version, trained
   group ids and unacknowledged entry ids are written atomically; only then the entries
   trained since the previous checkpoint are acknowledged (``XACK``). A crash anywhere
   re-delivers exactly the entries not covered by the latest checkpoint.
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ContextManager

import ray
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consolerl.errors import ConfigError, ConsoleRLError
from rollout_service.experience import ExperienceStream, StreamConfig
from consolerl.experience import Group
from consolerl.rewards import is_success

from .algo import TrainBatch, build_batch, group_step_advantages
from .checkpoint import CheckpointManager
from .config import TrainerConfig
from .engine import call_for_rank0
from .stream import Delivery, ExperienceConsumer

log = logging.getLogger(__name__)


class NoExperienceError(ConsoleRLError, TimeoutError):
    """The stream gave no trainable group within ``trainer.read_timeout_s``."""


PHASES = ("read", "forward_backward", "optimizer", "publish", "checkpoint")


class TrainerMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.steps = Counter("consolerl_trainer_steps_total", "Optimizer steps.", registry=r)
        self.step_s = Histogram("consolerl_trainer_step_seconds", "Time per optimizer step "
                                "(all workers).", registry=r,
                                buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
        self.sync_s = Histogram("consolerl_trainer_weight_sync_seconds", "Time to publish "
                                "weights to every PolicyServer.", registry=r,
                                buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.ckpt_s = Histogram("consolerl_trainer_checkpoint_seconds", "Time to write a "
                                "checkpoint.", registry=r,
                                buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.version = Gauge("consolerl_trainer_version", "Weight version published.",
                             registry=r)
        self.reward = Gauge("consolerl_trainer_reward_mean", "Mean reward of the last step's "
                            "samples.", registry=r)
        self.success = Gauge("consolerl_trainer_success_rate", "Share of the last step's "
                             "samples with reward >= 1.", registry=r)
        self.loss = Gauge("consolerl_trainer_loss", "Policy loss of the last step.",
                          registry=r)
        self.tokens = Counter("consolerl_trainer_tokens_total", "Response tokens trained.",
                              registry=r)
        self.staleness = Histogram("consolerl_trainer_sample_staleness", "Trainer version "
                                   "minus the version that sampled a turn.", registry=r,
                                   buckets=(0, 1, 2, 3, 4, 8, 16))
        self.skipped = Counter("consolerl_trainer_groups_skipped_total", "Groups delivered "
                               "again after a crash and already trained.", registry=r)
        self.phase_s = Histogram("consolerl_trainer_phase_seconds", "Time of each part of a "
                                 "step: read (waiting for experience), forward_backward, "
                                 "optimizer (clip and step; slowest rank), publish (weights to "
                                 "the PolicyServers), checkpoint.", ["phase"], registry=r,
                                 buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                                          900))
        for phase in PHASES:
            self.phase_s.labels(phase)
        self.kl = Gauge("consolerl_trainer_kl", "Approximate KL between the sampler's policy "
                        "and the trainer's before the step, on the last step's tokens "
                        "(rollout_kl: mean of rollout minus recomputed log-probs; staleness "
                        "and numerics).", registry=r)
        self.clip_fraction = Gauge("consolerl_trainer_clip_fraction", "Share of the last "
                                   "step's tokens whose PPO ratio was clipped. With one update "
                                   "per step the ratio is exactly 1, so this reads 0 by "
                                   "construction: the step's size is set by the learning rate "
                                   "and gradient clipping, not by PPO's clip.", registry=r)
        self.rows_skipped = Counter("consolerl_trainer_rows_skipped_total", "Rows (turns) "
                                    "whose advantage was 0, left out of the forward and "
                                    "backward (skip_zero_advantage).", registry=r)
        self.grad_norm = Gauge("consolerl_trainer_grad_norm", "Gradient norm of the last step "
                               "(before clipping).", registry=r)
        self.last_step = Gauge("consolerl_trainer_last_step_timestamp_seconds", "Unix time of "
                               "the last optimizer step (0 before the first).", registry=r)
        self.step_groups = Counter("consolerl_trainer_step_groups_total", "Step groups formed "
                                   "(two or more turns of one group taken from the same page "
                                   "state; trainer.algo.step_advantage_weight > 0).",
                                   registry=r)
        self.step_group_size = Histogram("consolerl_trainer_step_group_size", "Turns in each "
                                         "step group formed.", registry=r,
                                         buckets=(2, 3, 4, 6, 8, 12, 16, 32, 64))
        self.step_signal = Gauge("consolerl_trainer_step_signal_ratio", "Share of the last "
                                 "step's turns with a non-zero step-level advantage (0 with "
                                 "step advantages off).", registry=r)


def rows_to_train(batch: TrainBatch, config: TrainerConfig, ranks: int = 1
                  ) -> TrainBatch | None:
    """The rows the workers run: with ``skip_zero_advantage`` (and no KL term, which every row
    feeds) only rows with a non-zero advantage, topped up to one row per rank; None when no
    row has one (no forward, no backward, no optimizer step: the weights stay)."""
    if not config.skip_zero_advantage or config.algo.kl_coef > 0:
        return batch
    rows = batch.signal_rows()
    if not rows:
        return None
    if len(rows) == batch.num_rows:
        return batch
    if len(rows) < ranks:
        rows += [i for i in range(batch.num_rows) if i not in rows][:ranks - len(rows)]
    return batch.rows(sorted(rows))


class GRPOTrainer:
    """``workers``: trainer worker actors (rank 0 first); ``publish``: called with the
    version to load the workers' weights on every PolicyServer
    (:class:`trainer.weight_sync.WeightPublisher`; None: no servers)."""

    def __init__(self, config: TrainerConfig, stream_config: StreamConfig, groups_per_step: int,
                 workers: Sequence[Any], publish: Callable[[int], Any] | None,
                 pad_token_id: int, run_dir: str | Path,
                 registry: CollectorRegistry | None = None):
        if groups_per_step < 1:
            raise ConfigError("GRPOTrainer: groups_per_step must be >= 1")
        self.config = config
        self.groups_per_step = groups_per_step
        self.workers = list(workers)
        self.publish_fn = publish
        self.pad_token_id = pad_token_id
        self.run_dir = Path(run_dir)
        self.registry = registry or CollectorRegistry()
        self.metrics = TrainerMetrics(self.registry)
        self.stream = ExperienceStream(stream_config)
        self.consumer = ExperienceConsumer(stream_config, config.consumer,
                                           registry=self.registry)
        self.checkpoints = CheckpointManager(config.checkpoint)
        self.step = 0
        self.version = 0
        self.trained: set[str] = set()          # group ids trained (since the last restore)
        self.unacked: list[str] = []            # entry ids trained, not yet acknowledged
        self.history: list[dict[str, Any]] = []
        self.sync_times: list[float] = []
        # Called between reads while the trainer waits for experience (the job brings
        # restarted policy replicas up to the current weights there).
        self.while_waiting: Callable[[], None] | None = None
        # Entered around each forward/backward (the job pauses generation there when the
        # policy shares the trainer's cores).
        self.around_step: Callable[[], ContextManager[Any]] | None = None
        self._warned_no_states = False

    # -- start / resume ----------------------------------------------------------------------

    def restore(self) -> bool:
        """Continue from the latest checkpoint; returns whether there was one."""
        path = self.checkpoints.latest_path()
        if path is None:
            return False
        meta = self.checkpoints.read_state(path)
        state = meta["trainer_state"]
        # Every rank loads the files itself (a shared folder on a cluster).
        ray.get([w.load_checkpoint.remote(self.config.checkpoint, str(path))
                 for w in self.workers])
        self.step, self.version = int(meta["step"]), int(meta["version"])
        self._truncate_jsonl(self.step)          # steps after the checkpoint run again
        self.trained = set(state.get("trained_groups", []))
        # Entries trained and checkpointed but not acknowledged before the crash.
        pending = list(state.get("unacked", []))
        if pending:
            self.consumer.ack(pending)
        log.info("resumed at step %d, version %d (%d groups trained)", self.step,
                 self.version, len(self.trained))
        return True

    def start(self) -> None:
        self.consumer.ensure_group()
        self.publish(self.version)

    # -- the loop ------------------------------------------------------------------------------

    def collect(self, deadline: float, budget: float | None = None) -> list[Delivery]:
        """``groups_per_step`` groups from the stream (groups already trained are acknowledged
        and skipped). Waiting past ``deadline`` is an error; past ``budget`` (the job's time
        budget) it returns what it has: nothing (the run stops) or fewer groups (one smaller
        step, so that no group read is left pending)."""
        out: list[Delivery] = []
        while len(out) < self.groups_per_step:
            if budget is not None and time.monotonic() > budget:
                return out
            if time.monotonic() > deadline:
                raise NoExperienceError(f"the experience stream gave {len(out)} of "
                                        f"{self.groups_per_step} groups within "
                                        f"{self.config.read_timeout_s:g} s "
                                        "(trainer.read_timeout_s)")
            if self.while_waiting is not None:
                self.while_waiting()
            for d in self.consumer.read(self.groups_per_step - len(out)):
                # Trained already, or in this step twice (an XADD retried after its reply
                # was lost): acknowledged and skipped.
                if d.group.group_id in self.trained or \
                        any(o.group.group_id == d.group.group_id for o in out):
                    self.consumer.ack([d.entry_id])
                    self.metrics.skipped.inc()
                    continue
                out.append(d)
        return out

    def train_step(self, groups: Sequence[Group]) -> dict[str, Any]:
        steps = group_step_advantages(groups, self.config.algo)
        batch = build_batch(list(groups), self.pad_token_id, self.config.algo, steps)
        tokens, seqs = int(batch.num_tokens()), int(batch.num_seqs())
        trained = self._rows_to_train(batch)
        t0 = time.perf_counter()
        per_rank: list[dict[str, float]] = []
        if trained is not None:
            # The denominators stay the whole batch's: the rows left out add 0 to the loss, so
            # the gradient is exactly that of the whole batch.
            around = self.around_step() if self.around_step is not None \
                else contextlib.nullcontext()
            with around:
                per_rank = ray.get([w.step.remote(s, tokens, seqs) for w, s in
                                    zip(self.workers, trained.split(len(self.workers)))])
        step_s = time.perf_counter() - t0
        rewards = [s.reward for g in groups for s in g.samples]
        out: dict[str, Any] = {
            "step": self.step + 1, "step_s": round(step_s, 3), "groups": len(groups),
            "samples": len(rewards), "rows": int(batch.input_ids_BT.shape[0]),
            "rows_trained": trained.num_rows if trained is not None else 0,
            "tokens": tokens, "reward_mean": sum(rewards) / len(rewards),
            "success_rate": sum(map(is_success, rewards)) / len(rewards),
            "loss": sum(m["loss"] for m in per_rank) / len(per_rank) if per_rank else 0.0,
            "grad_norm": per_rank[0]["grad_norm"] if per_rank else 0.0,
        }
        for key in ("pg_loss", "kl"):                  # shares: mean over ranks
            if per_rank and all(key in m for m in per_rank):
                out[key] = sum(m[key] for m in per_rank) / len(per_rank)
        for key in ("pg_clipfrac", "ppo_kl", "rollout_kl", "is_weight_mean",
                    "is_capped_frac"):
            values = [m[key] * m["tokens"] for m in per_rank if key in m]
            if values:
                out[key] = sum(values) / max(1.0, sum(m["tokens"] for m in per_rank))
        for g in groups:
            for s in g.samples:
                for t in s.turns:
                    self.metrics.staleness.observe(max(0, self.version - t.version))
        out["max_staleness"] = max((self.version - v for g in groups for v in g.versions),
                                   default=0)
        if steps is not None:
            if not self._warned_no_states and any(s.turns and not s.states for g in groups
                                                  for s in g.samples):
                self._warned_no_states = True
                log.warning("trainer.algo.step_advantage_weight is on but samples arrive "
                            "without page states: their turns form no step group (is the "
                            "orchestrator recording states?)")
            sizes = [n for st in steps for n in st.group_sizes]
            turns = sum(st.turns for st in steps)
            out["step_groups"] = len(sizes)
            out["step_group_turns"] = sum(sizes)
            out["step_signal_share"] = sum(st.nonzero for st in steps) / max(1, turns)
            self.metrics.step_groups.inc(len(sizes))
            for n in sizes:
                self.metrics.step_group_size.observe(n)
            self.metrics.step_signal.set(out["step_signal_share"])
        self.metrics.steps.inc()
        self.metrics.step_s.observe(step_s)
        self.metrics.reward.set(out["reward_mean"])
        self.metrics.success.set(out["success_rate"])
        self.metrics.loss.set(out["loss"])
        self.metrics.tokens.inc(tokens)
        self.metrics.grad_norm.set(out["grad_norm"])
        self.metrics.kl.set(out.get("rollout_kl", 0.0))
        self.metrics.rows_skipped.inc(out["rows"] - out["rows_trained"])
        self.metrics.clip_fraction.set(out.get("pg_clipfrac", 0.0))
        self.metrics.last_step.set(time.time())
        for phase, key in (("forward_backward", "fwd_bwd_s"), ("optimizer", "optim_s")):
            if per_rank and all(key in m for m in per_rank):
                self.metrics.phase_s.labels(phase).observe(max(m[key] for m in per_rank))
        return out

    def _rows_to_train(self, batch: TrainBatch) -> TrainBatch | None:
        return rows_to_train(batch, self.config, len(self.workers))

    def publish(self, version: int) -> float:
        """Weights of rank 0 to every PolicyServer as ``version``; then the trainer version
        the orchestrator reads."""
        t0 = time.perf_counter()
        if self.publish_fn is not None and version > 0:
            self.publish_fn(version)
        self.stream.set_trainer_version(version)
        self.metrics.version.set(version)
        seconds = time.perf_counter() - t0
        if version > 0:
            self.metrics.sync_s.observe(seconds)
            self.metrics.phase_s.labels("publish").observe(seconds)
            self.sync_times.append(seconds)
        return seconds

    def checkpoint(self) -> float:
        """Commit the steps so far (the entries they used are acknowledged by :meth:`ack`)."""
        t0 = time.perf_counter()
        rank0, others = call_for_rank0(
            self.workers, self.config.engine, "save_checkpoint", self.config.checkpoint,
            self.step, self.version,
            {"trained_groups": sorted(self.trained), "unacked": list(self.unacked)})
        ray.get([rank0, *others])
        seconds = time.perf_counter() - t0
        self.metrics.ckpt_s.observe(seconds)
        self.metrics.phase_s.labels("checkpoint").observe(seconds)
        return seconds

    def ack(self) -> None:
        if self.unacked:
            self.consumer.ack(self.unacked)        # only after the checkpoint: committed
            self.unacked = []

    def run(self, steps: int, on_step: Callable[[dict[str, Any]], None] | None = None,
            deadline: float | None = None) -> list[dict[str, Any]]:
        """Train until ``steps`` optimizer steps are done in total (a resumed run continues
        its count), or until the next step would end past ``deadline`` (``time.monotonic()``;
        estimated by the last step's duration) or ``deadline`` passes while waiting for
        experience; the last step is always published and checkpointed."""
        self.stopped_by = "steps"
        last_s = 0.0
        published = commit = True
        while self.step < steps:
            if deadline is not None and time.monotonic() + last_s > deadline:
                self.stopped_by = "time_budget"
                log.info("time budget: stopping after step %d", self.step)
                break
            t0 = time.monotonic()
            deliveries = self.collect(time.monotonic() + self.config.read_timeout_s, deadline)
            self.metrics.phase_s.labels("read").observe(time.monotonic() - t0)
            if not deliveries:                   # the budget ran out waiting for experience
                self.stopped_by = "time_budget"
                log.info("time budget: stopping after step %d (no group arrived)", self.step)
                break
            metrics = self.train_step([d.group for d in deliveries])
            self.step += 1
            self.trained.update(d.group.group_id for d in deliveries)
            self.unacked.extend(d.entry_id for d in deliveries)
            metrics["redelivered"] = sum(d.redelivered for d in deliveries)
            metrics["group_ids"] = [d.group.group_id for d in deliveries]
            last = self.step == steps
            published = self.step % self.config.publish_every == 0 or last
            if published:
                self.version += 1
                metrics["weight_sync_s"] = round(self.publish(self.version), 3)
            metrics["version"] = self.version
            commit = self.checkpoints.should_save(self.step) or last
            if commit:
                metrics["checkpoint_s"] = round(self.checkpoint(), 3)
            metrics["time"] = time.time()
            self.history.append(metrics)
            self._append_jsonl(metrics)
            if commit:
                self.ack()
            if on_step is not None:
                on_step(metrics)
            last_s = time.monotonic() - t0
        if self.stopped_by == "time_budget" and self.history:
            # Stopped between publishes or checkpoints: the final weights still reach the
            # PolicyServers and a checkpoint.
            if not published:
                self.version += 1
                self.publish(self.version)
            if not commit:
                self.checkpoint()
                self.ack()
        return self.history

    def _truncate_jsonl(self, step: int) -> None:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and not (json.loads(line).get("stage") == "grpo"
                                         and json.loads(line).get("step", 0) > step)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)

    def _append_jsonl(self, metrics: dict[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"stage": "grpo", **metrics}) + "\n")
