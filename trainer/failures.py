"""Why a training run stopped, in one line a user can act on: an actor killed by Ray's memory
monitor (which setting to change), a full disk, a lost actor, the original error inside a
Ray task error; and why the rollouts gave nothing to train on."""
from __future__ import annotations

import errno
import re
from typing import Any

import ray

# What to change when Ray's memory monitor kills an actor of the job, by the actor's class.
_MEMORY_SETTINGS = {
    "TrainerWorker": "lower trainer.engine.micro_batch_tokens or set "
                     "trainer.engine.gradient_checkpointing: true (or LoRA: "
                     "trainer.engine.lora.rank), and reserve it with trainer.engine.memory_gib",
    "PolicyServer": "lower policy.kv_cache_gib or policy.max_model_len",
    "LeasedEnvWorker": "run fewer browsers per node (env.workers)",
    "TrainingRollouts": "lower orchestrator.group_size or orchestrator.groups_per_step",
}


def describe_oom(exc: BaseException, last_pss: dict[int, tuple[str, int]] | None = None
                 ) -> str | None:
    """The line for an actor that Ray's memory monitor killed (None when ``exc`` is not
    that): which actor, how much it used (from Ray's message, else from ``last_pss``, the
    job's own last sample per pid), and which setting to change."""
    text = str(exc)
    if not (isinstance(exc, ray.exceptions.OutOfMemoryError) or any(
            s in text for s in ("low on memory", "memory usage threshold",
                                "killed due to memory pressure", "OutOfMemoryError"))):
        return None
    name = _first(text, r"class_name: (\w+)", r"name=(\w+)", r"task name=(\w+)") or "an actor"
    pid = _first(text, r"pid[=:] ?(\d+)")
    used = _first(text, r"memory used=([\d.]+) ?GB")
    if used is None and pid and last_pss and int(pid) in last_pss:
        used = f"{last_pss[int(pid)][1] / 2**30:.1f}"
    node = re.search(r"was ([\d.]+) ?GB(?: used)? / ([\d.]+) ?GB", text)
    setting = next((v for k, v in _MEMORY_SETTINGS.items() if name.startswith(k)),
                   "give the node more memory or run fewer actors on it")
    return (f"Ray's memory monitor killed {name}" + (f" (pid {pid})" if pid else "")
            + (f" at {used} GB" if used else "")
            + (f" with the node at {node.group(1)} of {node.group(2)} GB" if node else "")
            + f": {setting}")


def _first(text: str, *patterns: str) -> str | None:
    for pattern in patterns:
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return None


def describe_failure(exc: BaseException, last_pss: dict[int, tuple[str, int]] | None = None
                     ) -> str:
    """One line on why the run stopped (the original error inside a Ray task error)."""
    oom = describe_oom(exc, last_pss)
    if oom is not None:
        return oom
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, OSError) and cause.errno == errno.ENOSPC or \
            "No space left on device" in str(cause):        # safetensors, torch.save say so
        where = f" writing {cause.filename}" if getattr(cause, "filename", None) else ""
        return (f"no space left on the device{where}: free some space where checkpoints go "
                "(trainer.checkpoint.dir)")
    if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        return f"an actor of the run died: {str(exc).splitlines()[0][:300]}"
    first = (str(cause).strip().splitlines() or [""])[0][:300]
    return f"{type(cause).__name__}: {first}"


def explain_no_experience(summary: dict[str, Any]) -> str:
    """The summary's error, with what the rollouts did meanwhile (why nothing was pushed)."""
    text = summary["error"]
    r = summary.get("rollout")
    if not r:
        return text
    finished = r["groups_pushed"] + r["groups_dropped_uniform"] + r["groups_abandoned"]
    text += (f"; the rollouts ran {r['episodes']} episodes ({r['env_errors']} env errors) and "
             f"finished {finished} groups: {r['groups_pushed']} pushed, "
             f"{r['groups_dropped_uniform']} dropped as uniform, {r['groups_abandoned']} "
             "abandoned")
    if r["groups_dropped_uniform"] and not r["groups_pushed"]:
        text += (". Uniform groups (every episode the same reward: the policy solves all of "
                 "them or none) carry no GRPO signal and orchestrator.drop_uniform_groups drops "
                 "them; start from a model that succeeds on some episodes of the train tasks, "
                 "choose other tasks, or use larger groups")
    elif r["groups_abandoned"] and not r["groups_pushed"]:
        text += (". Groups are abandoned when env errors exceed orchestrator.max_env_retries: "
                 "see the env workers' errors")
    elif not finished:
        text += ". No group finished in time: raise trainer.read_timeout_s or add env workers"
    return text
