"""The LLM judges of the reward service, composed: the ``reward.judges`` config section
(:class:`JudgeSection`), the judge channel it builds (:func:`build_judge_channel`), and a
judge served in this Ray cluster (:func:`serve_judge`): a PolicyServer replica of any model
folder behind the project's OpenAI-compatible chat API
(:func:`rollout_service.chat_api.build_api`), which the channel's OpenAI client calls like any
remote endpoint.

``endpoint``:

- ``""``: no judges (the rule alone; so is ``enabled: false``);
- ``http(s)://host:port[/v1]``: a remote OpenAI-compatible endpoint (``model`` names the
  model; ``api_key_env`` the environment variable holding its key, read where the reward
  service runs);
- ``policy:<model>``: serve ``<model>`` (a model folder, ``default`` or ``tiny``: see
  :func:`rollout_service.models.resolve_model`) here: one PolicyServer replica with the job's
  ``policy`` settings (backend, device, dtype, CPUs/GPUs, resources) and the chat API on
  127.0.0.1 of the node that scores (uvicorn in a Ray actor placed there).

:class:`cluster.rollout.RolloutSide` starts them (:func:`start_judges`), so training,
evaluation and the jobs API score with the same judges.
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import ray
from prometheus_client import CollectorRegistry
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from consolerl.config import Between
from consolerl.errors import ConfigError
from infra.observability.discovery import PublishConfig
from reward_service.judges import VOTE_MAX_CHARS, JudgeChannel, JudgeConfig, judge_clients
from cluster.replicas import start_policy
from rollout_service.policy import PolicyConfig

log = logging.getLogger(__name__)

POLICY_PREFIX = "policy:"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class JudgeSection(JudgeConfig):
    """``reward.judges``: the LLM-judge channel of the reward service (the judges decide only
    episodes the rule, and the evidence channel, leave undetermined, and only by consensus).

    ``endpoint``: "" none, ``http(s)://host:port[/v1]`` a remote OpenAI-compatible endpoint,
    ``policy:<model>`` a PolicyServer replica of that model folder (or ``default``) served in
    this Ray cluster; ``model``: the model name sent (required for a remote endpoint; served
    under it, by default the folder's name, for ``policy:``); ``api_key_env``: the variable
    with the key (null or "" = none); ``k`` judges (distinct system prompts) voting by
    ``consensus`` (``unanimous`` | ``majority``) with at least ``min_valid`` valid votes (null =
    a majority of k); ``timeout_s``: one call; ``deadline_s``: one episode's judging, whatever
    the endpoint does; ``concurrency``: calls in flight over every episode together;
    ``retries`` of transport errors, 5xx and 429; ``max_tokens`` per reply; ``temperatures``:
    one for all judges or one per judge; ``audit_fraction``: the share of rule-decided
    episodes also judged, only to measure the judges' agreement with the rule;
    ``structured``: ask for each vote under structured output (the vote's JSON schema as the
    request's ``response_format``; false for an endpoint that refuses it; a ``policy:`` judge
    on the transformers backend answers free text either way).

    The section is the judge channel's :class:`~reward_service.judges.JudgeConfig` (its other
    fields too: ``max_trajectory_chars``, ``system_prompts``, ...), plus the endpoint and its
    clients' settings. Inside a job every call is bounded, so the section redeclares five of
    the channel's fields with bounds and defaults for a training loop (the channel alone
    waits on its clients: no deadline, no timeout, no concurrency limit, no retries)."""

    enabled: bool = False
    endpoint: str = ""
    model: str = ""
    api_key_env: str | None = None
    k: Annotated[int, Between(1, 15)] = 3
    timeout_s: Annotated[float, Between(0, 3600, low_open=True)] = 30.0
    deadline_s: Annotated[float, Between(0, 3600, low_open=True)] = 60.0
    concurrency: Annotated[int, Between(1, 1024)] = 8
    retries: Annotated[int, Between(0, 10)] = 2
    max_tokens: Annotated[int, Between(1, 8192)] = 256
    temperatures: tuple[Annotated[float, Between(0, 5)], ...] = (0.0,)

    config_name = "reward.judges"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.endpoint, str):
            raise ConfigError("reward.judges.endpoint: must be a string")
        if self.endpoint and not self.endpoint.startswith(("http://", "https://",
                                                           POLICY_PREFIX)):
            raise ConfigError(f"reward.judges.endpoint: must be \"\", http(s)://host:port[/v1] "
                              f"or policy:<model folder>, got {self.endpoint!r}")
        if self.endpoint.startswith(POLICY_PREFIX) and not self.policy_model:
            raise ConfigError("reward.judges.endpoint: policy: needs a model (a folder, or "
                              "default), e.g. policy:default")
        if self.enabled and not self.endpoint:
            raise ConfigError("reward.judges.endpoint: required when reward.judges.enabled "
                              "is true (http(s)://... or policy:<model>)")
        if not isinstance(self.model, str):
            raise ConfigError("reward.judges.model: must be a string")
        if self.enabled and self.remote and not self.model:
            raise ConfigError("reward.judges.model: required for a remote endpoint (the "
                              "model name the endpoint serves)")
        if self.api_key_env == "":
            object.__setattr__(self, "api_key_env", None)
        if self.api_key_env is not None and (not isinstance(self.api_key_env, str)
                                             or not _ENV_NAME.match(self.api_key_env)):
            raise ConfigError(f"reward.judges.api_key_env: must be an environment variable's "
                              f"name or null, got {self.api_key_env!r}")
        if self.timeout_s > self.deadline_s:
            raise ConfigError(f"reward.judges.timeout_s ({self.timeout_s:g}) must not exceed "
                              f"reward.judges.deadline_s ({self.deadline_s:g}): a call is cut "
                              "at the episode's deadline")
        if len(self.temperatures) not in (1, self.k):
            raise ConfigError(f"reward.judges.temperatures: must be a list of 1 or k "
                              f"({self.k}) numbers, got {self.temperatures!r}")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if self.structured and self.max_tokens < VOTE_MAX_CHARS:
            raise ConfigError(f"reward.judges.max_tokens: must be at least {VOTE_MAX_CHARS} "
                              f"under structured output (the longest vote the schema allows; "
                              f"a reply cut shorter is no vote), got {self.max_tokens}")

    @property
    def remote(self) -> bool:
        return self.endpoint.startswith(("http://", "https://"))

    @property
    def policy_model(self) -> str:
        """The model a ``policy:`` endpoint serves ("" for a remote one)."""
        if not self.endpoint.startswith(POLICY_PREFIX):
            return ""
        return self.endpoint[len(POLICY_PREFIX):].strip()

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.endpoint)


def judge_config(section: JudgeSection) -> JudgeConfig:
    """The channel's config: the section's :class:`JudgeConfig` fields (without the
    endpoint's, which only the clients need)."""
    return JudgeConfig(**{f.name: getattr(section, f.name) for f in fields(JudgeConfig)})


def build_judge_channel(section: JudgeSection, registry: CollectorRegistry | None = None, *,
                        base_url: str | None = None, model: str | None = None
                        ) -> JudgeChannel | None:
    """The judge channel of ``section`` (None when it is off). ``base_url``/``model``: where a
    ``policy:`` endpoint is served (:func:`serve_judge`); a remote endpoint needs neither.
    The channel keeps a recipe of its clients (it pickles into a Ray actor and reads its API
    key there); they are built once here so that a missing key fails now, not per episode.
    ``registry``: where its ``consolerl_reward_judge_*`` metrics go (the reward service
    binds its own)."""
    if not section.active:
        return None
    if section.remote:
        url, name = section.endpoint, model or section.model
        key_env = section.api_key_env
    else:
        if not base_url:
            raise ConfigError(f"reward.judges.endpoint: {section.endpoint} is served in the "
                              "cluster: start it with serve_judge and pass its base_url")
        url, name, key_env = base_url, model or section.model or "judge", None
    factory = partial(judge_clients, url, name, list(section.temperatures),
                      api_key_env=key_env, timeout_s=section.timeout_s,
                      max_tokens=section.max_tokens)
    channel = JudgeChannel(config=judge_config(section), client_factory=factory,
                           registry=registry)
    for client in channel.clients:      # fail now on a bad URL or a missing key
        close = getattr(client, "close", None)
        if close is not None:
            close()
    channel._clients = None             # built again, lazily, where it runs
    return channel


# ---- a judge served in the cluster ---------------------------------------------------------------
class JudgeApi:
    """uvicorn serving :func:`rollout_service.chat_api.build_api` over PolicyServer replicas,
    on 127.0.0.1 of the node it runs on, in a thread of its own (as a Ray actor:
    :data:`JudgeApiActor`)."""

    def __init__(self, servers: list[Any], model_path: str, model_name: str,
                 max_prompt_tokens: int = 8192, default_max_tokens: int = 256,
                 structured_outputs: bool = False):
        import uvicorn  # noqa: PLC0415 - only where it serves

        from rollout_service.chat_api import build_api  # noqa: PLC0415
        from rollout_service.models import HFChatTokenizer  # noqa: PLC0415
        from rollout_service.policy import PolicyRouter  # noqa: PLC0415
        self.router = PolicyRouter(servers)
        app = build_api(self.router, HFChatTokenizer(model_path), model_name,
                        max_prompt_tokens=max_prompt_tokens,
                        default_max_tokens=default_max_tokens,
                        structured_outputs=structured_outputs)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                   access_log=False))
        self.thread: threading.Thread | None = None

    def start(self) -> str:
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name="judge-api")
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the judge API did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(10)


JudgeApiActor = ray.remote(JudgeApi)


def serve_judge(model: str, policy: PolicyConfig | None = None, *, name: str = "",
                metrics: PublishConfig | None = None, max_tokens: int = 256
                ) -> tuple[str, str, Callable[[], None]]:
    """Serve ``model`` (a model folder, ``default`` or ``tiny``) as a judge in the current
    Ray cluster: one PolicyServer replica (``policy``'s backend, device, dtype, resources;
    default: transformers on CPU) and the chat API on 127.0.0.1 of this node. Returns
    ``(base_url, model_name, stop)``: point an OpenAI client (no key) at ``base_url``;
    ``stop()`` ends both. ``name``: the served model name (default: the folder's name).
    The API serves ``response_format`` json_schema where the backend can constrain output
    (:func:`serves_structured`)."""
    from rollout_service.models import resolve_model  # noqa: PLC0415

    if not ray.is_initialized():
        raise ConfigError("serve_judge: needs a Ray cluster (ray.init first)")
    path = resolve_model(model)
    config = replace(policy or PolicyConfig(), model=path, replicas=1)
    model_name = name or Path(path).name or "judge"
    servers, _ = start_policy(config, metrics)
    strategy = NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)
    api = None
    try:
        api = JudgeApiActor.options(num_cpus=0, scheduling_strategy=strategy).remote(
            servers, path, model_name, max(config.max_model_len - max_tokens, 256), max_tokens,
            serves_structured(config))
        url = ray.get(api.start.remote(), timeout=120)
    except BaseException:
        _stop(api, servers)
        raise
    log.info("judge %s served at %s", model_name, url)
    return url, model_name, partial(_stop, api, servers)


def _stop(api: Any, servers: list[Any]) -> None:
    if api is not None:
        try:
            ray.get(api.stop.remote(), timeout=15)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        ray.kill(api)
    # The replicas stop their engine's processes first: a killed actor leaves vLLM's engine
    # core and worker orphaned (measured: both still running after reward_validate ended).
    for server in servers:
        try:
            ray.get(server.shutdown.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - killed below either way
            pass
        ray.kill(server)


def serves_structured(policy: PolicyConfig) -> bool:
    """Whether a judge served with ``policy`` can answer under structured output (vLLM
    can; the transformers engine cannot)."""
    return policy.backend == "vllm"


def start_judges(section: JudgeSection | None, policy: PolicyConfig | None = None,
                 metrics: PublishConfig | None = None,
                 registry: CollectorRegistry | None = None
                 ) -> tuple[JudgeChannel | None, Callable[[], None]]:
    """The section's judge channel and what stops it: for ``policy:<model>`` the judge is
    served first (:func:`serve_judge`, with ``policy``: the job's policy section, whose
    ``model`` the section's replaces; resolve the folder before: see
    :func:`cluster.builders.judge_section`); otherwise nothing is started. A served judge
    whose backend cannot constrain output answers free text (``structured`` off)."""
    if section is None or not section.active:
        return None, _nothing
    if section.remote:
        return build_judge_channel(section, registry), _nothing
    if section.structured and not serves_structured(policy or PolicyConfig()):
        log.info("judge %s: the %s backend cannot constrain output; judges answer free text",
                 section.policy_model, (policy or PolicyConfig()).backend)
        section = replace(section, structured=False)
    url, name, stop = serve_judge(section.policy_model, policy, name=section.model,
                                  metrics=metrics, max_tokens=section.max_tokens)
    try:
        return build_judge_channel(section, registry, base_url=url, model=name), stop
    except BaseException:
        stop()
        raise


def _nothing() -> None:
    return None
