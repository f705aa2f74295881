"""The policy's PolicyServer replicas as Ray actors: :func:`start_policy` and the actor options
every replica gets (:func:`policy_options`). Its own module so that the rollout side
(:mod:`cluster.rollout`) and a judge served in the cluster (:mod:`cluster.judges`) both start
replicas the same way without importing each other."""
from __future__ import annotations

from typing import Any

from infra.observability.discovery import PublishConfig
from rollout_service.policy import PolicyConfig, PolicyRouter, PolicyServerActor


def start_policy(config: PolicyConfig, metrics: PublishConfig | None = None
                 ) -> tuple[list[Any], PolicyRouter]:
    """``config.replicas`` PolicyServer actors of ``config.model`` (a resolved model folder:
    :func:`rollout_service.models.resolve_model`), CPU/GPU per replica and placement from
    the config, each announcing its metrics when ``metrics`` is given."""
    options = policy_options(config)
    servers = [PolicyServerActor.options(**options).remote(config, None, None, f"policy-{i}",
                                                      metrics)
               for i in range(config.replicas)]
    return servers, PolicyRouter(servers)


def policy_options(config: PolicyConfig) -> dict[str, Any]:
    """The Ray actor options of every PolicyServer: CPUs, GPUs, the custom resources its
    config names (only nodes that offer them host it), placement, restarts; the one source of
    them (a test starts its probe with exactly these).

    With ``tensor_parallel_size`` > 1 the replica's actor holds that many GPUs
    (``num_gpus_per_replica``, which the config keeps equal to it) and vLLM runs its tensor
    parallel workers as child processes on them. No placement group per replica: an actor
    runs on one node, and Ray gives the GPUs it holds to it alone (distinct
    ``CUDA_VISIBLE_DEVICES`` per actor), which is all a replica's GPUs need."""
    # A crashed replica is restarted by Ray; it serves again once the job sends it the
    # current weights (trainer.weight_sync.ReplicaSync).
    options: dict[str, Any] = {"num_cpus": config.num_cpus_per_replica,
                               "scheduling_strategy": config.scheduling_strategy,
                               "max_restarts": -1, "max_task_retries": 0}
    if config.num_gpus_per_replica:
        options["num_gpus"] = config.num_gpus_per_replica
    if config.resources:
        options["resources"] = dict(config.resources)
    return options
