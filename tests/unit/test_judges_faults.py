"""The judge channel against real local HTTP endpoints that fail: down (connection refused),
slow (past the call's timeout or the episode's deadline), garbage, HTTP 500s and 429s, and
more concurrent episodes than the channel's concurrency limit. Every episode's verdict comes
back within its bound (wall time asserted), ``undetermined`` unless the judges answered,
nothing raises, and ``consolerl_reward_judge_*`` count what happened."""
from __future__ import annotations

import json
import pickle
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cloudpickle
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from reward_service.judges import JudgeChannel, JudgeConfig, judge_clients
from reward_service.service import RewardService

S = '{"verdict": "success", "reason": "user created"}'


class Judge:
    """A local OpenAI-compatible endpoint whose behaviour a test sets: ``mode`` ok | slow |
    garbage | not_a_vote | 500 | 429, ``delay_s`` before answering, ``fail_first`` error
    answers before it behaves (``ok``)."""

    def __init__(self, mode: str = "ok", delay_s: float = 0.0, fail_first: int = 0):
        self.mode, self.delay_s, self.fail_first = mode, delay_s, fail_first
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):       # quiet
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with judge.lock:
                    judge.requests += 1
                    n = judge.requests
                    judge.in_flight += 1
                    judge.max_in_flight = max(judge.max_in_flight, judge.in_flight)
                gone = self._wait(judge.delay_s)
                with judge.lock:                # before the answer: its client goes on
                    judge.in_flight -= 1
                if gone:
                    return
                try:
                    self._answer(judge.mode if n > judge.fail_first else judge.fail_mode)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _wait(self, seconds: float) -> bool:
                """Work for ``seconds``, or until the client hangs up (True), as a server
                that aborts a request whose client left."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    readable, _, _ = select.select([self.connection], [], [], 0.02)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        return True
                return False

            def _answer(self, mode: str) -> None:
                if mode in ("500", "429"):
                    body, status = b'{"error": "try later"}', int(mode)
                elif mode == "garbage":
                    body, status = b"<html>not json at all", 200
                else:
                    content = "I think it went fine." if mode == "not_a_vote" else S
                    body = json.dumps({"choices": [{"message": {"role": "assistant",
                                                                "content": content}}]}).encode()
                    status = 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.fail_mode = "500"
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge_server():
    servers: list[Judge] = []

    def make(*args, **kwargs) -> Judge:
        servers.append(Judge(*args, **kwargs))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def free_port_url() -> str:
    """A local port nothing listens on: connections are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def channel(url: str, registry: CollectorRegistry, *, client_timeout_s: float = 30.0,
            **config) -> JudgeChannel:
    cfg = dict(k=3, deadline_s=2.0, retries=2, retry_backoff_s=0.05)
    cfg.update(config)
    factory = partial(judge_clients, url, "judge", [0.0], api_key_env=None,
                      timeout_s=client_timeout_s, max_tokens=64)
    return JudgeChannel(config=JudgeConfig(**cfg), client_factory=factory, registry=registry)


def judge(ch: JudgeChannel):
    return ch.judge("Create a RAM user", "1. Open RAM.\n2. Create user.",
                    ["click('a1')", "stop(\"done\")"], "[a9] row dev-1", answer="done")


def value(registry: CollectorRegistry, name: str, **labels) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def timed(ch: JudgeChannel):
    started = time.monotonic()
    verdict = judge(ch)
    return verdict, time.monotonic() - started


def test_a_judge_that_is_down_is_undetermined_within_the_deadline():
    registry = CollectorRegistry()
    verdict, elapsed = timed(channel(free_port_url(), registry))
    assert verdict.verdict == "undetermined"
    assert all(v.verdict == "invalid" for v in verdict.votes)
    assert elapsed < 2.5, elapsed
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="transport_error") == 3
    # Each judge tried 1 + 2 retries.
    assert value(registry, "consolerl_reward_judge_failures_total", kind="transport_error") == 9


def test_a_slow_judge_times_out_per_call():
    registry = CollectorRegistry()
    slow = Judge(delay_s=5.0)
    try:
        verdict, elapsed = timed(channel(slow.url, registry, timeout_s=0.5, deadline_s=3.0))
    finally:
        slow.close()
    assert verdict.verdict == "undetermined"
    assert elapsed < 1.5, elapsed                    # the call's timeout, not the deadline
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="timeout") == 3
    assert value(registry, "consolerl_reward_judge_failures_total", kind="timeout") == 3
    assert value(registry, "consolerl_reward_judge_call_seconds_count") == 3


def test_a_slow_judge_is_cut_at_the_episodes_deadline(judge_server):
    """No per-call timeout in the config and a client whose own is long: the deadline bounds
    the episode (the calls get the time left as their timeout)."""
    registry = CollectorRegistry()
    slow = judge_server(delay_s=5.0)
    verdict, elapsed = timed(channel(slow.url, registry, deadline_s=1.0, client_timeout_s=60))
    assert verdict.verdict == "undetermined"
    assert elapsed < 1.5, elapsed
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="timeout") == 3


@pytest.mark.parametrize("mode, failure", [("garbage", "malformed_response"),
                                           ("not_a_vote", "invalid_reply")])
def test_garbage_is_an_invalid_vote(judge_server, mode, failure):
    registry = CollectorRegistry()
    server = judge_server(mode)
    verdict, elapsed = timed(channel(server.url, registry))
    assert verdict.verdict == "undetermined"
    assert elapsed < 1.0, elapsed
    assert server.requests == 3                      # garbage is not retried
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="invalid_reply") == 3
    assert value(registry, "consolerl_reward_judge_failures_total", kind=failure) == 3


@pytest.mark.parametrize("status, kind", [("500", "http_5xx"), ("429", "http_429")])
def test_error_statuses_are_retried_then_undetermined(judge_server, status, kind):
    registry = CollectorRegistry()
    server = judge_server(status)
    verdict, elapsed = timed(channel(server.url, registry))
    assert verdict.verdict == "undetermined"
    assert elapsed < 2.5, elapsed
    assert server.requests == 9
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="http_error") == 3
    assert value(registry, "consolerl_reward_judge_failures_total", kind=kind) == 9


def test_a_500_then_an_answer_is_a_vote(judge_server):
    registry = CollectorRegistry()
    server = judge_server("ok", fail_first=3)        # each judge's first try fails (k = 3)
    verdict = judge(channel(server.url, registry, concurrency=3))
    assert verdict.verdict == "success", verdict
    assert value(registry, "consolerl_reward_judge_calls_total", outcome="ok") == 3
    assert value(registry, "consolerl_reward_judge_failures_total", kind="http_5xx") == 3


def test_a_client_error_status_is_not_retried(judge_server):
    registry = CollectorRegistry()
    server = judge_server("429")
    server.mode = "404-like"                          # not one of the modes: answers S
    server.fail_first, server.fail_mode = 100, "429"
    ch = channel(server.url, registry, retries=0)
    verdict = judge(ch)
    assert verdict.verdict == "undetermined" and server.requests == 3


def test_more_episodes_than_the_concurrency_limit(judge_server):
    """6 episodes of one judge each, at most 2 calls in flight, each taking 0.6 s, 1 s
    deadline: 2 answer, 2 are cut at the deadline, 2 never get a slot (overloaded); every
    episode returns within its bound, the endpoint never sees more than 2 calls, and once the
    cut calls end the channel serves again."""
    registry = CollectorRegistry()
    server = judge_server(delay_s=0.6)
    ch = channel(server.url, registry, k=1, concurrency=2, deadline_s=1.0, retries=0)

    def episode(_):
        return timed(ch)
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(episode, range(6)))
    assert all(elapsed < 1.5 for _, elapsed in results), [e for _, e in results]
    verdicts = sorted(v.verdict for v, _ in results)
    assert len(verdicts) == 6 and set(verdicts) <= {"success", "undetermined"}
    assert server.max_in_flight <= 2
    calls = {o: value(registry, "consolerl_reward_judge_calls_total", outcome=o)
             for o in ("ok", "timeout", "overloaded")}
    assert sum(calls.values()) == 6, calls
    assert calls["ok"] >= 1 and calls["overloaded"] >= 1, calls
    assert verdicts.count("success") == calls["ok"]
    time.sleep(0.5)                                   # the cut calls end; slots come back
    verdict, elapsed = timed(ch)
    assert verdict.verdict == "success" and elapsed < 1.0


def test_channel_from_a_factory_pickles_and_lands_in_the_service_registry(judge_server):
    server = judge_server()
    ch = channel(server.url, CollectorRegistry(), concurrency=2)
    assert judge(ch).verdict == "success"             # clients built on first use
    service = RewardService([], [], None, judges=ch)
    text = generate_latest(service.registry).decode()
    for name in ("consolerl_reward_judge_calls_total", "consolerl_reward_judge_call_seconds",
                 "consolerl_reward_judge_failures_total",
                 "consolerl_reward_judge_rule_agreement_total"):
        assert name in text
    copy = pickle.loads(cloudpickle.dumps(service))  # a Ray actor's copy (cloudpickle)
    assert copy.judges.metrics is not None and copy.judges._clients is None
    assert judge(copy.judges).verdict == "success"
    assert value(copy.registry, "consolerl_reward_judge_calls_total", outcome="ok") == 3
    copy.judges.record_agreement("success", "failure")
    copy.judges.record_agreement("failure", "failure")
    copy.judges.record_agreement("success", "undetermined")
    copy.judges.record_agreement("undetermined", "success")   # not an audit: not counted
    for label in ("agree", "disagree", "undetermined"):
        assert value(copy.registry, "consolerl_reward_judge_rule_agreement_total",
                     with_rule=label) == 1


def test_a_missing_api_key_is_undetermined_not_a_crash(monkeypatch):
    monkeypatch.delenv("CONSOLERL_TEST_JUDGE_KEY", raising=False)
    factory = partial(judge_clients, "http://127.0.0.1:9", "judge", [0.0],
                      api_key_env="CONSOLERL_TEST_JUDGE_KEY")
    ch = JudgeChannel(config=JudgeConfig(k=3, deadline_s=1.0), client_factory=factory)
    verdict = judge(ch)
    assert verdict.verdict == "undetermined" and "no client" in verdict.votes[0].reason


def test_audits_are_a_stable_share():
    ch = JudgeChannel([object()], JudgeConfig(k=1, audit_fraction=0.25))
    draws = [ch.audits(f"task-{i}:1700000000") for i in range(2000)]
    assert draws == [ch.audits(f"task-{i}:1700000000") for i in range(2000)]
    assert 0.2 < sum(draws) / len(draws) < 0.3
    assert not JudgeChannel([object()], JudgeConfig(k=1)).audits("x")


def test_a_channel_pickles_as_its_recipe(judge_server):
    server = judge_server()
    ch = channel(server.url, CollectorRegistry(), concurrency=2)
    judge(ch)
    copy = pickle.loads(pickle.dumps(ch))
    assert copy._clients is None and copy.metrics is None
    assert judge(copy).verdict == "success"
