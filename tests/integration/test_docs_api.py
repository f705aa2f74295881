"""``POST /v1/docs`` and ``console-rl docs check`` against the real app (uvicorn), a real
redis-server and real headless Chromium: pages in, checked steps and drafted tasks out; hostile
pages answered clearly (no procedure, 50 MB, binary, scripts, a control of another product,
a content type not allowed); with ``run`` a job whose report merges the static check with the
runs, its HTML showing the screenshot wherever it is opened; schemathesis over the endpoint.

The documentation service is the real one (reader, checker, drafter, the committed inventories
of the local console); there is no scheduler: the test writes a job's progress the way the
scheduler does."""
from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import hypothesis
import pytest
import schemathesis
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

from consolerl.tasks import TASKS_DIR, load_suite
from infra.local_cloud import free_port
from jobsapi.app import build_app
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.cli import main
from jobsapi.schema import (SCRIPTED_MODELS, EpisodeCounts, JobCompletedEvent, JobStatusEvent,
                            Rollout, RolloutCompletedEvent, Step, VerdictCounts,
                            AuditEvent)
from jobsapi.store import JobStore
from tests.conftest import run_async
from tests.integration.api_kit import serving
from doccheck.service import DocsService
from tests.unit.docs_fakes import (NO_PROCEDURE_MD, OTHER_PRODUCT_MD, PAGE_MD, SCRIPT_HTML,
                                   STALE_MD)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "docs"
SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
ALL = ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"]
PREFIX = "t:docs"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> dict:
    book = TokenBook(tmp_path_factory.mktemp("tokens") / "tokens.json")
    return {"docs": book.create("docs", ALL, TeamQuota(queued_jobs=1000,
                                                       samples_per_job=1000)),
            "reader": book.create("docs", ["jobs:read"]), "_book": book}


@pytest.fixture(scope="module")
def url(redis_server, tokens) -> Iterator[str]:
    app = build_app(JobStore(redis_server.url, PREFIX), tokens["_book"], SUITE,
                    scheduler_required=False, sse_max_s=1.0, sse_ping_s=0.3,
                    docs=DocsService.default, models=("live", *SCRIPTED_MODELS))
    with serving(app) as base:
        yield base


def post(url, token, body, **kw) -> httpx.Response:
    return httpx.post(f"{url}/v1/docs", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {token}", **kw})


def page(name, content, kind="text/markdown") -> dict:
    return {"name": name, "content": content, "content_type": kind}


def test_pages_in_checked_steps_out(url, tokens):
    r = post(url, tokens["reader"], {"pages": [page("ram.md", PAGE_MD),
                                               page("stale.md", STALE_MD),
                                               page("other.md", OTHER_PRODUCT_MD)]})
    assert r.status_code == 200, r.text
    got = {p["name"]: p["procedures"] for p in r.json()["pages"]}
    (broken,), (stale,), (other,) = got["ram.md"], got["stale.md"], got["other.md"]
    assert [s["label"] for s in broken["steps"]] == ["ok", "ok", "ok", "missing"]
    assert broken["steps"][2]["mentions"] == [
        {"kind": "page", "text": "Users", "value": "", "field": ""},
        {"kind": "control", "text": "Create User", "value": "", "field": ""}]
    # A procedure the static check flags is not drafted: its verdict rests on that evidence.
    assert broken["verdict"]["verdict"] == "broken" and broken["task"] is None
    assert "not drafted" in broken["reason"]
    assert stale["steps"][2]["label"] == "label_differs" and \
        stale["steps"][2]["closest"] == "Create User"
    assert stale["verdict"]["verdict"] == "inconclusive"
    assert stale["task"]["id"] == stale["task_id"] and stale["task"]["success"][
        "required_events"][0]["event"] == "CreateUser"
    # A control of another product: the static check says where it is, not a 500.
    assert other["steps"][2]["label"] == "unreachable" and "VPCs" in other["steps"][2]["detail"]


def test_no_procedure_is_an_answer_not_an_error(url, tokens):
    r = post(url, tokens["reader"], {"pages": [page("notes.md", NO_PROCEDURE_MD)]})
    assert r.status_code == 200
    body = r.json()
    assert body["pages"][0]["procedures"] == [] and "no procedure" in body["pages"][0]["message"]
    assert body["message"] == "no procedure found in any page"
    r = post(url, tokens["docs"], {"pages": [page("notes.md", NO_PROCEDURE_MD)], "run": True})
    assert r.status_code == 200 and r.json()["job"] is None and "nothing to run" in \
        r.json()["message"]


def test_a_50_mb_page_is_413_with_a_clear_json_error(url, tokens):
    r = post(url, tokens["reader"], {"pages": [page("huge.md", "x" * 50_000_000)]})
    assert r.status_code == 413 and "at most 16777216 bytes" in r.json()["detail"]
    r = post(url, tokens["reader"], {"pages": [page("ok.md", PAGE_MD),
                                               page("big.md", "1. x\n" * 600_000)]})
    assert r.status_code == 413 and "'big.md'" in r.json()["detail"]


def test_binary_and_bad_content_types_are_422_naming_the_page(url, tokens):
    r = post(url, tokens["reader"], {"pages": [page("ok.md", PAGE_MD),
                                               page("shot.md", "\x89PNG\r\n\x1a\n\x00\x00")]})
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "pages", 1, "content"] and "'shot.md'" in err["msg"]
    raw = ('{"pages": [{"name": "half.md", "content": "1. \\udc80"}]}').encode()
    r = httpx.post(f"{url}/v1/docs", content=raw, timeout=30, headers={
        "Authorization": f"Bearer {tokens['reader']}", "Content-Type": "application/json"})
    assert r.status_code == 422 and "half.md" in r.text
    r = post(url, tokens["reader"], {"pages": [page("doc.pdf", "1. x", "application/pdf")]})
    assert r.status_code == 422 and "text/markdown" in r.text and "text/html" in r.text
    r = post(url, tokens["reader"], {"pages": [page("a.md", PAGE_MD)], "drift": "extra_confirm"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "drift"]


def test_html_with_scripts_is_processed_and_nothing_runs_or_is_fetched(url, tokens):
    hits: list[str] = []

    class Canary(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass
    port = free_port()
    server = http.server.HTTPServer(("127.0.0.1", port), Canary)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        html = SCRIPT_HTML.replace("127.0.0.1:9", f"127.0.0.1:{port}")
        r = post(url, tokens["reader"], {"pages": [page("ram.html", html, "text/html")]})
        time.sleep(0.3)
    finally:
        server.shutdown()
    assert r.status_code == 200
    (proc,) = r.json()["pages"][0]["procedures"]
    assert [s["label"] for s in proc["steps"]] == ["ok", "ok", "ok"]
    assert "pwned" not in json.dumps(r.json()) and hits == []


def test_running_needs_jobs_write(url, tokens):
    r = post(url, tokens["reader"], {"pages": [page("ram.md", STALE_MD)], "run": True})
    assert r.status_code == 403 and "jobs:write" in r.json()["detail"]


# ---- a run, its report and the screenshot ------------------------------------------------------
def png_of_a_page(browser) -> bytes:
    ctx = browser.new_context(viewport={"width": 320, "height": 200})
    p = ctx.new_page()
    p.set_content("<body style='background:#cde'><h1>Users</h1><button>Create User</button>")
    data = p.screenshot()
    ctx.close()
    return data


def finish(redis_url: str, job_id: str, shot: bytes) -> None:
    """What the scheduler writes for a job whose every sample passed (with a screenshot)."""
    async def go():
        store = JobStore(redis_url, PREFIX)
        try:
            job = await store.get_job(job_id)
            art = await store.put_artifact(job.team, job_id, "image/png", shot)
            await store.update_job(job_id, lambda j: j.model_copy(update={"state": "running"}))
            await store.add_event(job_id, JobStatusEvent(state="running"))
            n = 0
            for i, tid in enumerate(job.task_ids):
                for k in range(job.samples_per_task):
                    rid = f"r{i:04d}s{k:03d}"
                    await store.put_rollout(Rollout(
                        id=rid, job_id=job_id, task_id=tid, sample=k, state="completed",
                        verdict="success", reward=1.0, steps=[Step(index=0, screenshot=art)],
                        deciding_events=[AuditEvent(event_id="e1", event_name="CreateUser",
                                                    event_time="2026-11-26T00:00:00Z")]))
                    await store.add_event(job_id, RolloutCompletedEvent(
                        rollout_id=rid, task_id=tid, state="completed", verdict="success",
                        attempts=1))
                    n += 1
            episodes, verdicts = EpisodeCounts(completed=n), VerdictCounts(success=n)
            await store.update_job(job_id, lambda j: j.model_copy(update={
                "state": "completed", "episodes": episodes, "verdicts": verdicts,
                "finished_at": time.time()}))
            await store.add_event(job_id, JobStatusEvent(state="completed"))
            await store.add_event(job_id, JobCompletedEvent(state="completed",
                                                            episodes=episodes,
                                                            verdicts=verdicts))
        finally:
            await store.close()
    run_async(go())


def test_run_makes_a_job_whose_report_merges_the_static_check(url, tokens, redis_server,
                                                               browser, capsys, tmp_path):
    body = {"pages": [page("ram.md", PAGE_MD), page("stale.md", STALE_MD)], "run": True,
            "samples": 2}
    r = post(url, tokens["docs"], body, **{"Idempotency-Key": "docs-1"})
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    # Only the stale procedure is drafted and run; the broken one rests on the static check.
    assert job["samples_per_task"] == 2 and len(job["task_ids"]) == 1
    (static_only,) = r.json()["pages"][0]["procedures"]
    assert static_only["verdict"]["verdict"] == "broken" and static_only["verdict"][
        "evidence"][0]["ref"] == "4"
    again = post(url, tokens["docs"], body, **{"Idempotency-Key": "docs-1"}).json()["job"]
    assert again["id"] == job["id"]                    # the same key and body: the same job
    finish(redis_server.url, job["id"], png_of_a_page(browser))
    auth = {"Authorization": f"Bearer {tokens['docs']}"}
    rep = httpx.get(f"{url}/v1/jobs/{job['id']}/report", headers=auth, timeout=30).json()
    (stale,) = rep["procedures"]
    assert stale["verdict"] == "works_text_stale" and stale["pass_rate"] == 1.0
    assert stale["page"] == "stale.md" and stale["steps"][2]["label"] == "label_differs"
    assert rep["totals"] == {"works": 0, "works_text_stale": 1, "broken": 0,
                             "inconclusive": 0}
    # The page the command line saves shows the screenshot in a browser with no credential.
    saved = tmp_path / "report.html"
    assert main(["--url", url, "--token", tokens["docs"], "jobs", "report", job["id"],
                 "--html", str(saved)]) == 0
    capsys.readouterr()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    ctx = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        view = ctx.new_page()
        view.goto(saved.as_uri())
        view.wait_for_load_state("load")
        widths = view.eval_on_selector_all("img.screenshot",
                                           "els => els.map(e => e.naturalWidth)")
        assert len(widths) == 1 and all(w > 0 for w in widths)
        assert view.locator("li[data-label=label_differs]").count() == 1
        view.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    finally:
        ctx.close()
    assert (ARTIFACTS / "report.png").stat().st_size > 0


def test_run_with_the_replay_runs_the_procedures_that_have_a_replay_plan(url, tokens):
    body = {"pages": [page("ram.md", PAGE_MD), page("stale.md", STALE_MD)], "run": True,
            "model": "replay"}
    r = post(url, tokens["docs"], body)
    assert r.status_code == 200, r.text
    job = r.json()["job"]
    assert job["model"] == "replay" and len(job["task_ids"]) == 1
    (drafted,) = [p for pg in r.json()["pages"] for p in pg["procedures"] if p["task"]]
    assert drafted["task"]["oracle"]["family"] == "replay" and drafted["task_id"] in \
        job["task_ids"]
    # POST /v1/jobs: 'replay' only for tasks that carry a replay plan.
    auth = {"Authorization": f"Bearer {tokens['docs']}"}
    bad = httpx.post(f"{url}/v1/jobs", headers=auth, timeout=30, json={
        "tasks": {"ids": ["ram-create-user-0"]}, "model": "replay"})
    assert bad.status_code == 422 and "replay plan" in bad.text
    ok = httpx.post(f"{url}/v1/jobs", headers=auth, timeout=30, json={
        "tasks": {"inline": [drafted["task"]]}, "model": "replay"})
    assert ok.status_code == 202, ok.text


# ---- the command line -----------------------------------------------------------------------------
def test_cli_docs_check(url, tokens, redis_server, capsys, tmp_path):
    (tmp_path / "ram.md").write_text(PAGE_MD)
    (tmp_path / "stale.md").write_text(STALE_MD)
    (tmp_path / "bad.md").write_bytes(b"\xff\xfe\x00binary")
    base = ["--url", url, "--token", tokens["docs"], "docs", "check"]
    assert main([*base, str(tmp_path / "ram.md"), str(tmp_path / "stale.md"), "--json",
                 "--html", str(tmp_path / "static.html")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(p["title"], p["verdict"]) for p in out["procedures"]] == [
        ("Create a RAM user", "broken"), ("Create a RAM user", "inconclusive")]
    assert [s["label"] for s in out["procedures"][0]["steps"]] == ["ok", "ok", "ok", "missing"]
    assert "missing" in (tmp_path / "static.html").read_text()
    assert main([*base, str(tmp_path / "bad.md")]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main([*base, str(tmp_path / "ram.md"), "--samples", "2"]) == 2
    capsys.readouterr()

    stop = threading.Event()

    def scheduler():                       # completes the job --run submits
        seen: set[str] = set()
        while not stop.is_set():
            async def active():
                store = JobStore(redis_server.url, PREFIX)
                try:
                    return [j.id for j in await store.active_jobs()]
                finally:
                    await store.close()
            for jid in set(run_async(active())) - seen:
                seen.add(jid)
                finish(redis_server.url, jid, b"\x89PNG\r\n\x1a\n")
            time.sleep(0.2)
    worker = threading.Thread(target=scheduler, daemon=True)
    worker.start()
    try:
        code = main([*base, str(tmp_path / "stale.md"), "--run", "--samples", "1", "--json"])
    finally:
        stop.set()
        worker.join(5)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["state"] == "completed" and [p["verdict"] for p in out["procedures"]] == [
        "works_text_stale"]
    assert "running job_" in captured.err and "1/1" in captured.err


# ---- schemathesis over the endpoint ----------------------------------------------------------------
def test_schemathesis_on_docs(url, tokens):
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    (operation,) = [o.ok() for o in schema.get_all_operations()
                    if o.ok().path == "/v1/docs"]

    @hypothesis.given(case=operation.as_strategy())
    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    def run(case):
        case.call_and_validate(headers={"Authorization": f"Bearer {tokens['docs']}"},
                               checks=[not_a_server_error, response_schema_conformance,
                                       status_code_conformance, content_type_conformance],
                               timeout=60)
    run()
