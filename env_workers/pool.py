"""Env workers as Ray actors, and the pool that runs N of them.

``EnvWorkerActor`` wraps one :class:`~env_workers.worker.EnvWorker` and owns the account side of
an episode: it takes a lease from the :class:`~env_workers.leases.AccountPool` (Redis), renews it
from a heartbeat thread in its own process while the episode runs — so when the actor dies the
renewals stop and the account is free again within the lease TTL — signs in with the account
(whose password never leaves the actor's process), and releases the lease at the end.

``EnvPool`` starts ``workers`` actors (Ray restarts a crashed one: ``max_restarts``), reports
their health and drains them: no new episodes, running ones end, leases are released.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import ray
import ray._private.state
from prometheus_client import CollectorRegistry, Gauge, Histogram

from consolerl.accounts import lease_agent
from consolerl.config import AtLeast, Checked, Satisfies, check_resources
from consolerl.experience import Trajectory
from consolerl.types import EnvError, EpisodeSpec, Observation, StepResult
from infra.observability.discovery import PublishConfig, publish

from .accounts import PoolConfig
from .leases import AccountPool, Heartbeat, Lease, NoAccountAvailable, PoolError
from .worker import EnvWorker, WorkerConfig

log = logging.getLogger("env_workers.pool")

# A step that has not answered after this long (Playwright's own timeouts bound a healthy one
# well under it) is a browser that hangs: the episode ends as an env error (the same bound as
# the rollout side's for a step called over Ray).
ACT_STEP_TIMEOUT_S = 120.0
# Agents shipped to this process by reference (see LeasedEnvWorker.act): one copy per process
# however many worker bodies it holds, the newest few kept.
_AGENTS: dict[str, Any] = {}
_AGENTS_KEPT = 4


@dataclass(frozen=True)
class EpisodeStart:
    """What ``start_episode`` answers: the first observation (or why there is none) and the
    lease the episode runs under — its fencing number goes into the episode's record."""

    observation: Observation | None
    env_error: EnvError | None
    account_id: str = ""
    fencing: int = 0
    worker: str = ""
    pid: int = 0                     # the worker's process (to match crashes and logs)
    # Episodes in the leased account whose clean-up never finished (a holder that died):
    # the caller destroys what they left before provisioning, then calls ``cleaned``.
    unfinished: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvPoolConfig(Checked):
    workers: Annotated[int, AtLeast(1)] = 2
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)   # the account leases
    num_cpus_per_worker: float = 0.5
    max_restarts: Annotated[int, AtLeast(-1)] = -1     # -1: restart a crashed worker forever
    # Ray placement: DEFAULT packs workers, SPREAD puts them on distinct nodes.
    scheduling_strategy: Literal["DEFAULT", "SPREAD"] = "DEFAULT"
    # Ray custom resources each worker needs (e.g. {"browser": 1}): workers go only to nodes
    # that offer them.
    resources: Annotated[dict[str, float], Satisfies(check_resources)] = field(
        default_factory=dict)
    # Each worker serves its Prometheus metrics (consolerl_env_worker_*, consolerl_env_pool_*)
    # on a free port of its node, announced for discovery (listed by health()); None: not served.
    metrics: PublishConfig | None = None


class LeasedEnvWorker:
    """The actor's body (kept a plain class so it can be tested without Ray)."""

    def __init__(self, worker_config: WorkerConfig, pool_config: PoolConfig, name: str,
                 metrics: PublishConfig | None = None, *, pool: AccountPool | None = None,
                 browser: Any = None):
        """``pool``: an account pool shared with other workers of this process (built from
        ``pool_config`` when None); ``browser``: what runs the episode's browser side (an
        :class:`EnvWorker` when None; the scale benchmark passes a simulated one)."""
        self.name = name
        self.registry = CollectorRegistry()
        self.worker = browser if browser is not None else EnvWorker(worker_config,
                                                                    self.registry)
        self.pool = pool if pool is not None else AccountPool.from_config(
            pool_config, registry=self.registry)
        self.heartbeat: Heartbeat | None = None
        self.lease: Lease | None = None
        self.leased_at: float | None = None
        self.draining = False
        self.episodes = 0
        self._lease_metrics(worker_config)
        self._endpoint = publish(metrics, [self.registry], "env_worker", name)
        self.metrics_url = self._endpoint.url if self._endpoint else ""

    def _lease_metrics(self, worker_config: WorkerConfig) -> None:
        r = self.registry
        Gauge("consolerl_env_worker_in_episode", "1 while the worker holds an account lease "
              "(an episode from lease to release), else 0; the mean over workers is the pool's "
              "utilisation.", registry=r).set_function(lambda: float(self.lease is not None))
        Gauge("consolerl_env_worker_lease_held_seconds", "Age of the lease the worker holds "
              "now (0 when none).", registry=r).set_function(
            lambda: 0.0 if self.leased_at is None else time.monotonic() - self.leased_at)
        Gauge("consolerl_env_worker_episode_limit_seconds", "The longest an episode (lease to "
              "release) is expected to take (worker.episode_limit_s).",
              registry=r).set(worker_config.episode_limit_s)
        self.m_hold = Histogram("consolerl_env_pool_lease_hold_seconds", "How long leases "
                                "were held, acquire to release.", registry=r,
                                buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600))

    async def start_episode(self, spec: EpisodeSpec, acquire_timeout_s: float | None = None
                            ) -> EpisodeStart:
        """Lease an account and open ``spec`` in the browser signed in to it."""
        leased = await self.acquire(acquire_timeout_s)
        if leased.env_error is not None:
            return leased
        return await self.reset(spec)

    async def acquire(self, acquire_timeout_s: float | None = None) -> EpisodeStart:
        """Lease an account (kept alive by a heartbeat) without opening the browser yet: the
        caller provisions the task's prerequisites in it first, then calls :meth:`reset`."""
        if self.draining:
            return EpisodeStart(None, EnvError("internal", f"{self.name} is draining"),
                                worker=self.name)
        await self.end_episode()
        try:
            lease = await self.pool.acquire_async(self.name, acquire_timeout_s)
        except NoAccountAvailable as exc:
            return EpisodeStart(None, EnvError("timeout", str(exc)), worker=self.name)
        except PoolError as exc:
            return EpisodeStart(None, EnvError("internal", f"account pool: {exc}"),
                                worker=self.name)
        self.lease, self.leased_at = lease, time.monotonic()
        self.heartbeat = Heartbeat(self.pool, lease).start()
        try:
            unfinished = tuple(await asyncio.to_thread(self.pool.unfinished_episodes,
                                                       lease.account_id))
        except Exception as exc:  # noqa: BLE001 - Redis hiccup: the next lease looks again
            log.warning("unfinished episodes of %s unreadable: %s", lease.account_id, exc)
            unfinished = ()
        return EpisodeStart(None, None, lease.account_id, lease.fencing, self.name,
                            os.getpid(), unfinished)

    async def begin(self, episode_id: str) -> None:
        """Record that ``episode_id`` may create resources in the leased account (before
        provisioning); :meth:`cleaned` once they are destroyed."""
        if self.lease is None:
            raise RuntimeError("begin() without a leased account")
        await asyncio.to_thread(self.pool.episode_begun, self.lease.account_id, episode_id)

    async def cleaned(self, episode_id: str) -> None:
        if self.lease is None:
            raise RuntimeError("cleaned() without a leased account")
        await asyncio.to_thread(self.pool.episode_cleaned, self.lease.account_id, episode_id)

    async def reset(self, spec: EpisodeSpec) -> EpisodeStart:
        """Open ``spec`` in the browser, signed in to the leased account."""
        lease = self.lease
        if lease is None:
            return EpisodeStart(None, EnvError("internal", "reset() without a leased account"),
                                worker=self.name)
        account = self.pool.account(lease.account_id)
        result = await self.worker.reset(spec, account,
                                         lease_agent(lease.account_id, lease.fencing))
        if isinstance(result, EnvError):
            if result.kind == "signin_failed":
                await asyncio.to_thread(self.pool.report_signin_failure, lease.account_id)
            await self.end_episode()
            return EpisodeStart(None, result, lease.account_id, lease.fencing, self.name,
                            os.getpid())
        await asyncio.to_thread(self.pool.report_signin_success, lease.account_id)
        self.episodes += 1
        return EpisodeStart(result, None, lease.account_id, lease.fencing, self.name,
                            os.getpid())

    async def step(self, action_text: str) -> StepResult:
        if self.heartbeat is not None and self.heartbeat.lost:
            # Someone else may hold the account now: acting would corrupt their episode.
            await self.worker.close_episode()
            return StepResult(Observation("", "", ""), done=True, env_error=EnvError(
                "lease_lost", f"the lease on account {self.lease.account_id if self.lease else ''}"
                              " expired before the episode ended"))
        return await self.worker.step(action_text)

    async def act(self, agent: Any, task_id: str, title: str, procedure: str,
                  observation: Observation, seed: int | None, trajectory_id: str
                  ) -> tuple[Trajectory | None, str]:
        """Run the episode's turns here, on the opened page: ``agent.run`` (the rollout side's
        agent loop: prompt, generate on the policy servers, act) with this worker's own
        :meth:`step`, so a turn costs no call to the rollout side, only the policy's. At a
        thousand workers that per-turn call was most of the rollout actor's CPU.

        ``agent``: an object with the agent loop's ``run``, or a one-element list holding the
        Ray ObjectRef of one (kept in a list so that Ray hands over the reference and the
        agent is fetched once per process, not deserialized on every call). Returns the
        trajectory and ``""``, or ``None`` and what failed when the agent itself raised (a
        policy replica gone: the episode is an env error, never the agent's failure). A step
        that raises or hangs past :data:`ACT_STEP_TIMEOUT_S` ends the trajectory with an env
        error."""
        agent = await _resolve_agent(agent)

        async def step(text: str) -> StepResult:
            try:
                return await asyncio.wait_for(self.step(text), ACT_STEP_TIMEOUT_S)
            except TimeoutError:
                message = f"env worker step did not answer within {ACT_STEP_TIMEOUT_S:g} s"
            except Exception as exc:  # noqa: BLE001 - the worker broke, not the agent
                message = f"env worker step failed: {type(exc).__name__}: {str(exc)[:200]}"
            return StepResult(Observation("", "", ""), done=True,
                              env_error=EnvError("worker_failed", message))
        try:
            trajectory = await agent.run(task_id, title, procedure, observation, step,
                                         seed=seed, trajectory_id=trajectory_id)
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a value
            log.warning("%s: the agent failed in episode %s: %s", self.name, trajectory_id,
                        exc, exc_info=True)
            return None, f"{type(exc).__name__}: {str(exc)[:300]}"
        return trajectory, ""

    async def close_browser(self) -> None:
        """End the browser side of the episode but keep the lease (scoring and clean-up of
        the account come before it is released)."""
        await self.worker.close_episode()

    async def end_episode(self) -> bool:
        """Close the episode and release its lease; False when the lease was already lost."""
        await self.worker.close_episode()
        heartbeat, lease = self.heartbeat, self.lease
        if self.leased_at is not None:
            self.m_hold.observe(time.monotonic() - self.leased_at)
        self.heartbeat = self.lease = self.leased_at = None
        if heartbeat is not None:
            heartbeat.stop()
        if lease is None:
            return True
        return await asyncio.to_thread(self.pool.release, heartbeat.lease if heartbeat else lease)

    async def health(self) -> dict[str, Any]:
        return {"worker": self.name, "episodes": self.episodes, "draining": self.draining,
                "in_episode": self.lease is not None, "metrics_url": self.metrics_url,
                "browser_pss_mb": round(self.worker.browser_rss_mb(), 1)}

    async def drain(self) -> None:
        self.draining = True
        await self.end_episode()
        await self.worker.shutdown()
        self.pool.close()
        if self._endpoint is not None:
            self._endpoint.close()


EnvWorkerActor = ray.remote(LeasedEnvWorker)


async def _resolve_agent(agent: Any) -> Any:
    """``agent`` itself, or the agent behind ``[ObjectRef]`` (fetched once per process)."""
    if not (isinstance(agent, list) and len(agent) == 1
            and isinstance(agent[0], ray.ObjectRef)):
        return agent
    key = agent[0].hex()
    found = _AGENTS.get(key)
    if found is None:
        found = await agent[0]
        while len(_AGENTS) >= _AGENTS_KEPT:
            _AGENTS.pop(next(iter(_AGENTS)))
        _AGENTS[key] = found
    return found


def actor_state(actor: Any) -> str | None:
    """The GCS's state of the Ray actor behind a handle or one of its methods (``ALIVE``,
    ``RESTARTING``, ``DEAD``, ...); None for anything else, or when Ray cannot say."""
    actor = getattr(actor, "_actor", actor)          # an ActorMethod's handle
    actor_id = getattr(actor, "_actor_id", None)
    if actor_id is None or not ray.is_initialized():
        return None
    try:
        # Ray's own GCS accessor (no dashboard needed, unlike ray.util.state).
        return ray._private.state.actors(actor_id.hex()).get("State")
    except Exception:  # noqa: BLE001 - unknown: the caller keeps waiting
        return None


def worker_options(config: EnvPoolConfig) -> dict[str, Any]:
    """The Ray actor options of every env worker: its CPUs, the custom resources its config
    names (only nodes that offer them host it: never an assumption of one node), placement
    and restarts."""
    options: dict[str, Any] = {
        "max_restarts": config.max_restarts, "max_task_retries": 0,
        "num_cpus": config.num_cpus_per_worker, "max_concurrency": 4,
        "scheduling_strategy": config.scheduling_strategy}
    if config.resources:
        options["resources"] = dict(config.resources)
    return options


class EnvPool:
    """N env worker actors on the current Ray cluster (``ray.init`` first)."""

    def __init__(self, config: EnvPoolConfig):
        self.config = config
        options = worker_options(config)
        self.actors = [
            EnvWorkerActor.options(**options)
            .remote(config.worker, config.pool, f"env-worker-{i}", config.metrics)
            for i in range(config.workers)]

    def health(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """One entry per worker; a worker that does not answer in time is reported down."""
        refs = [actor.health.remote() for actor in self.actors]
        report = []
        for i, ref in enumerate(refs):
            try:
                report.append({**ray.get(ref, timeout=timeout_s), "up": True})
            except (ray.exceptions.RayError, TimeoutError) as exc:
                report.append({"worker": f"env-worker-{i}", "up": False,
                               "error": type(exc).__name__})
        return report

    def drain(self, timeout_s: float = 30.0) -> None:
        """End running episodes, release their leases, stop the browsers and the actors."""
        deadline = time.monotonic() + timeout_s
        # A worker lost with its node (Ray restarting it, perhaps waiting for a node with its
        # resources) would only queue the call: it is killed below without one.
        refs = [actor.drain.remote() for actor in self.actors
                if actor_state(actor) in ("ALIVE", None)]
        for ref in refs:
            try:
                ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayError, TimeoutError) as exc:
                log.warning("a worker did not drain cleanly: %s", exc)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
