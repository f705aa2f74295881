"""The jobs API's contract against a real Redis, without a scheduler: the auth matrix (every
endpoint x no token, wrong scope, another team), quotas answered with 429 and Retry-After,
idempotent submission, cursor pagination, validation errors that name the field, the job state
machine on cancel, and no secret in any response."""
from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from consolerl.tasks import TASKS_DIR, load_suite
from tests.conftest import run_async
from jobsapi.app import build_app
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.store import JobStore
from tests.integration.api_kit import serving

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
ALL = ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"]


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> TokenBook:
    return TokenBook(tmp_path_factory.mktemp("tokens") / "tokens.json")


@pytest.fixture(scope="module")
def tokens(book) -> dict[str, str]:
    return {
        "docs": book.create("docs", ALL, TeamQuota(concurrent_episodes=2, queued_jobs=3,
                                                   samples_per_job=20,
                                                   env_minutes_per_day=10)),
        "eval": book.create("eval", ALL),
        "reader": book.create("docs", ["jobs:read"]),
    }


@pytest.fixture
def client(redis_server, book, tokens) -> Iterator[Client]:
    redis_server.client().flushall()
    app = build_app(JobStore(redis_server.url, "t:api"), book, SUITE,
                    models=("live", "oracle", "ckpt-a"), scheduler_required=False,
                    sse_max_s=2)
    with serving(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield Client(http)


class Client:
    """httpx with the token as an argument."""

    def __init__(self, http: httpx.Client):
        self.http = http

    def request(self, method: str, url: str, token: str | None = None, **kw) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.http.request(method, url, headers=headers, **kw)


def submit(client, token, body=None, **headers):
    return client.request("POST", "/v1/jobs", token, json=body or {
        "tasks": {"ids": ["ram-create-user-0"]}, "samples_per_task": 2}, headers=headers)


def test_submit_and_read_back(client, tokens):
    r = submit(client, tokens["docs"])
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == "queued" and job["task_ids"] == ["ram-create-user-0"]
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    got = client.request("GET", f"/v1/jobs/{job['id']}", tokens["docs"]).json()
    assert got["id"] == job["id"] and got["samples_per_task"] == 2


ENDPOINTS = [
    ("POST", "/v1/jobs", "jobs:write"), ("GET", "/v1/jobs", "jobs:read"),
    ("GET", "/v1/jobs/{job}", "jobs:read"), ("POST", "/v1/jobs/{job}/cancel", "jobs:cancel"),
    ("GET", "/v1/jobs/{job}/events", "jobs:read"), ("GET", "/v1/jobs/{job}/results", "jobs:read"),
    ("GET", "/v1/jobs/{job}/rollouts/r0000s000", "jobs:read"),
    ("GET", "/v1/jobs/{job}/report", "jobs:read"), ("GET", "/v1/jobs/{job}/report.html",
                                                   "jobs:read"),
    ("GET", "/v1/artifacts/art_x", "artifacts:read"), ("GET", "/v1/tasks", "jobs:read"),
    ("POST", "/v1/tasks/validate", "jobs:read"), ("GET", "/v1/quota", "jobs:read"),
    ("GET", "/v1/models", "jobs:read"), ("POST", "/v1/docs", "jobs:read"),
]


def test_auth_matrix(client, tokens):
    job = submit(client, tokens["docs"]).json()["id"]
    bodies = {"/v1/jobs": {"tasks": {"ids": ["ram-create-user-0"]}},
              "/v1/tasks/validate": {"tasks": []},
              "/v1/docs": {"pages": [{"name": "a.md", "content": "# A"}]}}
    for method, path, scope in ENDPOINTS:
        url = path.format(job=job)
        kw = {"json": bodies[path]} if path in bodies else {}
        assert client.request(method, url, None, **kw).status_code == 401, url
        assert client.request(method, url, "crl_not-a-token", **kw).status_code == 401, url
        r = client.request(method, url, tokens["reader"], **kw)
        if scope != "jobs:read":
            assert r.status_code == 403, (url, r.status_code)
        if "{job}" in path:
            # Another team's job is not found, never forbidden.
            assert client.request(method, url, tokens["eval"], **kw).status_code == 404, url


def test_idempotency_key(client, tokens):
    body = {"tasks": {"ids": ["ram-create-user-0"]}}
    a = submit(client, tokens["docs"], body, **{"Idempotency-Key": "k1"})
    b = submit(client, tokens["docs"], body, **{"Idempotency-Key": "k1"})
    assert a.status_code == b.status_code == 202 and a.json()["id"] == b.json()["id"]
    other = submit(client, tokens["docs"], {"tasks": {"ids": ["ecs-add-rule-0"]}},
                   **{"Idempotency-Key": "k1"})
    assert other.status_code == 422 and "Idempotency-Key" in other.text
    # Keys are per team: the same key elsewhere is a new job.
    c = submit(client, tokens["eval"], body, **{"Idempotency-Key": "k1"})
    assert c.status_code == 202 and c.json()["id"] != a.json()["id"]
    listed = client.request("GET", "/v1/jobs", tokens["docs"]).json()["data"]
    assert [j["id"] for j in listed] == [a.json()["id"]]


def test_quotas_answer_429_with_retry_after(client, tokens, redis_server):
    too_big = submit(client, tokens["docs"], {"tasks": {"ids": ["ram-create-user-0"]},
                                              "samples_per_task": 21})
    assert too_big.status_code == 429 and "20" in too_big.json()["detail"]
    assert int(too_big.headers["retry-after"]) > 0
    for _ in range(3):
        assert submit(client, tokens["docs"]).status_code == 202
    full = submit(client, tokens["docs"])
    assert full.status_code == 429 and int(full.headers["retry-after"]) > 0
    assert "queued" in full.json()["detail"]
    # Another team is not affected.
    assert submit(client, tokens["eval"]).status_code == 202
    quota = client.request("GET", "/v1/quota", tokens["docs"]).json()
    assert quota["used"]["queued_jobs"] == 3 and quota["queued_jobs"] == 3
    # Env-minutes per day: spent -> 429 until midnight UTC.
    newest = client.request("GET", "/v1/jobs", tokens["docs"]).json()["data"][0]["id"]
    client.request("POST", f"/v1/jobs/{newest}/cancel", tokens["docs"])   # a queue slot back
    run_async(_spend(redis_server.url, "docs", 11 * 60))
    spent = submit(client, tokens["docs"])
    assert spent.status_code == 429 and "env-minutes" in spent.json()["detail"]
    assert 0 < int(spent.headers["retry-after"]) <= 86401


async def _spend(url: str, team: str, seconds: float) -> None:
    store = JobStore(url, "t:api")
    await store.add_usage(team, seconds)
    await store.close()


def test_pagination(client, tokens):
    ids = [submit(client, tokens["eval"]).json()["id"] for _ in range(5)]
    seen, after = [], None
    while True:
        page = client.request("GET", "/v1/jobs", tokens["eval"],
                              params={"limit": 2, **({"after": after} if after else {})}).json()
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == ids[::-1]


def test_validation_names_the_field(client, tokens):
    cases = [
        ({"tasks": {"ids": ["no-such-task"]}}, "tasks.ids[0]"),
        ({"tasks": {"id_regex": "^zzz"}}, "tasks.id_regex"),
        ({"tasks": {"id_regex": "("}}, "id_regex"),
        ({"tasks": {"split": "train", "ids": ["ram-create-user-0"]}}, "exactly one"),
        ({"tasks": {"inline": [{"schema": 1, "id": "x"}]}}, "tasks.inline[0]"),
        ({"tasks": {"ids": ["ram-create-user-0"]}, "model": "gpt-9"}, "model"),
        ({"tasks": {"ids": ["ram-create-user-0"]}, "samples_per_task": 0}, "samples_per_task"),
        ({"tasks": {"ids": ["ram-create-user-0"]}, "sampling": {"temperature": 9}},
         "temperature"),
        ({"tasks": {"ids": ["ram-create-user-0"]}, "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        r = submit(client, tokens["eval"], body)
        assert r.status_code == 422, (body, r.status_code)
        # Every error names its field as FastAPI's do: loc (body, tasks, ids, 0) and a msg.
        named = [".".join(str(p) for p in e["loc"][1:]) + ": " + e["msg"]
                 for e in r.json()["detail"]]
        wanted = field.replace("[", ".").replace("]", "")
        assert any(wanted in n for n in named), (field, named)
    inline = dict(json.loads(json.dumps(_task_dict("ram-create-user-0"))), id="my-procedure")
    ok = submit(client, tokens["eval"], {"tasks": {"inline": [inline]}})
    assert ok.status_code == 202 and ok.json()["task_ids"] == ["my-procedure"]
    v = client.request("POST", "/v1/tasks/validate", tokens["eval"],
                       json={"tasks": [inline, {"schema": 1}]}).json()
    assert v["valid"] is False and v["task_ids"] == ["my-procedure"]
    assert v["errors"] and v["errors"][0].startswith("tasks[1]")


def test_the_oracle_runs_catalogue_tasks_only(client, tokens):
    """``model: oracle`` (the scripted teacher) for catalogue tasks; an inline task, or a
    documentation run (whose drafted tasks are inline), is a 422 at ``model`` saying why."""
    ok = submit(client, tokens["eval"], {"tasks": {"id_regex": "^ram-create-user-[01]$"},
                                         "model": "oracle"})
    assert ok.status_code == 202, ok.text
    assert ok.json()["model"] == "oracle" and len(ok.json()["task_ids"]) == 2
    inline = dict(_task_dict("ram-create-user-0"), id="my-procedure")
    for path, body in (
            ("/v1/jobs", {"tasks": {"inline": [inline]}, "model": "oracle"}),
            ("/v1/docs", {"pages": [{"name": "p.md", "content": "1. Click **Create User**.",
                                     "content_type": "text/markdown"}],
                          "run": True, "model": "oracle"})):
        r = client.request("POST", path, tokens["eval"], json=body)
        assert r.status_code == 422, (path, r.status_code, r.text)
        (error,) = r.json()["detail"]
        assert error["loc"] == ["body", "model"], error
        assert "catalogue tasks" in error["msg"] and "inline" in error["msg"], error


def _task_dict(task_id: str) -> dict:
    import yaml
    return yaml.safe_load(open(SUITE[task_id].source))


def test_cancel_is_idempotent_and_final(client, tokens):
    job = submit(client, tokens["docs"]).json()["id"]
    a = client.request("POST", f"/v1/jobs/{job}/cancel", tokens["docs"])
    b = client.request("POST", f"/v1/jobs/{job}/cancel", tokens["docs"])
    assert a.status_code == b.status_code == 200
    assert a.json()["state"] == b.json()["state"] == "cancelled"
    events = client.request("GET", f"/v1/jobs/{job}/events", tokens["docs"]).text
    assert "event: job.completed" in events and events.count("event: job.completed") == 1


def test_catalog_and_no_secrets(client, tokens, book):
    tasks = client.request("GET", "/v1/tasks", tokens["docs"], params={"product": "ram"}).json()
    assert tasks["data"] and all(t["product"] == "ram" for t in tasks["data"])
    text = json.dumps([client.request("GET", p, tokens["docs"]).text
                       for p in ("/v1/jobs", "/v1/quota", "/v1/models", "/metrics")])
    for secret in tokens.values():
        assert secret not in text
    assert "consolerl_api_requests_total" in client.request("GET", "/metrics").text
    stored = book.path.read_text()
    assert all(t not in stored for t in tokens.values())


def test_jobs_and_events_survive_a_redis_restart(client, tokens, redis_server):
    job = submit(client, tokens["docs"]).json()
    client.request("POST", f"/v1/jobs/{job['id']}/cancel", tokens["docs"])
    before = client.request("GET", f"/v1/jobs/{job['id']}/events", tokens["docs"]).text
    redis_server.stop()
    redis_server.start()            # AOF brings everything back; the API's client reconnects
    after = client.request("GET", f"/v1/jobs/{job['id']}", tokens["docs"])
    assert after.status_code == 200 and after.json()["state"] == "cancelled"
    replay = client.request("GET", f"/v1/jobs/{job['id']}/events", tokens["docs"]).text
    assert replay == before and "job.completed" in replay


def test_the_store_down_is_503_not_500(tokens, book, redis_server, tmp_path):
    from infra.redis_local import RedisServer
    gone = RedisServer(tmp_path / "gone").start()
    app = build_app(JobStore(gone.url, "t:api", retries=2), book, SUITE,
                    scheduler_required=False)
    gone.stop()
    with serving(app) as url:
        r = httpx.get(f"{url}/v1/quota", headers={"Authorization": f"Bearer {tokens['docs']}"},
                      timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"]
        assert httpx.get(f"{url}/readyz", timeout=60).status_code == 503
