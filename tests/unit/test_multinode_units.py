"""Multi-node logic without a cluster: where the services are advertised, which Ray options
each actor kind is started with (the resources named in its config, always), and how the
orchestrator copes with an env worker lost with its node."""
from __future__ import annotations

from dataclasses import replace

import ast
import asyncio
from pathlib import Path

import pytest
import ray.exceptions

from cluster import replicas as rollout_module
from cluster.addresses import advertise, is_loopback, loopback_left, services_host
from cluster.builders import jobs_api_specs, rollout_spec
from cluster.config import JobConfig
from consolerl.accounts import Account
from consolerl.config import load_config
from consolerl.experience import Trajectory, Turn
from consolerl.rewards import RewardResult
from consolerl.tasks import TASKS_DIR, load_suite
from env_workers import pool as pool_module
from env_workers.pool import EpisodeStart
from rollout_service import episode as episode_module
from rollout_service import orchestrator as orchestrator_module
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.episode import EpisodeOutcome, EpisodeRunner, worker_lost
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from tests.conftest import run_async
from trainer import engine as engine_module


def _config(*overrides: str) -> JobConfig:
    return load_config(JobConfig, "configs/smoke.yaml", list(overrides))


# ---- addresses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("localhost", True), ("::1", True),
    ("[::1]", True), ("10.0.0.5", False), ("redis.svc", False), ("", False), (None, False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


def test_services_host_is_loopback_embedded_and_the_node_ip_on_a_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert services_host(_config().run, "10.0.0.5") == "127.0.0.1"
    assert services_host(_config("run.ray_address=10.0.0.1:6380").run, "10.0.0.5") == "10.0.0.5"
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.1:8265")          # ray job submit
    assert services_host(_config().run, "10.0.0.5") == "10.0.0.5"
    assert services_host(_config("run.services_host=svc.local").run, "10.0.0.5") == "svc.local"


def test_advertise_moves_the_services_this_job_starts():
    config = advertise(_config(), "10.0.0.5")
    assert config.stream.url == "redis://10.0.0.5:6391/0"
    assert config.cloud.endpoint == "10.0.0.5:18090"
    assert config.env.worker.console_url == ""          # the cloud endpoint's, when built
    assert loopback_left(config) == []
    # What every component is built from carries the advertised addresses.
    spec = rollout_spec(config, config.policy, None)
    assert spec.env_pool.pool.redis_url == "redis://10.0.0.5:6391/0"
    assert spec.env_pool.worker.console_url == "http://10.0.0.5:18090"
    assert spec.endpoint == "10.0.0.5:18090"


def test_advertise_keeps_a_password_and_leaves_external_services_alone():
    config = advertise(_config("stream.url=redis://:pw@127.0.0.1:6391/2"), "10.0.0.5")
    assert config.stream.url == "redis://:pw@10.0.0.5:6391/2"
    # Not started by the job: never rewritten (a loopback one is reported instead).
    config = advertise(_config("run.redis=false", "cloud.local=false"), "10.0.0.5")
    assert config.stream.url == "redis://127.0.0.1:6391/0"
    assert config.cloud.endpoint == "127.0.0.1:18090"
    assert [x.split()[0] for x in loopback_left(config)] == ["stream.url"]
    external = _config("stream.url=redis://redis.svc:6380/0", "cloud.endpoint=cloud.svc:80",
                       "env.worker.console_url=http://cloud.svc:80")
    assert advertise(external, "10.0.0.5") == external
    # A console named on its own is not the local cloud's: left alone, and reported.
    other = advertise(_config("env.worker.console_url=http://127.0.0.1:9999"), "10.0.0.5")
    assert other.env.worker.console_url == "http://127.0.0.1:9999"
    assert [x.split()[0] for x in loopback_left(other)] == ["env.worker.console_url"]
    # Loopback: nothing moves.
    assert advertise(_config(), "127.0.0.1") == _config()


def test_loopback_left_never_shows_a_password():
    left = loopback_left(_config("stream.url=redis://:s3cret@127.0.0.1:6391/0"))
    assert left and not any("s3cret" in x for x in left)


# ---- a worker lost with its node ----------------------------------------------------------------


TASKS = [t for t in load_suite(TASKS_DIR) if t.id in ("ram-create-user-0", "ram-grant-policy-0")]
DIED = ray.exceptions.ActorDiedError()
UNAVAILABLE = ray.exceptions.ActorUnavailableError("its node is gone", b"\0" * 16)


class FakeStream:
    def __init__(self):
        self.pushed = []

    def push(self, group):
        self.pushed.append(group)
        return "1-0"

    def trainer_version(self):
        return 0


class LostWorker:
    """An env worker actor whose node is gone: every call raises Ray's error; ``health``
    answers from ``probes`` (an exception raises, anything else answers), then the last."""

    def __init__(self, name: str, error: Exception, probes=()):
        self.name, self.error, self.probes = name, error, list(probes)
        self.calls: list[str] = []
        self.restarted = False

    async def acquire(self, timeout_s=None):
        self.calls.append("acquire")
        raise self.error

    async def health(self):
        self.calls.append("health")
        answer = self.probes.pop(0) if len(self.probes) > 1 else (
            self.probes[0] if self.probes else self.error)
        if isinstance(answer, Exception):
            raise answer
        self.restarted = True                     # Ray restarted it: it works again
        return {"worker": self.name}


class LiveWorker:
    name = "live"


def lost_orchestrator(workers, config: OrchestratorConfig):
    """The real episode path (runner included) for :class:`LostWorker`; a scored episode
    (rewards 0 and 1 by index in the group) on any other worker."""
    stream = FakeStream()
    orch = Orchestrator(config, TASKS, workers, [], "127.0.0.1:1",
                        AgentLoop(None, None, AgentConfig()), None, stream)
    real = orch.episode
    ran: dict[str, int] = {}

    async def episode(worker, task, trajectory_id, seed):
        ran[worker.name] = ran.get(worker.name, 0) + 1
        if isinstance(worker, LostWorker) and not worker.restarted:
            return await real(worker, task, trajectory_id, seed)
        await asyncio.sleep(0.01)
        i = int(trajectory_id.rsplit("-", 1)[1])
        turn = Turn((1,), (2,), (-0.1,), (1,), 0, "x", "click(1)")
        traj = Trajectory(trajectory_id, task.id, (turn,), "stop", answer="done")
        return EpisodeOutcome(task.id, task.expected, "e1", traj, RewardResult(
            float(i), True, "success" if i else "failure", "rule"))
    orch.episode = episode
    return orch, stream, ran


@pytest.mark.parametrize("error", [DIED, UNAVAILABLE, ray.exceptions.RayActorError()])
def test_ray_actor_errors_mean_the_worker_is_lost(error):
    assert worker_lost(error)
    assert not worker_lost(RuntimeError("The actor died unexpectedly"))   # inside the worker
    assert not worker_lost(TimeoutError())


@pytest.mark.parametrize("error", [DIED, UNAVAILABLE])
def test_a_lost_worker_is_an_env_error_and_is_parked_while_the_others_go_on(error):
    lost = LostWorker("env-worker-0", error)          # never answers again
    orch, stream, ran = lost_orchestrator(
        [lost, LiveWorker()], OrchestratorConfig(group_size=2, max_staleness=5,
                                                 lost_probe_s=0.05, lost_probes_dead=10**6))
    summary = run_async(asyncio.wait_for(orch.run(max_groups=3), 20))
    # Its one episode is an env error of kind worker_lost, retried on the live worker.
    assert ran["env-worker-0"] == 1 and lost.calls.count("acquire") == 1
    assert summary["env_errors_by_kind"] == {"worker_lost": 1}
    assert summary["workers_lost"] == 1 and summary["groups_pushed"] == 3
    assert summary["workers_parked"] == 1 and orch.live_workers() == [orch.workers[1]]
    # Nothing it touched is trained on: every pushed sample ran on the live worker.
    assert len(stream.pushed) == 3 and all(len(g.samples) == 2 for g in stream.pushed)
    assert lost.calls.count("health") >= 1
    lost_metric = orch.registry.get_sample_value("consolerl_rollout_workers_lost_total")
    assert lost_metric == 1.0
    assert orch.registry.get_sample_value("consolerl_rollout_workers_parked") == 1.0


def test_a_lost_worker_that_ray_restarts_takes_episodes_again():
    # Unavailable twice (its node gone, Ray restarting it elsewhere), then it answers.
    lost = LostWorker("env-worker-0", UNAVAILABLE, probes=[UNAVAILABLE, UNAVAILABLE, "ok"])
    orch, _, ran = lost_orchestrator(
        [lost, LiveWorker()], OrchestratorConfig(group_size=2, max_staleness=100,
                                                 lost_probe_s=0.05))
    summary = run_async(asyncio.wait_for(orch.run(max_groups=30), 20))
    assert lost.calls.count("health") == 3
    assert ran["env-worker-0"] >= 2                    # back in the pool after answering
    assert summary["workers_lost"] == 1 and summary["workers_parked"] == 0
    assert summary["groups_pushed"] == 30


def test_a_worker_dead_for_good_is_retired_and_the_run_ends_without_it():
    lost = LostWorker("env-worker-0", DIED)          # no restarts left: DIED on every probe
    orch, _, ran = lost_orchestrator(
        [lost, LiveWorker()], OrchestratorConfig(group_size=2, max_staleness=100,
                                                 lost_probe_s=0.01, lost_probes_dead=3))
    summary = run_async(asyncio.wait_for(orch.run(max_groups=40), 30))
    assert summary["workers_retired"] == 1 and summary["workers_parked"] == 0
    assert lost.calls.count("health") == 3 and ran["env-worker-0"] == 1
    assert summary["groups_pushed"] == 40


def test_sync_mode_parks_a_lost_worker_too():
    lost = LostWorker("env-worker-0", UNAVAILABLE)
    orch, stream, ran = lost_orchestrator(
        [lost, LiveWorker()], OrchestratorConfig(group_size=2, mode="sync", groups_per_step=2,
                                                 lost_probe_s=0.01))
    summary = run_async(asyncio.wait_for(orch.run(max_groups=2), 20))
    assert summary["groups_pushed"] == 2 and summary["workers_lost"] == 1
    assert ran["env-worker-0"] == 1


def test_sync_mode_retires_a_worker_dead_for_good():
    lost = LostWorker("env-worker-0", DIED)          # DIED on every probe
    orch, stream, ran = lost_orchestrator(
        [lost, LiveWorker()], OrchestratorConfig(group_size=2, mode="sync", groups_per_step=2,
                                                 lost_probe_s=0.01, lost_probes_dead=2))
    stream.trainer_version = lambda: len(stream.pushed) // 2    # the trainer keeps up
    summary = run_async(asyncio.wait_for(orch.run(max_groups=8), 20))
    assert summary["groups_pushed"] == 8 and summary["workers_retired"] == 1
    assert summary["workers_parked"] == 0 and ran["env-worker-0"] == 1
    assert lost.calls.count("health") == 2


def test_sync_mode_ends_when_every_worker_is_retired():
    lost = LostWorker("env-worker-0", DIED)
    orch, stream, _ = lost_orchestrator(
        [lost], OrchestratorConfig(group_size=2, mode="sync", groups_per_step=1,
                                   lost_probe_s=0.01, lost_probes_dead=2, max_env_retries=5))
    summary = run_async(asyncio.wait_for(orch.run(max_groups=1), 20))
    assert summary["workers_retired"] == 1 and summary["groups_pushed"] == 0


class LostMidEpisode:
    """Leased an account, then lost with its node (``begin`` raises): clean-up calls to it
    would wait on an actor Ray is restarting, so none are made."""

    name = "env-worker-1"

    def __init__(self):
        self.calls: list[str] = []

    async def acquire(self, timeout_s=None):
        self.calls.append("acquire")
        return EpisodeStart(None, None, "acct-1", 7, self.name, 4242)

    async def begin(self, episode_id):
        self.calls.append("begin")
        raise DIED

    async def cleaned(self, episode_id):
        self.calls.append("cleaned")

    async def end_episode(self):
        self.calls.append("end_episode")
        return True


def test_an_episode_lost_mid_way_is_cleaned_up_from_the_cloud_side_only():
    account = Account("acct-1", "u1", "pw", "ak", "secret")
    runner = EpisodeRunner([account], "127.0.0.1:1", None, client_factory=lambda a: None)
    cleaned = []
    runner._clean_up = lambda provisioner, outcome, extra: cleaned.append(
        outcome.episode_id) or True
    env = LostMidEpisode()
    outcome = run_async(runner.run(env, TASKS[0], None, max_steps=3))
    assert outcome.env_error is not None and outcome.env_error.kind == "worker_lost"
    assert outcome.status == "env_error" and outcome.reward is None
    assert cleaned == [outcome.episode_id]          # the cloud side is destroyed all the same
    assert env.calls == ["acquire", "begin"]         # no call waits on the lost actor


# ---- placement: the resources named in the config, on every actor ------------------------------

ROOT = Path(__file__).resolve().parents[2]
PLACED = ("env.resources={browser: 1}", "policy.resources={policy: 1}",
          "trainer.engine.resources={trainer: 1}")


class Recorder:
    """Stands in for a Ray actor class: records the options each actor is started with."""

    def __init__(self):
        self.options_seen: list[dict] = []

    def options(self, **options):
        self.options_seen.append(options)
        recorder = self

        class Started:
            def remote(self, *args, **kwargs):
                return recorder

        return Started()

    # What start_workers asks of a trainer worker once started.
    class _Method:
        def remote(self, *args):
            return "ref"
    address = init_distributed = _Method()


class _Placement:
    """Stands in for trainer.placement.RankPlacement: each rank's bundle by name."""

    def scheduling(self, rank: int) -> str:
        return f"bundle-of-rank-{rank}"


def _started(monkeypatch, config: JobConfig) -> dict[str, list[dict]]:
    """Start every actor kind of a training job through its real start path, with Ray's actor
    classes replaced by recorders; the options each was given, by kind."""
    kinds = {"env": Recorder(), "policy": Recorder(), "trainer": Recorder()}
    monkeypatch.setattr(pool_module, "EnvWorkerActor", kinds["env"])
    monkeypatch.setattr(rollout_module, "PolicyServerActor", kinds["policy"])
    monkeypatch.setattr(engine_module, "TrainerWorkerActor", kinds["trainer"])
    monkeypatch.setattr(engine_module.ray, "get", lambda refs, **kw: refs)
    monkeypatch.setattr(engine_module, "place_ranks", lambda *args: _Placement())
    pool_module.EnvPool(rollout_spec(config, config.policy, None).env_pool)
    rollout_module.start_policy(config.policy)
    engine_module.start_workers("model", config.trainer.engine, config.trainer.algo)
    return {k: r.options_seen for k, r in kinds.items()}


def test_every_actor_is_started_with_the_resources_its_config_names(monkeypatch):
    config = _config(*PLACED, "policy.replicas=2", "env.workers=3")
    started = _started(monkeypatch, config)
    assert [len(v) for v in started.values()] == [3, 2, 2]
    wanted = {"env": {"browser": 1.0}, "policy": {"policy": 1.0}, "trainer": {"trainer": 1.0}}
    for kind, seen in started.items():
        for options in seen:
            assert options.get("resources") == wanted[kind], (kind, options)
    assert all(o["max_restarts"] == -1 for o in started["env"])
    assert [o["scheduling_strategy"] for o in started["trainer"]] == [
        "bundle-of-rank-0", "bundle-of-rank-1"]
    # With none named, none asked (any node will do).
    started = _started(monkeypatch, _config("env.max_restarts=0"))
    assert all("resources" not in o for seen in started.values() for o in seen)
    assert all(o["max_restarts"] == 0 for o in started["env"])


def test_option_builders_carry_the_config(monkeypatch):
    config = _config(*PLACED, "policy.num_gpus_per_replica=1", "trainer.engine.memory_gib=2")
    assert pool_module.worker_options(rollout_spec(config, config.policy, None).env_pool
                                      )["resources"] == {"browser": 1.0}
    policy = rollout_module.policy_options(config.policy)
    assert policy["resources"] == {"policy": 1.0} and policy["num_gpus"] == 1
    trainer = engine_module.worker_options(config.trainer.engine)
    assert trainer["resources"] == {"trainer": 1.0} and trainer["memory"] == 2 * 2**30
    assert trainer["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"


# Every place the project starts an actor of these kinds, and the option builder it must use.
_ACTOR_STARTS = {"EnvWorkerActor": "worker_options", "PolicyServerActor": "policy_options",
                 "TrainerWorkerActor": "worker_options"}


def test_no_actor_of_a_placed_kind_is_started_around_its_option_builder():
    """A new call site that starts env workers, PolicyServers or trainer workers with options
    of its own (and so, perhaps, without the resources of the config) fails here."""
    bad, found = [], set()
    for package in ("cluster", "rollout_service", "datagen", "jobsapi", "env_workers", "trainer",
                    "benchmarks"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            builders = {n.targets[0].id: n.value for n in ast.walk(tree)
                        if isinstance(n, ast.Assign) and len(n.targets) == 1
                        and isinstance(n.targets[0], ast.Name)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "options"
                        and isinstance(node.func.value, ast.Name)
                        and node.func.value.id in _ACTOR_STARTS):
                    continue
                builder = _ACTOR_STARTS[node.func.value.id]
                found.add(node.func.value.id)
                ok = (len(node.args) == 0 and len(node.keywords) == 1
                      and node.keywords[0].arg is None
                      and isinstance(node.keywords[0].value, ast.Name))
                if ok:
                    source = builders.get(node.keywords[0].value.id)
                    ok = (isinstance(source, ast.Call) and isinstance(source.func, ast.Name)
                          and source.func.id == builder)
                if not ok:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                               f"{node.func.value.id}.options(...) not from {builder}()")
    assert bad == []
    assert found == set(_ACTOR_STARTS)         # the scan sees the real start paths


class _ActorId:
    def hex(self):
        return "ab" * 16


class _Handle:
    _actor_id = _ActorId()


class _HangingMethod:
    """A Ray actor method (its handle's id) whose call never answers: a call queued on an
    actor that Ray is restarting, with no node offering its resources."""

    _actor = _Handle()
    _method_name = "acquire"

    async def __call__(self, *args):
        await asyncio.sleep(3600)


@pytest.mark.parametrize("state, kind", [("RESTARTING", "worker_lost"), ("DEAD", "worker_lost")])
def test_a_call_on_an_actor_ray_is_restarting_ends_at_once(monkeypatch, state, kind):
    monkeypatch.setattr(episode_module, "LOST_CHECK_S", 0.05)
    monkeypatch.setattr(episode_module, "actor_state", lambda actor: state)

    async def go():
        try:
            await episode_module._env_call(_HangingMethod(), 300.0, wait_s=300.0)
        except episode_module._WorkerFailed as exc:
            return exc.error
    error = run_async(asyncio.wait_for(go(), 10))
    assert error.kind == kind and state in error.message


def test_a_slow_call_on_a_live_actor_is_waited_for(monkeypatch):
    monkeypatch.setattr(episode_module, "LOST_CHECK_S", 0.02)
    checks = []
    monkeypatch.setattr(episode_module, "actor_state", lambda actor: checks.append(1) or "ALIVE")

    class Slow(_HangingMethod):
        async def __call__(self, *args):
            await asyncio.sleep(0.3)
            return "answer"
    assert run_async(episode_module._env_call(Slow(), wait_s=0.0)) == "answer"
    assert len(checks) >= 3                  # checked while it waited, and let it finish


def test_a_parked_actor_is_probed_by_its_state_before_any_call(monkeypatch):
    lost = LostWorker("env-worker-0", UNAVAILABLE, probes=["ok"])
    lost._actor_id = _ActorId()
    orch, _, _ = lost_orchestrator([lost, LiveWorker()], OrchestratorConfig(lost_probe_s=0.05))
    for state, answer in (("RESTARTING", None), ("PENDING_CREATION", None), ("DEAD", False),
                          ("ALIVE", True)):
        monkeypatch.setattr(orchestrator_module, "actor_state", lambda w, s=state: s)
        assert run_async(orch._probe(lost)) is answer, state
    assert lost.calls == ["health"]           # only the live one was called


def test_the_jobs_api_builds_its_env_workers_as_training_does():
    """One builder: the jobs API's pool differs from training's only in its worker count
    (placement and restarts were dropped when it was built apart)."""
    config = _config(*PLACED, "env.max_restarts=3", "api.workers=5")
    training = rollout_spec(config, config.policy, None)
    scheduler, _ = jobs_api_specs(config, config.policy, None)
    api = scheduler.rollout.env_pool
    assert api.workers == 5 and training.env_pool.workers == config.env.workers
    assert api == replace(training.env_pool, workers=5)
    assert api.resources == {"browser": 1.0} and api.max_restarts == 3
    assert pool_module.worker_options(api)["max_restarts"] == 3
