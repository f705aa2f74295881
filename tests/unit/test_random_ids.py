"""Element ids that do not encode the layout (``AgentConfig.random_ids``): the renderer's
numbering from ``EpisodeSpec.id_seed`` (a permutation of 1..999 per seed, document order
without one), the env worker rendering with its episode's seed, and the runner, orchestrator
and jobs scheduler giving each agent episode its own seed."""
from __future__ import annotations

import random
import re
from types import SimpleNamespace

from consolerl.accounts import Account
from consolerl.page import parse
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import EnvError, EpisodeSpec
from env_workers.observation import bid_number, render_snapshot
from env_workers.pool import EpisodeStart
from env_workers.worker import EnvWorker, WorkerConfig, _Episode
from rollout_service.agent import AgentConfig, AgentLoop
from rollout_service.episode import EpisodeOutcome, EpisodeRunner, episode_id_seed
from rollout_service.orchestrator import Orchestrator, OrchestratorConfig
from tests.conftest import run_async
from tests.unit.test_observation import SNAPSHOT
from tests.unit.test_page import PAGES

TASKS = load_suite(TASKS_DIR)


def _renumbered(text: str, id_seed: int) -> str:
    """A document-order text with each ``[k]`` written as the seed's k-th bid."""
    return re.sub(r"\[(\d+)\]", lambda m: f"[{bid_number(int(m[1]), id_seed)}]", text)


def test_without_a_seed_the_text_is_the_document_order_text():
    plain = render_snapshot(SNAPSHOT)
    assert render_snapshot(SNAPSHOT, None) == plain
    assert list(plain.bids) == [str(k) for k in range(1, 8)]
    assert [bid_number(k, None) for k in (1, 2, 999, 1000, 1500)] == [1, 2, 999, 1000, 1500]


def test_a_seed_renumbers_the_same_text_and_renders_it_the_same_every_time():
    plain = render_snapshot(SNAPSHOT)
    seeded = render_snapshot(SNAPSHOT, 7)
    assert seeded == render_snapshot(SNAPSHOT, 7)          # one page state, one text per episode
    assert seeded.text == _renumbered(plain.text, 7)        # only the numbers change
    assert seeded.text != plain.text
    for k, ref in enumerate(plain.bids.values(), start=1):  # each id names the same element
        assert seeded.bids[str(bid_number(k, 7))] == ref
    order = list(range(1, 1000))
    random.Random(7).shuffle(order)                         # the rule: Random(seed)'s shuffle
    assert list(seeded.bids) == [str(n) for n in order[:7]]


def test_on_real_console_pages_only_the_numbers_change():
    """The renderer's golden pages (``tests/data/pages.json``): the seeded text is the
    document-order text renumbered, and the page parser finds the ids in the renderer's
    order."""
    for page in PAGES:
        plain, seeded = render_snapshot(page["snapshot"]), render_snapshot(page["snapshot"], 99)
        assert seeded.text == _renumbered(plain.text, 99), page["name"]
        assert [n.bid for n in parse(seeded.text).controls()] == list(seeded.bids)


def test_seeded_ids_are_unique_decimal_numbers_the_page_parser_reads():
    for seed in (0, 1, 2**62):
        r = render_snapshot(SNAPSHOT, seed)
        assert len(set(r.bids)) == len(r.bids) == 7
        assert all(re.fullmatch(r"[1-9]\d{0,2}", b) for b in r.bids)
        assert [n.bid for n in parse(r.text).controls()] == list(r.bids)
        assert parse(r.text).bid("link", "Create User") == list(r.bids)[2]


def test_different_seeds_give_different_ids():
    numberings = {tuple(render_snapshot(SNAPSHOT, seed).bids) for seed in range(20)}
    assert len(numberings) == 20


def test_past_999_controls_the_ids_go_on_from_2000():
    snapshot = "".join(f'- button "B{k}" [ref=e{k}]\n' for k in range(1, 1006))
    r = render_snapshot(snapshot, 5)
    bids = [int(b) for b in r.bids]
    assert sorted(bids[:999]) == list(range(1, 1000))
    assert bids[999:] == [2000, 2001, 2002, 2003, 2004, 2005]
    assert r.bids["2005"] == "e1005" and len(set(bids)) == 1005
    assert [int(b) for b in render_snapshot(snapshot).bids] == list(range(1, 1006))


# ---- the env worker renders with its episode's seed --------------------------------------------
class Page:
    url = "http://127.0.0.1:1/console/ram/users"

    async def aria_snapshot(self, mode: str, timeout: float) -> str:
        return SNAPSHOT

    async def title(self) -> str:
        return "Users"


def test_the_worker_renders_with_the_episode_specs_id_seed():
    worker = EnvWorker(WorkerConfig(console_url="http://127.0.0.1:1"))
    for id_seed in (None, 11):
        episode = _Episode(EpisodeSpec("/console/ram/users", id_seed=id_seed), None, Page(), 0.0)
        obs = run_async(worker._observe(episode, ""))
        expected = render_snapshot(SNAPSHOT, id_seed)
        assert obs.text == expected.text and episode.bids == expected.bids
    assert obs.text != render_snapshot(SNAPSHOT).text


# ---- each agent episode gets its seed ----------------------------------------------------------
def test_an_episodes_id_seed_is_none_unless_random_ids_and_differs_per_episode():
    assert episode_id_seed(False, "g1-0", 3) is None
    seeds = {episode_id_seed(True, f"g1-{i}", 100 + i) for i in range(8)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert episode_id_seed(True, "g1-0", 100) == episode_id_seed(True, "g1-0", 100)
    assert episode_id_seed(True, "g1-0", 100) != episode_id_seed(True, "g1-0", 101)


class Provisioner:
    user_agent = ""

    def provision(self, prerequisites, episode_id):
        return SimpleNamespace(values=lambda: {}, resources=[])


class OpeningEnv:
    """Leases an account and records the spec it is asked to open; the page does not open
    (an env error), which ends the episode there."""

    def __init__(self):
        self.specs: list[EpisodeSpec] = []

    async def acquire(self, timeout_s=None):
        return EpisodeStart(None, None, "acct-1", 1, "w1")

    async def reset(self, spec):
        self.specs.append(spec)
        return EpisodeStart(None, EnvError("navigation_failed", "no page"), "acct-1", 1, "w1")

    async def close_browser(self):
        return None

    async def end_episode(self):
        return True


def test_the_runner_opens_the_episode_with_its_id_seed():
    task = next(t for t in TASKS if "{" not in t.start_page)
    runner = EpisodeRunner([Account("acct-1", "u1", "pw", "ak", "secret")], "127.0.0.1:1",
                           None, client_factory=lambda a: None)
    runner.provisioner = lambda account: Provisioner()
    runner._agent_created = lambda provisioner, account, since: []
    runner._clean_up = lambda provisioner, outcome, extra: True
    env = OpeningEnv()
    for id_seed in (None, 42):
        outcome = run_async(runner.run(env, task, None, max_steps=3, id_seed=id_seed))
        assert outcome.env_error.kind == "navigation_failed"
    assert [s.id_seed for s in env.specs] == [None, 42]
    assert env.specs[1].start_path == task.start_page and env.specs[1].max_steps == 3


def _orchestrator_seeds(agent: AgentConfig) -> list[tuple[str, int, int | None]]:
    orch = Orchestrator(OrchestratorConfig(group_size=2), TASKS, [SimpleNamespace(name="w")],
                        [], "127.0.0.1:1", AgentLoop(None, None, agent), None, None)
    got = []

    async def run(worker, task, policy, *, max_steps, trajectory_id, seed, interrupted,
                  id_seed):
        got.append((trajectory_id, seed, id_seed))
        return EpisodeOutcome(task.id, task.expected, "e1")
    orch.runner.run = run
    for i in range(2):
        run_async(orch.episode(orch.workers[0], TASKS[0], f"g1-{i}", 100 + i))
    return got


def test_the_orchestrator_draws_an_id_seed_per_episode_only_with_random_ids():
    assert [s for _, _, s in _orchestrator_seeds(AgentConfig())] == [None, None]
    got = _orchestrator_seeds(AgentConfig(random_ids=True))
    assert [s for _, _, s in got] == [episode_id_seed(True, t, seed) for t, seed, _ in got]
    assert got[0][2] != got[1][2]
