"""The jobs API against the real stack: Redis, the local cloud, Chromium env workers, Ray, the
tiny model, the reward service, the scheduler actor and the HTTP actor (as ``make serve`` runs
them). Submit -> events -> results -> report (and the HTML report in a real browser); cancel
mid-run (nothing leaked, every account released); the API restarted mid-job (the job finishes,
the event stream resumes by Last-Event-ID with no gap and no duplicate)."""
from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from httpx_sse import connect_sse

torch = pytest.importorskip("torch")

from cluster.config import JobConfig  # noqa: E402
from cluster.serve import Stack  # noqa: E402
from consolerl.accounts import load_accounts  # noqa: E402
from consolerl.chromium import chromium_path  # noqa: E402
from consolerl.config import load_config  # noqa: E402
from env_workers.accounts import PoolConfig  # noqa: E402
from env_workers.leases import AccountPool  # noqa: E402
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE  # noqa: E402
from infra.local_cloud import free_port  # noqa: E402
from jobsapi.auth import TokenBook  # noqa: E402
from rollout_service.models import tiny_model  # noqa: E402
from tests.conftest import CloudServer, _server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
SCOPES = ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"]


@pytest.fixture(scope="module")
def api_cloud(tmp_path_factory) -> Iterator[CloudServer]:
    yield from _server(tmp_path_factory, "api-cloud", ["--lookup-qps", "0", "--transition",
                                                      "0.3", "--network-ready", "0.1"])


@pytest.fixture(scope="module")
def stack(api_cloud, redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-stack")
    model = tiny_model(tmp / "tiny")
    tiny_model(tmp / "final", seed=1)     # tmp is also a run folder, registered as "ckpt"
    config = load_config(JobConfig, ROOT / "configs" / "serve.yaml", [
        f"cloud.endpoint={api_cloud.endpoint}", f"env.worker.console_url={api_cloud.url}",
        "env.pool.key_prefix=test:api:pool", "env.num_cpus_per_worker=0.5",
        f"policy.model={model}", "policy.backend=transformers",
        "policy.num_cpus_per_replica=0.5", "agent.max_new_tokens=12",
        f"stream.url={redis_server.url}", f"api.tokens_file={tmp / 'tokens.json'}",
        f"api.port={free_port()}", "api.workers=2", "api.prefix=test:api",
        "api.scheduler.step_event_interval_s=0.2", f"api.models={{ckpt: {tmp}}}",
        "trail.qps=20", "trail.settle_s=20", "trail.poll_s=0.25", "trail.clock_skew_s=5"])
    token = TokenBook(Path(config.api.tokens_file)).create("docs", SCOPES)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    s = Stack(config)
    try:
        s.start_scheduler()
        s.start_http()
        yield s, token
    finally:
        s.stop()
        ray.shutdown()


def client(stack) -> httpx.Client:
    s, token = stack
    return httpx.Client(base_url=s.url, timeout=60,
                        headers={"Authorization": f"Bearer {token}"})


def submit(http: httpx.Client, task: str, samples: int, max_steps: int) -> str:
    r = http.post("/v1/jobs", json={"tasks": {"ids": [task]}, "samples_per_task": samples,
                                    "sampling": {"temperature": 1.0, "max_steps": max_steps}})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def events(http: httpx.Client, job: str, last: str | None = None, stop_after: int = 0,
           timeout_s: float = 600) -> list[tuple[str, str, str]]:
    """(id, type, data) until job.completed (or ``stop_after`` events)."""
    got: list[tuple[str, str, str]] = []
    headers = {"Last-Event-ID": last} if last else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with connect_sse(http, "GET", f"/v1/jobs/{job}/events", headers=headers) as source:
            assert source.response.status_code == 200
            for e in source.iter_sse():
                if e.event == "message" and not e.data:
                    continue     # httpx-sse turns a keep-alive comment into an empty event
                got.append((e.id, e.event, e.data))
                headers = {"Last-Event-ID": e.id}
                if e.event == "job.completed" or (stop_after and len(got) >= stop_after):
                    return got
    raise AssertionError(f"no job.completed within {timeout_s} s: {got[-5:]}")


def wait_state(http: httpx.Client, job: str, states: set[str], timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = http.get(f"/v1/jobs/{job}").json()
        if body["state"] in states:
            return body
        time.sleep(0.3)
    raise AssertionError(f"job {job} never reached {states}: {body}")


def no_leases(redis_url: str) -> int:
    pool = AccountPool.from_config(PoolConfig(redis_url=redis_url, key_prefix="test:api:pool"))
    try:
        deadline = time.monotonic() + 30
        while pool.status().leased and time.monotonic() < deadline:
            time.sleep(0.5)
        return pool.status().leased
    finally:
        pool.close()


def read_report(url: str, token: str) -> None:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path())
        try:
            page = browser.new_page(extra_http_headers={"Authorization": f"Bearer {token}"})
            page.goto(url)
            assert page.locator("h1").inner_text() == "Documentation check"
            assert "ram-create-user-0" in page.content()
            images = page.locator("img")
            for i in range(images.count()):
                assert images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
            page.screenshot(path=str(ARTIFACTS / "api-report.png"), full_page=True)
        finally:
            browser.close()


def test_submit_events_results_report(stack, redis_server):
    with client(stack) as http:
        job = submit(http, "ram-create-user-0", 2, 3)
        stream = events(http, job)
        kinds = [k for _, k, _ in stream]
        ids = [i for i, _, _ in stream]
        assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
        assert len(set(ids)) == len(ids), [(i, k) for i, k, _ in stream]
        assert kinds[0] == "job.status" and kinds[-1] == "job.completed"
        assert kinds.count("rollout.started") >= 2 and kinds.count("rollout.completed") >= 2
        assert "task.summary" in kinds and "rollout.step" in kinds
        body = http.get(f"/v1/jobs/{job}").json()
        assert body["state"] == "completed", body
        assert body["episodes"]["completed"] + body["episodes"]["failed"] == 2
        assert body["usage"]["env_seconds"] > 0 and body["usage"]["tokens"] > 0
        assert body["policy_version"] == 0
        results = http.get(f"/v1/jobs/{job}/results").json()
        assert [r["task_id"] for r in results["data"]] == ["ram-create-user-0"] * 2
        done = [r for r in results["data"] if r["state"] == "completed"]
        assert done, results
        # A random model does not do the procedure: a completed episode, verdict failure.
        assert {r["verdict"] for r in done} <= {"failure", "infeasible"}
        only = http.get(f"/v1/jobs/{job}/results", params={"verdict": "success"}).json()
        assert only["data"] == []
        rollout = http.get(f"/v1/jobs/{job}/rollouts/{done[0]['id']}").json()
        assert rollout["steps"] and rollout["steps"][0]["url"].startswith("http")
        assert rollout["leaked"] == [] and rollout["attempts"][0]["worker"] is not None
        # Every page the agent saw has a screenshot (a final stop() may leave none of its own).
        shots = [s["screenshot"] for s in rollout["steps"] if s["screenshot"]]
        assert shots, rollout["steps"]
        shot = shots[-1]
        image = http.get(f"/v1/artifacts/{shot}")
        assert image.status_code == 200 and image.headers["content-type"] == "image/jpeg"
        assert image.content[:2] == b"\xff\xd8"
        report = http.get(f"/v1/jobs/{job}/report").json()
        (proc,) = report["procedures"]
        assert proc["task_id"] == "ram-create-user-0" and proc["passes"] == 0
        assert proc["verdict"] in ("broken", "inconclusive")
        if proc["verdict"] == "broken":
            assert proc["failure"]["step"]["index"] >= 1 and proc["failure"]["screenshot"]
        html = http.get(f"/v1/jobs/{job}/report", headers={"Accept": "text/html"})
        assert html.headers["content-type"].startswith("text/html")
        assert "Documentation check" in html.text
        metrics = httpx.get(f"{stack[0].url}/metrics").text
        for name in ("consolerl_api_requests_total", "consolerl_api_request_seconds_bucket",
                     "consolerl_api_sse_connections", "consolerl_api_jobs",
                     "consolerl_api_queue_wait_seconds_bucket"):
            assert name in metrics, name
        assert stack[1] not in metrics
        # No account secret (passwords, AccessKey secrets) in anything a team can read.
        seen = json.dumps(stream) + json.dumps(rollout) + json.dumps(report) + html.text + \
            json.dumps(results) + http.get(f"/v1/jobs/{job}").text + metrics
        for account in load_accounts(DEFAULT_ACCOUNTS_FILE):
            assert account.password not in seen and account.access_key_secret not in seen
    assert no_leases(redis_server.url) == 0
    # The page, read in a real browser, with its screenshot loaded through the API (a browser
    # of its own, on a thread: the session's sync Playwright holds the main thread's loop).
    ARTIFACTS.mkdir(exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(read_report, f"{stack[0].url}/v1/jobs/{job}/report.html", stack[1]).result()
    assert (ARTIFACTS / "api-report.png").stat().st_size > 1000


def test_cancel_mid_run_releases_everything(stack, redis_server):
    with client(stack) as http:
        job = submit(http, "ecs-add-rule-0", 3, 20)
        first = events(http, job, stop_after=1)
        seen = first
        while not any(k == "rollout.step" for _, k, _ in seen):
            seen += events(http, job, last=seen[-1][0], stop_after=1)
        r = http.post(f"/v1/jobs/{job}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
        again = http.post(f"/v1/jobs/{job}/cancel")
        assert again.status_code == 200
        body = wait_state(http, job, {"cancelled", "completed"})
        assert body["state"] == "cancelled", body
        rollouts = [http.get(f"/v1/jobs/{job}/rollouts/{r['id']}").json()
                    for r in http.get(f"/v1/jobs/{job}/results").json()["data"]]
        assert any(r["state"] == "cancelled" for r in rollouts)
        assert all(r["state"] in ("cancelled", "completed") for r in rollouts), rollouts
        assert all(r["leaked"] == [] for r in rollouts)
        assert http.post(f"/v1/jobs/{job}/cancel").json()["state"] == "cancelled"
    assert no_leases(redis_server.url) == 0


def test_api_restart_mid_job_loses_nothing(stack, redis_server):
    s, _ = stack
    with client(stack) as http:
        job = submit(http, "ram-create-user-0", 2, 3)
        before = events(http, job, stop_after=3)
    s.stop_http()                                # the API goes away mid-job...
    time.sleep(1.0)
    s.start_http()                               # ...and comes back on the same address
    with client(stack) as http:
        after = events(http, job, last=before[-1][0])
        assert wait_state(http, job, {"completed"})["state"] == "completed"
        replay = events(http, job)
    seen = before + after
    assert [i for i, _, _ in seen] == [i for i, _, _ in replay]      # no gap, no duplicate
    assert seen[-1][1] == "job.completed"
    assert no_leases(redis_server.url) == 0


def test_a_registered_run_folder_serves_a_job(stack):
    with client(stack) as http:
        assert http.get("/v1/models").json()["data"] == ["live", "oracle", "replay", "ckpt"]
        r = http.post("/v1/jobs", json={"tasks": {"ids": ["ram-create-user-0"]},
                                        "model": "ckpt", "sampling": {"max_steps": 1}})
        assert r.status_code == 202, r.text
        body = wait_state(http, r.json()["id"], {"completed", "failed"})
        assert body["state"] == "completed" and body["model"] == "ckpt"
        assert body["episodes"]["completed"] == 1 and body["usage"]["tokens"] > 0
