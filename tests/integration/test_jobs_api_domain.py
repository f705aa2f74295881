"""Outside input that reaches Redis or a regex engine, on every endpoint of the jobs API, against
a real Redis:

- every parameter of the OpenAPI document (path, query, header) is in :data:`PARAMS`, with the
  domain it is checked against, so a new parameter fails here until someone says where it goes;
- each value out of its domain (stream ids and counts past 2^64, negative, malformed, huge, key
  parts with ``:`` or glob characters) is a complete 422 JSON answer whose ``loc`` names the
  parameter: never a 500, never a 200 stream that drops mid-body (Redis' "Invalid stream ID");
- a value in the domain is never refused (the checks are not stricter than the domain);
- ``tasks.id_regex`` runs in RE2: a pattern that backtracks for seconds in Python's ``re`` is
  answered in milliseconds while ``/healthz`` answers beside it, and what RE2 cannot run
  (backreferences, lookaround, a program over the size limit) is a 422 saying why;
- ``POST /v1/tasks/validate`` and ``POST /v1/jobs`` refuse an inline start page that leaves
  ``/console/`` (what the env worker refuses when the episode starts).
"""
from __future__ import annotations

import json
import re
import statistics
import threading
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import yaml

from consolerl.tasks import TASKS_DIR, load_suite
from jobsapi.app import build_app
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.store import JobStore
from tests.integration.api_kit import serving

SUITE = {t.id: t for t in load_suite(TASKS_DIR)}
ALL = ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"]
U64 = 2 ** 64 - 1
HUGE = "9" * 5000          # under h11's header limit, over every field's

# ---- the domains ------------------------------------------------------------------------------
# kind -> (values out of the domain: 422 naming the parameter, values in it: never refused).
STREAM_ID_OUT = [
    "99999999999999999999-0", "0-99999999999999999999", "99999999999999999999",
    str(U64 + 1), f"{U64 + 1}-0", f"0-{U64 + 1}", f"{U64}-{U64 + 1}", "1" + "0" * 40,
    "-1", "-1-0", "0--1", "1-2-3", "1-", "-", "+", "$", ">", "*", "1e3", "0x10", " 1", "1 ",
    "１", "1.5", "9" * 64, "0" * 65, HUGE]
STREAM_ID_IN = ["0", "0-0", "1", "5-1", str(U64), f"{U64}-{U64}", "000123-0007",
                "0" * 40 + "1-1"]
KEY_PART_OUT = ["a:b", "job_*", "job?1", "[a]", "a b", "ä", "x" * 65, HUGE, "{x}", "a\\b",
                "a.b", "%00", "'", "\""]
KEY_PART_IN = ["job_0123456789abcdef", "r0000s000", "art_0", "-1", "A_b-9", "x" * 64]
# (pydantic reads " 5", "1.0" and "1_000" as integers: in range, they are counts.)
COUNT_OUT = ["-1", "0", "-0", str(U64 + 1), str(2 ** 63), "1e3", "abc", "", "0x10",
             "99999999999999999999", HUGE]
HASHED_OUT = ["k" * 256, HUGE]
HASHED_IN = ["k", "a:b*?[x]", "-1", str(U64 + 1), "k" * 255]
# Hostile values for parameters that never reach Redis: answered, never a 5xx.
HOSTILE = [*STREAM_ID_OUT, *KEY_PART_OUT, *COUNT_OUT]

DOMAINS: dict[str, tuple[list[str], list[str]]] = {
    "stream_id": (STREAM_ID_OUT, STREAM_ID_IN),
    "key_part": (KEY_PART_OUT, KEY_PART_IN),
    "count": (COUNT_OUT, ["1", "20", "001"]),
    "hashed": (HASHED_OUT, HASHED_IN),
}

# Every parameter of the document: (operation id, where, name) -> its domain, or why it does not
# reach Redis ("filter: ..."; those get the hostile values and must answer without a 5xx).
PARAMS: dict[tuple[str, str, str], str] = {
    ("submit_job", "header", "idempotency-key"): "hashed",
    ("list_jobs", "query", "after"): "key_part",
    ("list_jobs", "query", "limit"): "count",
    ("get_job", "path", "job_id"): "key_part",
    ("cancel_job", "path", "job_id"): "key_part",
    ("job_events", "path", "job_id"): "key_part",
    ("job_events", "header", "Last-Event-ID"): "stream_id",
    ("job_events", "query", "after"): "stream_id",
    ("job_results", "path", "job_id"): "key_part",
    ("job_results", "query", "verdict"): "filter: compared with each rollout's verdict",
    ("job_results", "query", "task_id"): "filter: compared with each rollout's task id",
    ("job_results", "query", "after"): "key_part",
    ("job_results", "query", "limit"): "count",
    ("get_rollout", "path", "job_id"): "key_part",
    ("get_rollout", "path", "rollout_id"): "key_part",
    ("job_report", "path", "job_id"): "key_part",
    ("job_report_html", "path", "job_id"): "key_part",
    ("get_artifact", "path", "artifact_id"): "key_part",
    ("check_docs", "header", "idempotency-key"): "hashed",
    ("list_tasks", "query", "product"): "filter: compared with the catalog's products",
    ("list_tasks", "query", "split"): "filter: compared with the catalog's splits",
    ("list_tasks", "query", "q"): "filter: a substring of the catalog's ids and titles",
}


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> TokenBook:
    return TokenBook(tmp_path_factory.mktemp("tokens") / "tokens.json")


@pytest.fixture(scope="module")
def token(book) -> str:
    return book.create("domain", ALL, TeamQuota(queued_jobs=10_000, samples_per_job=10_000,
                                                env_minutes_per_day=10_000))


@pytest.fixture(scope="module")
def app(redis_server, book):
    return build_app(JobStore(redis_server.url, "dom:api"), book, SUITE,
                     scheduler_required=False, sse_max_s=0.5, sse_ping_s=0.25)


@pytest.fixture(scope="module")
def api(app, token) -> Iterator[httpx.Client]:
    with serving(app) as url, httpx.Client(base_url=url, timeout=30, headers={
            "Authorization": f"Bearer {token}"}) as http:
        yield http


@pytest.fixture(scope="module")
def job(api) -> str:
    """A cancelled job (its stream ends at once with ``job.completed``)."""
    r = api.post("/v1/jobs", json={"tasks": {"ids": ["ram-create-user-0"]}})
    assert r.status_code == 202, r.text
    api.post(f"/v1/jobs/{r.json()['id']}/cancel")
    return r.json()["id"]


def operations(app) -> dict[str, tuple[str, str, list[dict]]]:
    """operation id -> (method, path, parameters) of the app's document."""
    out = {}
    for path, item in app.openapi()["paths"].items():
        for method, op in item.items():
            out[op["operationId"]] = (method.upper(), path, op.get("parameters", []))
    return out


def test_the_table_names_every_parameter_of_the_document(app):
    """A parameter added to an endpoint must be added to PARAMS with its domain (and checked
    by the API against it) or with the reason it never reaches Redis."""
    found = {(op_id, p["in"], p["name"]) for op_id, (_, _, params) in operations(app).items()
             for p in params}
    assert found == set(PARAMS), (f"not in PARAMS: {sorted(found - set(PARAMS))}; "
                                  f"no longer in the document: {sorted(set(PARAMS) - found)}")
    for key, kind in PARAMS.items():
        assert kind in DOMAINS or kind.startswith("filter: "), (key, kind)


def _call(api: httpx.Client, app, op_id: str, where: str, name: str, value: str,
          job: str) -> tuple[int | None, str, str]:
    """(status or None for a dropped connection, content type, body) of ``op_id`` with the
    parameter ``name`` set to ``value`` and every other parameter valid."""
    method, path, params = operations(app)[op_id]
    path_values = {"job_id": job, "rollout_id": "r0000s000", "artifact_id": "art_0"}
    if where == "path":
        path_values[name] = value
    url = path.format(**{k: quote(v, safe="") for k, v in path_values.items()})
    query = {name: value} if where == "query" else {}
    # A header's value as UTF-8 bytes (httpx would refuse non-ASCII text).
    headers = {name: value.encode()} if where == "header" else {}
    body = {"submit_job": {"tasks": {"ids": ["ram-create-user-0"]}},
            "check_docs": {"pages": [{"name": "a.md", "content": "no procedure here"}]}
            }.get(op_id)
    try:
        r = api.request(method, url, params=query, headers=headers,
                        **({"json": body} if body is not None else {}))
        return r.status_code, r.headers.get("content-type", ""), r.text
    except httpx.RemoteProtocolError:
        return None, "", ""


def _names(where: str, name: str, text: str) -> bool:
    """Whether a 422 body's ``detail`` has an entry whose ``loc`` is (where, name)."""
    try:
        detail = json.loads(text)["detail"]
    except (ValueError, KeyError, TypeError):
        return False
    return any([str(p).lower() for p in e.get("loc", [])] == [where, name.lower()]
               for e in detail if isinstance(e, dict))


def test_values_out_of_the_domain_are_422_naming_the_parameter(api, app, job):
    wrong = []
    for (op_id, where, name), kind in PARAMS.items():
        out = DOMAINS[kind][0] if kind in DOMAINS else HOSTILE
        for value in out:
            if where == "header" and value != value.strip():
                continue           # HTTP strips a header value's surrounding spaces
            status, ctype, text = _call(api, app, op_id, where, name, value, job)
            what = f"{op_id} {where} {name}={value[:40]!r}{'...' if len(value) > 40 else ''}"
            if status is None:
                wrong.append(f"{what}: the connection dropped")
            elif status >= 500:
                wrong.append(f"{what}: {status}")
            elif kind in DOMAINS and not (status == 422 and ctype.startswith(
                    "application/json") and _names(where, name, text)):
                wrong.append(f"{what}: {status} {ctype} {text[:120]!r}")
    assert not wrong, f"{len(wrong)} answers:\n" + "\n".join(wrong)


def test_values_in_the_domain_are_not_refused(api, app, job):
    wrong = []
    for (op_id, where, name), kind in PARAMS.items():
        if kind not in DOMAINS:
            continue
        for value in DOMAINS[kind][1]:
            status, ctype, text = _call(api, app, op_id, where, name, value, job)
            if status is None or status >= 500 or status == 422 and _names(where, name, text):
                wrong.append(f"{op_id} {where} {name}={value[:40]!r}: {status} {text[:160]!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("where,value", [
    ("header", "99999999999999999999-0"), ("header", "0-99999999999999999999"),
    ("query", "99999999999999999999"), ("query", "0-99999999999999999999")])
def test_a_stream_id_past_2_64_is_refused_before_the_stream_starts(api, job, where, value):
    """The issue's examples: a 422 JSON answer naming the header (or ``after``), not a
    ``200 text/event-stream`` that drops when Redis refuses the id."""
    kw = {"headers": {"Last-Event-ID": value}} if where == "header" else {
        "params": {"after": value}}
    with api.stream("GET", f"/v1/jobs/{job}/events", **kw) as r:
        assert r.status_code == 422 and r.headers["content-type"] == "application/json"
        body = json.loads(r.read())
    named = "Last-Event-ID" if where == "header" else "after"
    assert body["detail"][0]["loc"] == [where, named]
    assert "18446744073709551615" in body["detail"][0]["msg"]


def test_stream_ids_resume_in_the_whole_domain(api, job):
    """Redis' own id domain: ``<ms>-<seq>`` or ``<ms>`` (``<ms>-0``), leading zeros allowed,
    up to 2^64-1 each; resuming after an id gives exactly the events after it."""
    events = _events(api, job, {})
    assert [e["event"] for e in events][-1] == "job.completed" and len(events) >= 3
    first = events[0]["id"]
    ms, seq = first.split("-")
    assert [e["id"] for e in _events(api, job, {"Last-Event-ID": first})] == \
        [e["id"] for e in events[1:]]
    padded = f"{int(ms):030d}-{int(seq):05d}"
    assert [e["id"] for e in _events(api, job, {}, {"after": padded})] == \
        [e["id"] for e in events[1:]]
    # The header wins over ?after= (both valid); past the last id there is nothing.
    assert _events(api, job, {"Last-Event-ID": f"{U64}-{U64}"}, {"after": "0"}) == []


def _events(api: httpx.Client, job: str, headers: dict, params: dict | None = None
            ) -> list[dict]:
    r = api.get(f"/v1/jobs/{job}/events", headers=headers, params=params or {})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    out, current = [], {}
    for line in r.text.splitlines():
        if not line:
            if "id" in current:
                out.append(current)
            current = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            current[key] = value
    return out


# ---- patterns --------------------------------------------------------------------------------
# 1.55 s in Python's re on the machine, about 4x per two more repetitions.
CATASTROPHIC = "^(?:.|.){0,22}!"


def test_a_catastrophic_pattern_is_answered_at_once_and_healthz_is_unaffected(api):
    """Measured over HTTP on a 2-core machine shared with other work: the answer in 12-17 ms
    with RE2, /healthz beside it at most 4 ms; with Python's re, 8.3 s and /healthz waited
    8.2 s for it."""
    answers: dict[str, float] = {}

    def submit() -> None:
        t0 = time.perf_counter()
        r = api.post("/v1/jobs", json={"tasks": {"id_regex": CATASTROPHIC}})
        answers["submit"] = time.perf_counter() - t0
        answers["status"] = r.status_code
        answers["text"] = r.text

    healthz = []
    with httpx.Client(base_url=str(api.base_url), timeout=30) as other:
        other.get("/healthz")                              # a warm connection
        thread = threading.Thread(target=submit)
        thread.start()
        while thread.is_alive() or len(healthz) < 5:
            t0 = time.perf_counter()
            assert other.get("/healthz").status_code == 200
            healthz.append(time.perf_counter() - t0)
            if len(healthz) > 200:
                break
        thread.join()
    print(f"catastrophic pattern answered in {answers['submit'] * 1000:.1f} ms; /healthz "
          f"{len(healthz)} answers beside it, slowest {max(healthz) * 1000:.1f} ms, median "
          f"{statistics.median(healthz) * 1000:.1f} ms")
    # No task id has a "!": a 422 saying so, naming the field.
    assert answers["status"] == 422, answers
    assert json.loads(answers["text"])["detail"][0]["loc"] == ["body", "tasks", "id_regex"]
    assert answers["submit"] < 0.5, answers
    assert max(healthz) < 0.5, healthz


@pytest.mark.parametrize("pattern,why", [
    (r"(ram)-\1", "backreference"), (r"(?P<p>ram)(?P=p)", "backreference"),
    (r"ram(?=-create)", "lookaround"), (r"(?<!x)ram", "lookaround"),
    (r"(?!ecs)ram", "lookaround"), (r"(?<=-)user", "lookaround"),
    (r"\pL{1000}", "too large"), (r"[\p{L}\p{N}]{999}x", "too large"),
    (r"(ram", "missing )"), ("a{1001}", "repetition"), (r"ram\Z", "\\z"),
    ("x" * 201, "200"), ("\ud800", "Unicode"),
])
def test_a_pattern_re2_cannot_run_is_422_saying_why(api, pattern, why):
    # JSON as Python writes it: a lone surrogate as its \u escape (httpx's encoder refuses it)
    r = api.post("/v1/jobs", content=json.dumps({"tasks": {"id_regex": pattern}}),
                 headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(e["loc"][-2:] == ["tasks", "id_regex"] and why.lower() in e["msg"].lower()
               for e in detail), detail


def test_re2_patterns_select_the_same_tasks(api):
    for pattern in ("^ram-create-user-[01]$", "(?i)^RAM-CREATE-USER-0$", r"^ecs-\w+-rule-0$"):
        r = api.post("/v1/jobs", json={"tasks": {"id_regex": pattern}})
        assert r.status_code == 202, r.text
        assert r.json()["task_ids"] == [t for t in SUITE if re.search(pattern, t)]


# ---- validation says what the worker will say --------------------------------------------------

def test_an_inline_start_page_that_leaves_the_console_is_invalid(api):
    task = yaml.safe_load(open(SUITE["ram-create-user-0"].source))
    task = dict(task, id="escape-0", start_page="/console/../metrics")
    v = api.post("/v1/tasks/validate", json={"tasks": [task]})
    assert v.status_code == 200 and v.json()["valid"] is False, v.text
    assert any("start_page" in e and e.startswith("tasks[0]") for e in v.json()["errors"])
    r = api.post("/v1/jobs", json={"tasks": {"inline": [task]}})
    assert r.status_code == 422, r.text
    assert any(e["loc"] == ["body", "tasks", "inline", 0, "start_page"]
               for e in r.json()["detail"]), r.json()
    ok = dict(task, start_page="/console/ram/users")
    assert api.post("/v1/tasks/validate", json={"tasks": [ok]}).json()["valid"] is True
