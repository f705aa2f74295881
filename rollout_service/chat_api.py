"""An OpenAI-compatible ``POST /v1/chat/completions`` over the policy replicas, for external
callers (judges, ResourceCoder, other teams), plus ``GET /v1/models`` and ``GET /metrics``.

The request's messages go through the model's chat template, their content as plain text (a
control string such as ``<|im_end|>`` in it is ordinary tokens, never a turn boundary: see
:class:`rollout_service.models.HFChatTokenizer`); the completion comes from the same
router the agent loop uses (least-loaded replica). Supported: ``messages``, ``max_tokens``
(or ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``n`` = 1, no streaming,
and ``response_format`` of type ``text`` or ``json_schema`` (structured output: the completion
follows ``json_schema.schema``; only where the replicas' engine can constrain decoding, vLLM:
``build_api(structured_outputs=True)``; elsewhere a ``json_schema`` request is a 400 naming
``response_format``, as is any other type). The response carries the usual fields and,
under ``consolerl``, the weight version that answered. Malformed requests are 422 with the
field named; a prompt over the context limit 400.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from infra.http_errors import install_validation_handler

from .agent import ChatTokenizer, SamplingParams
from .policy import PolicyRouter


CHARS_PER_TOKEN_MAX = 32


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = Field(default=None, max_length=2000)
    # OpenAI's field is ``schema``, which shadows a BaseModel attribute: kept under an alias.
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: str = Field(max_length=64)
    json_schema: JsonSchemaFormat | None = None


RESPONSE_FORMATS = ("text", "json_schema")
MAX_SCHEMA_CHARS = 20_000


class ChatRequest(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)   # NaN / Infinity are not sampling values
    model: str = Field(default="", max_length=200)
    messages: list[ChatMessage] = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    n: Literal[1] = 1
    stream: Literal[False] = False
    response_format: ResponseFormat | None = None


def build_api(router: PolicyRouter, tokenizer: ChatTokenizer, model_name: str,
              max_prompt_tokens: int = 8192, default_max_tokens: int = 256,
              registry: CollectorRegistry | None = None,
              structured_outputs: bool = False) -> FastAPI:
    """The app. ``structured_outputs``: whether the replicas' engine honours a JSON schema
    (``SamplingParams.json_schema``: vLLM does, transformers does not),
    i.e. whether ``response_format`` of type ``json_schema`` is served or refused (400)."""
    registry = registry if registry is not None else CollectorRegistry()
    requests = Counter("consolerl_policy_api_requests_total", "Chat completion requests, by "
                       "outcome.", ["outcome"], registry=registry)
    app = FastAPI(title="console-rl policy", version="1")
    install_validation_handler(app)

    # No tokenizer makes fewer tokens than one per CHARS_PER_TOKEN_MAX characters of text:
    # a request above this many characters is over the token limit for sure, and is refused
    # before the (costly) tokenisation.
    max_chars = max_prompt_tokens * CHARS_PER_TOKEN_MAX

    @app.post("/v1/chat/completions")
    async def chat(request: ChatRequest) -> Mapping[str, Any]:
        schema = _json_schema(request.response_format, structured_outputs)
        chars = sum(len(m.content) for m in request.messages)
        if chars > max_chars:
            requests.labels("too_long").inc()
            raise HTTPException(400, detail=f"the messages have {chars} characters; the limit "
                                            f"is {max_chars} ({max_prompt_tokens} tokens)")
        prompt = tokenizer.apply_chat_template([m.model_dump() for m in request.messages])
        if len(prompt) > max_prompt_tokens:
            requests.labels("too_long").inc()
            raise HTTPException(400, detail=f"the prompt has {len(prompt)} tokens; the limit "
                                            f"is {max_prompt_tokens}")
        limit = request.max_completion_tokens or request.max_tokens or default_max_tokens
        sampling = SamplingParams(limit, request.temperature, request.top_p, request.seed,
                                  json_schema=schema or "")
        gen = await router.generate(prompt, sampling)
        text = tokenizer.decode(list(gen.token_ids), skip_special_tokens=True)
        requests.labels("ok").inc()
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": request.model or model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": gen.finish_reason}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(gen.token_ids),
                      "total_tokens": len(prompt) + len(gen.token_ids)},
            "consolerl": {"weight_version": gen.version},
        }

    @app.get("/v1/models")
    async def models() -> Mapping[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "owned_by": "console-rl"}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _json_schema(fmt: ResponseFormat | None, supported: bool) -> str:
    """The schema a request's ``response_format`` asks for, as JSON text ("" for none or
    ``text``); an unsupported request is a 400 naming the field."""
    if fmt is None or fmt.type == "text":
        return ""
    if fmt.type not in RESPONSE_FORMATS:
        raise HTTPException(400, detail=f"response_format.type: must be one of "
                                        f"{', '.join(RESPONSE_FORMATS)}, got {fmt.type!r}")
    if fmt.json_schema is None:
        raise HTTPException(400, detail="response_format.json_schema: required when "
                                        "response_format.type is json_schema")
    if not supported:
        raise HTTPException(400, detail="response_format: json_schema is not supported by "
                                        "this server (its engine cannot constrain output; "
                                        "vLLM replicas can); send the request without it")
    text = json.dumps(fmt.json_schema.json_schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise HTTPException(400, detail=f"response_format.json_schema.schema: {len(text)} "
                                        f"characters; the limit is {MAX_SCHEMA_CHARS}")
    return text
