"""An episode of the runner stepped from outside (:class:`SteppedEpisode`): reset, step and end
pass through the runner's policy slot, a Halt ends it without an answer, a broken worker is a
result with ``env_error``; and SRC's loop over such episodes: a harmful deviation rolled back
(a new episode, the prefix replayed, the page checked, the teacher's correction sent), all on
a fake runner and a fake console of three pages (no browser, no cloud)."""
from __future__ import annotations

from consolerl.rewards import RewardResult, RuleOutcome
from consolerl.tasks import TASKS_DIR, load_suite
from consolerl.types import EnvError, Observation, StepResult
from datagen.src import Collector, SRCConfig, StudentAction
from datagen.teacher import OracleTeacher, start_url_of
from rollout_service.agent import AgentConfig
from rollout_service.episode import EpisodeOutcome, Halt, _WorkerFailed, episode_id_seed
from rollout_service.stepped import SteppedEpisode
from tests.conftest import run_async

TASK = next(t for t in load_suite(TASKS_DIR) if t.id == "ram-delete-user-0")
HOST = "http://127.0.0.1:18080"
HEADER = '[1] link "Skip to content"\n'
USERS = HEADER + """# Users
region "Users":
 [4] link "Create User"
 table "Users":
  - Logon Name | User ID | Actions
  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]Add Permissions [8]Delete
"""
DIALOG = USERS + """dialog "Delete":
 ## Delete
 [9] button "Cancel"
 [10] button "OK"
"""
EMPTY = USERS.replace(
    "  - [5]dev-1 dev-1 | 7628855302631105 | [6]Manage [7]Add Permissions [8]Delete\n",
    "  - No data.\n")
USER = HEADER + "# dev-1\n [4] link \"Users\"\n"


def console() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The console's pages by name, and its answers: (page, action) -> the next page."""
    pages = {"users": USERS, "dialog": DIALOG, "empty": EMPTY, "user": USER}
    moves = {("users", "click(8)"): "dialog", ("dialog", "click(10)"): "empty",
             ("users", "click(6)"): "user", ("user", f'goto("{HOST}/console/ram/users")'): "users"}
    return pages, moves


class FakeRunner:
    """The runner's contract as SteppedEpisode uses it: a policy called once on the start page
    with a step function; a failure of the worker (``fail_at``: that step) or of the policy
    recorded on the outcome; solved when the user was deleted and the agent said done."""

    def __init__(self, fail_at: int = 0, opens: bool = True):
        self.fail_at, self.opens = fail_at, opens
        self.episodes: list[list[str]] = []
        self.id_seeds: list[int | None] = []          # each episode's, as the runner got it

    async def run(self, env, task, policy, *, max_steps, seed=0, id_seed=None):
        self.id_seeds.append(id_seed)
        outcome = EpisodeOutcome(task.id, task.expected, f"e{len(self.episodes)}")
        if not self.opens:
            outcome.env_error = EnvError("provision_failed", "no quota")
            return outcome
        pages, moves = console()
        where, sent = ["users"], []
        self.episodes.append(sent)

        async def step(text: str) -> StepResult:
            sent.append(text)
            if len(sent) == self.fail_at:
                raise _WorkerFailed(EnvError("worker_lost", "the node went away"))
            where[0] = moves.get((where[0], text), where[0])
            path = "/console/ram/users" + ("/dev-1" if where[0] == "user" else "")
            return StepResult(Observation(f"{HOST}{path}", "t", pages[where[0]]),
                              done=text.startswith("stop("),
                              answer="done" if text.startswith("stop(") else None,
                              action_text=text)
        try:
            outcome.trajectory = await policy(task, {"dev": "dev-1"},
                                              Observation(f"{HOST}/console/ram/users", "t",
                                                          USERS), step,
                                              trajectory_id="t", seed=seed)
        except _WorkerFailed as exc:
            outcome.env_error = exc.error
            return outcome
        except Exception as exc:  # noqa: BLE001 - as the runner: the policy broke
            outcome.env_error = EnvError("policy_failed", f"{type(exc).__name__}: {exc}")
            return outcome
        solved = "click(10)" in sent and outcome.trajectory.answer is not None
        verdict = "success" if solved else "failure"
        outcome.reward = RewardResult(float(solved), True, verdict, "rule",
                                      rule_verdict=RuleOutcome(verdict))
        return outcome


def test_a_stepped_episode_goes_through_the_runners_policy_and_ends_with_a_value():
    async def go():
        runner = FakeRunner()
        episode = SteppedEpisode(runner, None, TASK, max_steps=5)
        opened = await episode.reset()
        assert opened is not None and dict(opened.values) == {"dev": "dev-1"}
        assert (await episode.step("click(8)")).observation.text == DIALOG
        done = await episode.step('stop("done")')
        outcome = await episode.end(done)
        traj = outcome.trajectory
        assert traj.end_reason == "stop" and [t.action_text for t in traj.turns] == [
            "click(8)", 'stop("done")']

        halted = SteppedEpisode(runner, None, TASK, max_steps=5)
        await halted.reset()
        await halted.step("click(6)")
        outcome = await halted.end(Halt("rollback to action 1"))
        assert outcome.trajectory.end_reason == "stuck" and outcome.env_error is None
        assert outcome.trajectory.end_detail == "rollback to action 1"
        assert outcome.status == "failed"
    run_async(go())


def test_a_broken_worker_is_a_result_and_the_outcome_says_what_broke():
    async def go():
        episode = SteppedEpisode(FakeRunner(fail_at=2), None, TASK, max_steps=5)
        await episode.reset()
        await episode.step("click(8)")
        broken = await episode.step("click(10)")
        assert broken.done and broken.env_error == EnvError("worker_lost", "the node went away")
        outcome = await episode.end(broken)
        assert outcome.status == "env_error" and outcome.env_error.kind == "worker_lost"

        unopened = SteppedEpisode(FakeRunner(opens=False), None, TASK, max_steps=5)
        assert await unopened.reset() is None
        assert (await unopened.end()).env_error.kind == "provision_failed"

        failing = SteppedEpisode(FakeRunner(), None, TASK, max_steps=5)
        await failing.reset()
        outcome = await failing.fail(ValueError("the student's server is gone"))
        assert outcome.env_error.kind == "policy_failed"

        left = SteppedEpisode(FakeRunner(), None, TASK, max_steps=5)
        await left.reset()
        await left.close()                   # never ended: the runner's episode is cancelled
        assert left._run is not None and left._run.cancelled()
    run_async(go())


class WrongFirst:
    """A student that clicks the user's Manage link first (a harmful deviation), then does what
    the oracle's plan says from wherever it is."""

    def __init__(self):
        self.teacher = OracleTeacher()

    async def act(self, task, procedure, history, observation, seed, values, past):
        if not past:
            return StudentAction("click(6)")
        first = past[0].observation
        session = self.teacher.session(task, values, start_url_of(task, values, first))
        for i, t in enumerate(past):
            after = past[i + 1].observation if i + 1 < len(past) else observation
            session.observe(t.observation, t.action_text, StepResult(after))
        return StudentAction(session.next_action(observation).action)


def test_src_rolls_a_harmful_deviation_back_over_a_new_episode_and_corrects_it():
    runner = FakeRunner()
    collector = Collector(runner, OracleTeacher(), WrongFirst(), AgentConfig(),
                          SRCConfig(mode="src", segment_steps=2, max_rollbacks=3, max_steps=10))
    run = run_async(collector.attempt(None, TASK, seed=0))
    # Episode 1: Manage (off the plan), back to the list; the review finds no progress and
    # localises the Manage click. Episode 2: the teacher's Delete, then the student goes on.
    assert runner.episodes == [["click(6)", f'goto("{HOST}/console/ram/users")'],
                               ["click(8)", "click(10)", 'stop("done")']]
    assert (run.episodes, run.rollbacks, run.replays, run.replay_matches) == (2, 1, 1, 1)
    assert run.deviated and run.passed and run.status == "solved"
    assert [(c.student, c.action) for c in run.corrections] == [("click(6)", "click(8)")]
    assert [t.source for t in run.final] == ["teacher", "student", "student"]
    assert run.outcome.trajectory.end_reason == "stop"
    assert runner.id_seeds == [None, None]           # random_ids off: document order


def test_src_replays_a_rollback_under_the_first_episodes_id_seed():
    """With ``random_ids``, every episode of an attempt (the rollback's new episode, where the
    kept actions are replayed by their ids) is numbered as the first; another attempt (seed)
    and another task get another numbering."""
    agent = AgentConfig(random_ids=True)
    config = SRCConfig(mode="src", segment_steps=2, max_rollbacks=3, max_steps=10)
    runner = FakeRunner()
    run = run_async(Collector(runner, OracleTeacher(), WrongFirst(), agent, config)
                    .attempt(None, TASK, seed=0))
    assert run.rollbacks == 1 and run.status == "solved"
    first, second = runner.id_seeds
    assert first is not None and second == first
    assert first == episode_id_seed(True, f"src:{TASK.id}", 0)
    other = FakeRunner()
    run_async(Collector(other, OracleTeacher(), WrongFirst(), agent, config)
              .attempt(None, TASK, seed=1))
    assert other.id_seeds[0] is not None and other.id_seeds[0] != first
    assert episode_id_seed(True, "src:ram-create-user-0", 0) != first


def test_a_stepped_episode_passes_its_id_seed_to_the_runner():
    async def go():
        runner = FakeRunner()
        episode = SteppedEpisode(runner, None, TASK, max_steps=5, id_seed=1234)
        await episode.reset()
        await episode.end()
        return runner.id_seeds
    assert run_async(go()) == [1234]


def test_step_level_review_labels_every_step_in_one_episode():
    runner = FakeRunner()
    collector = Collector(runner, OracleTeacher(), WrongFirst(), AgentConfig(),
                          SRCConfig(mode="step", max_steps=10))
    run = run_async(collector.attempt(None, TASK, seed=0))
    assert run.episodes == 1 and run.rollbacks == 0 and run.status == "solved"
    assert runner.episodes == [["click(6)", f'goto("{HOST}/console/ram/users")', "click(8)",
                                "click(10)", 'stop("done")']]
    assert run.queries == 5 and [c.action for c in run.corrections] == ["click(8)"]

