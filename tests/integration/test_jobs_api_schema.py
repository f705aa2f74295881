"""Property-based tests of the whole OpenAPI document (schemathesis): the document validates,
and generated requests, stateless and stateful (submit -> read, cancel, results, report, events
via the document's links), get no 5xx and no response that breaks the document; and the
surfaces where outside input meets Redis or a regex engine, with values built to hurt them:
stream ids (``Last-Event-ID``, the stream's ``?after=``) and cursors past 2^64, negative or
malformed, and ``tasks.id_regex`` patterns that backtrack (answered in time, complete)."""
from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

from consolerl.tasks import TASKS_DIR, load_suite
from jobsapi.app import build_app
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.store import JobStore
from tests.integration.api_kit import serving
from doccheck.service import DocsService

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]
SETTINGS = hypothesis.settings(max_examples=25, deadline=None, derandomize=True,
                               database=None,
                               suppress_health_check=list(hypothesis.HealthCheck))


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory) -> Iterator[tuple[str, str]]:
    book = TokenBook(tmp_path_factory.mktemp("tokens") / "tokens.json")
    token = book.create("fuzz", ["jobs:write", "jobs:read", "jobs:cancel", "artifacts:read"],
                        TeamQuota(queued_jobs=10_000, samples_per_job=10_000))
    app = build_app(JobStore(redis_server.url, "fuzz:api"), book,
                    {t.id: t for t in load_suite(TASKS_DIR)}, scheduler_required=False,
                    sse_max_s=0.5, sse_ping_s=0.2, docs=DocsService.default)
    with serving(app) as url:
        yield url, token


@pytest.fixture(scope="module")
def api_schema(served):
    url, _ = served
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


def test_the_document_validates(served):
    import httpx
    url, _ = served
    document = httpx.get(f"{url}/openapi.json").json()
    validate(document)
    assert {"/v1/jobs", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/report",
            "/v1/tasks/validate", "/v1/quota", "/healthz", "/readyz",
            "/metrics"} <= set(document["paths"])
    links = document["paths"]["/v1/jobs"]["post"]["responses"]["202"]["links"]
    assert {"GetJob", "CancelJob", "JobResults", "JobReport", "JobEvents"} <= set(links)


def test_stateless(api_schema, served):
    """Every operation, with generated valid and invalid requests (schemathesis's positive and
    negative modes: values inside and outside each parameter's documented pattern, such as
    the stream ids of Last-Event-ID). (Driven by hand: the schemathesis pytest plugin does
    not load under this pytest.)"""
    _, token = served
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 17

    for operation in operations:
        @hypothesis.given(case=operation.as_strategy(GenerationMode.POSITIVE) |
                          operation.as_strategy(GenerationMode.NEGATIVE))
        @SETTINGS
        def run(case):
            case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                                   checks=CHECKS, timeout=30)
        run()


def test_stateful(api_schema, served):
    _, token = served
    machine = api_schema.as_state_machine()

    class Machine(machine):                      # type: ignore[misc,valid-type]
        def get_call_kwargs(self, case):
            return {"headers": {"Authorization": f"Bearer {token}"}, "timeout": 30}

        def validate_response(self, response, case, **kwargs):
            case.validate_response(response, checks=CHECKS)

    hypothesis.stateful.run_state_machine_as_test(
        Machine, settings=hypothesis.settings(max_examples=15, stateful_step_count=6,
                                              deadline=None, derandomize=True, database=None,
                                              suppress_health_check=list(
                                                  hypothesis.HealthCheck)))


# ---- where outside input meets Redis or a regex engine -------------------------------------------
U64 = 2 ** 64 - 1
# Around 2^64 (Redis' limit) and 10^20 (20 digits) most of all.
_numbers = st.one_of(st.integers(U64 - 3, U64 + 3), st.integers(U64, 10 ** 20),
                     st.integers(0, 2 ** 70), st.integers(-(2 ** 70), -1)).map(str)
_padded = st.one_of(_numbers, st.tuples(st.integers(1, 30), _numbers).map(
    lambda t: "0" * t[0] + t[1]))
# Header values HTTP carries (visible ASCII); query values any text but surrogates.
_id_text = st.text(st.sampled_from("0123456789-+$>*e.x :"), max_size=70)
STREAM_IDS = st.one_of(_padded, st.tuples(_padded, _padded).map("-".join), _id_text)
CURSORS = st.one_of(STREAM_IDS, st.text(st.characters(codec="utf-8",
                                                      exclude_categories=["Cs"]), max_size=80))
# Pieces of regular expressions, the backtracking kinds among them.
_ATOMS = ["(", ")", "(?:", "|", ".", "*", "+", "?", "{0,22}", "{2,}", "{1000}", "a", "!", "^",
          "$", "[a-z]", "\\d", "\\w", "\\1", "(?=", "(?!", "(?<=", "\\Z", "(?i)", "-", "ram"]
PATTERNS = st.one_of(st.lists(st.sampled_from(_ATOMS), min_size=1, max_size=40).map("".join),
                     st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]),
                             min_size=1, max_size=210))
ANSWER_S = 2.0          # a stream ends after sse_max_s (0.5 s here); a submission at once


@pytest.fixture(scope="module")
def finished_job(served) -> str:
    url, token = served
    headers = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{url}/v1/jobs", json={"tasks": {"ids": ["ram-create-user-0"]}},
                     headers=headers).json()["id"]
    httpx.post(f"{url}/v1/jobs/{job}/cancel", headers=headers)
    return job


def _answer(client: httpx.Client, method: str, url: str, **kw) -> tuple[int, str, float]:
    """(status, content type, seconds) of a complete answer; a dropped connection fails."""
    started = time.perf_counter()
    try:
        r = client.request(method, url, **kw)
    except httpx.RemoteProtocolError as exc:
        raise AssertionError(f"{method} {url} {kw}: the connection dropped ({exc})") from None
    return r.status_code, r.headers.get("content-type", ""), time.perf_counter() - started


@hypothesis.example(last_event_id="99999999999999999999-0", after="0-99999999999999999999",
                    cursor="job_*", pattern="^(?:.|.){0,22}!")
@hypothesis.example(last_event_id="", after="99999999999999999999", cursor="a:b",
                    pattern=r"(ram)-\1")
@hypothesis.given(last_event_id=STREAM_IDS, after=CURSORS, cursor=CURSORS, pattern=PATTERNS)
@hypothesis.settings(max_examples=30, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_stream_ids_cursors_and_patterns(served, finished_job, last_event_id, after, cursor,
                                         pattern):
    """Every answer complete (no stream that starts and drops), in time, 2xx or a 422 JSON
    error: never a 5xx, whatever the stream id, the cursor or the pattern."""
    url, token = served
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        answers = [
            ("events", *_answer(client, "GET", f"/v1/jobs/{finished_job}/events",
                                headers={"Last-Event-ID": last_event_id.strip()},
                                params={"after": after})),
            ("events?after", *_answer(client, "GET", f"/v1/jobs/{finished_job}/events",
                                      params={"after": after})),
            ("jobs?after", *_answer(client, "GET", "/v1/jobs", params={"after": cursor})),
            ("results?after", *_answer(client, "GET", f"/v1/jobs/{finished_job}/results",
                                       params={"after": cursor})),
            ("id_regex", *_answer(client, "POST", "/v1/jobs",
                                  json={"tasks": {"id_regex": pattern}})),
        ]
    for what, status, ctype, seconds in answers:
        assert status < 500 and (status < 400 or status == 422), (what, status)
        assert status != 422 or ctype == "application/json", (what, ctype)
        assert seconds < (ANSWER_S if what.startswith("events") else 1.0), (what, seconds)
