"""Optional LLM drafting against the project's own served model: the default policy model
(``rollout_service.models``, SmolLM2) behind the OpenAI-compatible ``/v1/chat/completions``
of :mod:`rollout_service.chat_api`, over real HTTP with the judges' own client. A model this
small rarely writes a usable task; what is checked is the path: the endpoint is asked, and
whatever comes back is either a task ``parse_task`` accepts or a refusal that says why, never
an unchecked draft."""
from __future__ import annotations

import threading

import pytest

from consolerl.tasks import parse_task
from infra.llm import OpenAIChatClient
from infra.local_cloud import free_port
from rollout_service.chat_api import build_api
from doccheck.extract import extract
from doccheck.inventory import default_inventories, load
from doccheck.llm_draft import llm_draft
from rollout_service.models import HFChatTokenizer, resolve_model
from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServer, TransformersEngine
from tests.conftest import wait_for

PAGE = b"""# Create a RAM user

## Procedure

1. Log on to the [RAM console](https://ram.console.aliyun.com/).
2. In the left-side navigation pane, click **Users**.
3. On the **Users** page, click **Create User**.
4. Enter `deploy-bot` in the **Logon Name** field.
5. Click **Create**.
"""


@pytest.mark.slow
def test_llm_drafting_through_the_served_default_model():
    import uvicorn
    model = resolve_model("default")
    router = PolicyRouter([PolicyServer(PolicyConfig(), engine=TransformersEngine(model))])
    app = build_api(router, HFChatTokenizer(model), "default", max_prompt_tokens=6000)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30)
        client = OpenAIChatClient(f"http://127.0.0.1:{port}", "default", api_key_env=None,
                                  max_tokens=160, timeout_s=600)
        proc = extract(PAGE, "text/markdown", "ram-create-user.md")[0]
        draft = llm_draft(proc, load(default_inventories()[""]), client,
                          task_id="llm-ram-create-user", max_attempts=2)
        import httpx
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.should_exit = True
        thread.join(10)
    asked = [line for line in metrics.splitlines()
             if line.startswith("consolerl_policy_api_requests_total{") and 'outcome="ok"' in line]
    assert asked and float(asked[0].rsplit(" ", 1)[1]) >= 1, metrics[:2000]
    assert draft.source == "llm"
    if draft.task is None:
        assert "refused" in draft.reason, draft.reason     # not an endpoint failure
    else:
        assert parse_task(draft.task, "llm draft").id == "llm-ram-create-user"
