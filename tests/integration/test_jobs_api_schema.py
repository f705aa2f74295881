"""Property-based tests of the whole OpenAPI document (schemathesis): the document validates,
and generated requests, stateless and stateful (submit -> read, cancel, results, report, events
via the document's links), get no 5xx and no response that breaks the document."""
from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from openapi_spec_validator import validate
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

from consolerl.tasks import TASKS_DIR, load_suite
from rollout_service.jobs.app import build_app
from rollout_service.jobs.auth import TeamQuota, TokenBook
from rollout_service.jobs.store import JobStore
from tests.integration.api_kit import serving
from rollout_service.docs.service import DocsService

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
    """Every operation, with generated valid and invalid requests. (Driven by hand: the
    schemathesis pytest plugin does not load under this pytest.)"""
    _, token = served
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 17

    for operation in operations:
        @hypothesis.given(case=operation.as_strategy())
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
