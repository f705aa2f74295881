"""Success of a model on a task split, episodes in real browsers scored by the reward service:
``python -m cluster.evaluate --config configs/cpu.yaml --model FOLDER [--runs 3] [--table]
[key=value]``.

The same machinery as training (env worker actors, PolicyServers, the orchestrator, the reward
service), with groups of one episode, nothing trained: each run does every selected task
``episodes_per_task`` times. A success is a reward of at least 1 (the rule or the judges said
the documented procedure was carried out, or correctly reported infeasible). A trained model
runs with the agent settings it was trained with (its ``agent.json``); a config's ``agent``
section that states one of them with another value is refused before anything starts
(:func:`cluster.config.served_agent`).

Figures: the success rate per run, pooled over runs with a bootstrap 95% confidence interval
(resampling episodes), and, for two models evaluated on the same tasks, the difference with a
paired bootstrap interval (resampling tasks). ``by_expected`` gives the same figures separately
for the tasks expected to succeed and the tasks whose documentation is wrong (expected
infeasible: success is reporting them infeasible for a confirmed reason), for each model and
in the comparison.

Beside those, for each model:

- ``pass_at_1``: the success rate of each run (``per_run``; ``None`` for a run without a
  scored episode) and their mean and sample standard deviation (``std`` ``None`` with one run);
  ``over_tasks``: the pass@1 estimator below (each task weighted alike);
- ``pass_at_3``: per task, the unbiased ``1 - C(n-c, 3) / C(n, 3)`` over its ``n`` scored
  episodes (all runs) with ``c`` successes, averaged over the tasks with ``n >= 3``
  (``tasks``); ``tasks_short`` counts those left out (too few runs, or env errors), and
  ``value`` is ``None`` when no task has 3 episodes;
- ``by_family`` and ``by_product``: pooled success, scored episodes and selected tasks per
  oracle family and per product (see :func:`family_of`); a group whose episodes all ended in
  env errors has ``success`` ``None``;
- ``cost``: per episode (env errors included: they cost too), the mean and total of the
  prompt tokens, generated tokens and wall seconds holding an env account (``env_s``), each
  with the number of episodes that carry it (runs recorded before these were kept have none:
  their figures are ``None``).

``--table`` prints :func:`summary_table` (markdown, one row per model) instead of the JSON;
a saved result renders the same way: ``summary_table(json.load(open(FILE)))``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from cluster.builders import rollout_spec
from cluster.config import JobConfig, agent_named, served_agent
from cluster.replicas import start_policy
from cluster.rollout import TrainingRolloutsActor
from cluster.runtime import Session, on_driver_node, stop_actors
from consolerl.config import load_config
from consolerl.errors import ConfigError
from consolerl.rewards import is_success
from consolerl.stats import (bootstrap_mean_ci as bootstrap_ci,
                             grouped_diff_ci as paired_bootstrap_diff, mean_std,
                             paired_diff_ci as paired_episode_diff, pass_at_k,
                             stratified_diff_ci as stratified_bootstrap_diff)
from consolerl.tasks import TASKS_DIR, load_suite
from rollout_service.models import describe_agent, resolve_model
from rollout_service.orchestrator import OrchestratorConfig
from rollout_service.policy import PolicyConfig


def episode_pairs(before: dict[str, list[list[float]]], after: dict[str, list[list[float]]]
                  ) -> list[tuple[float, float]]:
    """The episodes of two evaluations on the same tasks and seeds, paired: per task, per run
    (the run's seed fixes the order and the sampling seeds), the k-th episode of each. An
    episode one side lost to an env error leaves its partner unpaired."""
    pairs: list[tuple[float, float]] = []
    for task in sorted(set(before) & set(after)):
        for b_run, a_run in zip(before[task], after[task]):
            pairs.extend(zip(b_run, a_run))
    return pairs


EXPECTED = ("success", "infeasible")


def success_by_expected(per_task: dict[str, list[float]], expected: dict[str, str]
                        ) -> dict[str, dict[str, Any]]:
    """Pooled success (with its bootstrap 95% interval) of the tasks expected to succeed and
    of those expected infeasible, separately; a group without episodes has ``success``
    ``None``."""
    out: dict[str, dict[str, Any]] = {}
    for group in EXPECTED:
        runs = {t: ws for t, ws in per_task.items() if expected.get(t, "success") == group}
        pooled = [w for ws in runs.values() for w in ws]
        lo, hi = bootstrap_ci(pooled) if pooled else (None, None)
        out[group] = {"tasks": len(runs), "episodes": len(pooled),
                      "success": sum(pooled) / len(pooled) if pooled else None,
                      "success_ci95": [lo, hi]}
    return out


def family_of(task_id: str, oracle_family: str, product: str) -> str:
    """The group a task's figures go to in ``by_family``: its oracle family; for a task
    without one, its id without the trailing ``-N`` index (``ram-create-user-3`` ->
    ``ram-create-user``), or ``<product>-wrongdoc`` for a wrong-documentation task (id ending
    in ``-wrongdoc``)."""
    if oracle_family:
        return oracle_family
    if task_id.endswith("-wrongdoc"):
        return f"{product}-wrongdoc"
    return re.sub(r"-\d+$", "", task_id)


def success_by_group(per_task: dict[str, list[float]], group_of: dict[str, str]
                     ) -> dict[str, dict[str, Any]]:
    """Per group (``group_of``: task -> group; a task missing from it is its own group), the
    pooled success over the group's episodes, the number of episodes and of tasks (a task
    without episodes counts as a task); ``success`` ``None`` without episodes."""
    groups: dict[str, list[list[float]]] = {}
    for task, wins in per_task.items():
        groups.setdefault(group_of.get(task, task), []).append(wins)
    out: dict[str, dict[str, Any]] = {}
    for group in sorted(groups):
        pooled = [w for ws in groups[group] for w in ws]
        out[group] = {"success": sum(pooled) / len(pooled) if pooled else None,
                      "episodes": len(pooled), "tasks": len(groups[group])}
    return out


def pass_at(per_task: dict[str, list[float]], k: int) -> dict[str, Any]:
    """The unbiased pass@k of each task over its episodes (wins of 1.0 or 0.0), averaged over
    the tasks with at least ``k`` episodes (``tasks``); ``tasks_short``: the tasks left out;
    ``value`` ``None`` when none has ``k``."""
    each = [pass_at_k(len(ws), sum(1 for w in ws if w >= 1.0), k) for ws in per_task.values()]
    got = [v for v in each if v is not None]
    return {"value": sum(got) / len(got) if got else None, "tasks": len(got),
            "tasks_short": len(each) - len(got)}


def pass_at_1(run_wins: list[list[float]], per_task: dict[str, list[float]]
              ) -> dict[str, Any]:
    """Each run's success rate (``None`` for a run without a scored episode), their mean and
    sample standard deviation, and the pass@1 estimator over tasks (:func:`pass_at`)."""
    per_run = [sum(ws) / len(ws) if ws else None for ws in run_wins]
    mean, std = mean_std([r for r in per_run if r is not None])
    return {"mean": mean, "std": std, "per_run": per_run,
            "over_tasks": pass_at(per_task, 1)["value"]}


COST_KEYS = ("prompt_tokens", "completion_tokens", "env_s")


def cost_per_episode(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and total of each of :data:`COST_KEYS` over the episodes whose result carries it
    (``episodes``: how many; results recorded before these keys existed carry none); mean and
    total ``None`` when no episode does. ``episodes`` at the top: all of them."""
    out: dict[str, Any] = {"episodes": len(results)}
    for key in COST_KEYS:
        xs = [r[key] for r in results if r.get(key) is not None]
        out[key] = {"mean": sum(xs) / len(xs) if xs else None,
                    "total": sum(xs) if xs else None, "episodes": len(xs)}
    return out


def _num(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def summary_table(result: dict[str, Any]) -> str:
    """A markdown table of an :func:`evaluate` result, or of ``main``'s comparison
    (``baseline`` and ``model``): one row per model; pass@1 mean ± std over runs, pass@3,
    success of the tasks expected to succeed and of those expected infeasible (episodes in
    brackets), tokens and env seconds per episode. A figure the result lacks shows ``–``."""
    # A single result names its model in "model" (a string); a comparison holds two results.
    order = result.get("rows") or ["baseline", "model"]
    rows = ([(label, result[label]) for label in order]
            if "baseline" in result else [("model", result)])
    lines = ["| | model | pass@1 (mean ± std over runs) | pass@3 | success: expected success "
             "| success: expected infeasible | tokens/episode (prompt + generated) "
             "| env s/episode |",
             "|---|---|---|---|---|---|---|---|"]
    for label, r in rows:
        p1 = r.get("pass_at_1") or {}
        mean, std = (p1["mean"], p1["std"]) if p1 else mean_std(r.get("success_per_run", []))
        runs = len(p1.get("per_run", r.get("success_per_run", [])))
        pass1 = _num(mean) + ("" if std is None else f" ± {std:.2f}") + f" ({runs} runs)"
        by_exp = r.get("by_expected", {})
        exp = [f"{_num(g['success'])} ({g['episodes']})" if g else "–"
               for g in (by_exp.get(e) for e in EXPECTED)]
        cost = r.get("cost", {})
        prompt, gen, env = ((cost.get(k) or {}).get("mean") for k in COST_KEYS)
        tokens = "–" if prompt is None else f"{prompt:,.0f} + {_num(gen, ',.0f')}"
        lines.append(f"| {label} | `{r.get('model', '')}` | {pass1} "
                     f"| {_num((r.get('pass_at_3') or {}).get('value'))} | {exp[0]} | {exp[1]} "
                     f"| {tokens} | {_num(env, '.1f')} |")
    return "\n".join(lines) + "\n"


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The difference between two :func:`evaluate` results on the same tasks, over all of
    them and (``by_expected``) over the tasks expected to succeed and those expected
    infeasible separately."""
    out = _difference(before, after)
    expected = {**before.get("expected", {}), **after.get("expected", {})}
    if expected:
        out["by_expected"] = {}
        for group in EXPECTED:
            keep = {t for t in set(before["per_task"]) & set(after["per_task"])
                    if expected.get(t, "success") == group}
            if keep:
                out["by_expected"][group] = _difference(_only(before, keep),
                                                        _only(after, keep))
    return out


def _only(result: dict[str, Any], tasks: set[str]) -> dict[str, Any]:
    return {"per_task": {t: w for t, w in result["per_task"].items() if t in tasks},
            "per_task_runs": {t: r for t, r in result.get("per_task_runs", {}).items()
                              if t in tasks}}


def _difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    diff, (lo, hi) = stratified_bootstrap_diff(before["per_task"], after["per_task"])
    by_task, (tlo, thi) = paired_bootstrap_diff(before["per_task"], after["per_task"])
    out = {"success_diff": diff, "success_diff_ci95": [lo, hi],
           "method": "mean over tasks of the success difference; 95% interval from "
                     "resampling episodes within each task (10,000 resamples)",
           "success_diff_ci95_resampling_tasks": [tlo, thi],
           "tasks": sorted(set(before["per_task"]) & set(after["per_task"]))}
    pairs = episode_pairs(before.get("per_task_runs", {}), after.get("per_task_runs", {}))
    if pairs:
        pdiff, (plo, phi) = paired_episode_diff(pairs)
        out.update(paired_diff=pdiff, paired_diff_ci95=[plo, phi], pairs=len(pairs),
                   paired_method="mean over episode pairs (same task, same run seed) of the "
                                 "success difference; 95% paired bootstrap interval "
                                 "(10,000 resamples of the pairs)")
    return out


def run_orchestrator(config: OrchestratorConfig, split: str, tasks: str | None, run: int
                     ) -> OrchestratorConfig:
    """The orchestrator of one evaluation run (seed ``run + 1``): groups of one episode, none
    dropped, the tasks in turn, so that the run's ``len(selected) x per_task`` groups are each
    selected task ``per_task`` times (the training curriculum would sample some tasks more
    than others)."""
    return replace(config, group_size=1, groups_per_step=1, max_staleness=10**6,
                   mode="async", drop_uniform_groups=False, split=split,
                   task_filter=tasks or "", seed=run + 1, curriculum="round_robin")


def _one_run(config: JobConfig, policy: PolicyConfig, servers: Any, selected: list[str],
             per_task: int, temp: float, split: str, tasks: str | None, label: str, run: int
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One pass over the selected tasks (seed ``run + 1``): the episodes' results and the
    rollout summary."""
    cfg = replace(
        config,
        agent=replace(config.agent, temperature=temp))
    orchestrator = run_orchestrator(config.orchestrator, split, tasks, run)
    stream = replace(config.stream, stream=f"{config.stream.stream}:{label}")
    actor = TrainingRolloutsActor.options(num_cpus=0, scheduling_strategy=on_driver_node()
                                          ).remote(rollout_spec(cfg, policy, None),
                                                   orchestrator, stream, servers)
    try:
        summary = ray.get(actor.run.remote(len(selected) * per_task))
        results = ray.get(actor.results.remote())
    finally:
        ray.get(actor.drain.remote(), timeout=120)
        ray.kill(actor)
    return results, summary


def recorded_runs(path: Path, key: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The runs in ``path`` (JSON lines) made with ``key``'s settings, by run index. A line
    cut short by a crash while it was written is skipped (that run is made again)."""
    out: dict[int, dict[str, Any]] = {}
    if not path.exists():
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            print(f"[evaluate] {path}:{n}: not a whole record (cut short?): skipped",
                  file=sys.stderr, flush=True)
            continue
        if isinstance(rec, dict) and all(rec.get(k) == v for k, v in key.items()):
            out[int(rec["run"])] = rec
    return out


def append_record(path: Path, rec: dict[str, Any]) -> None:
    """One finished run, appended as one line and flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def evaluate(config: JobConfig, model_path: str, *, runs: int = 3, split: str | None = None,
             tasks: str | None = None, episodes_per_task: int | None = None,
             temperature: float | None = None, label: str = "eval",
             progress: Any = None, record: Path | None = None,
             named: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Evaluate ``model_path`` (Ray initialised, Redis and the cloud up). Returns per-run and
    pooled success, per-task outcomes, env errors and leaks, pass@1 and pass@3, success by
    oracle family and by product, and the cost per episode (see the module docstring).
    ``record``: a JSON-lines file of finished runs; a run already in it (same label, model,
    split, tasks, temperature and episodes per task: the same seeds) is taken from it, not
    run again, so an evaluation that was stopped goes on where it stopped. The agent runs
    with the model's own settings (:func:`cluster.config.served_agent`; ``named``: the model
    settings the config's ``agent`` section states, which must be the model's)."""
    config = replace(config, agent=served_agent(config, named, model_path))
    ev = config.eval
    split = split or ev.split
    tasks = ev.tasks if tasks is None else tasks
    per_task = episodes_per_task or ev.episodes_per_task
    temp = ev.temperature if temperature is None else temperature
    if runs < 1:
        raise ConfigError("evaluate: runs must be >= 1")
    pattern = re.compile(tasks) if tasks else None
    chosen = [t for t in load_suite(TASKS_DIR)
              if (split == "all" or t.split == split) and (pattern is None or
                                                            pattern.search(t.id))]
    selected = [t.id for t in chosen]
    expected = {t.id: t.expected for t in chosen}
    family = {t.id: family_of(t.id, t.oracle_family, t.product) for t in chosen}
    product = {t.id: t.product for t in chosen}
    if not selected:
        raise ConfigError(f"evaluate: no {split} task matches {tasks!r}")
    key = {"label": label, "model": str(model_path), "split": split, "tasks": tasks or "",
           "temperature": temp, "episodes_per_task": per_task}
    done = recorded_runs(record, key) if record is not None else {}
    by_task: dict[str, list[float]] = {t: [] for t in selected}
    by_task_run: dict[str, list[list[float]]] = {t: [] for t in selected}
    per_run: list[float] = []
    run_wins: list[list[float]] = []
    every: list[dict[str, Any]] = []          # every episode's result, for the cost
    env_errors = leaked = 0
    policy = replace(config.policy, model=model_path)
    servers = None if all(r in done for r in range(runs)) else start_policy(policy)[0]
    try:
        for run in range(runs):
            if run in done:
                rec = done[run]
                results, summary = rec["results"], rec["summary"]
                if progress is not None:
                    progress(f"{label} run {run + 1}/{runs}: taken from {record}")
            else:
                results, summary = _one_run(config, policy, servers, selected, per_task, temp,
                                            split, tasks, label, run)
                if record is not None:
                    append_record(record, {**key, "run": run, "results": results,
                                           "summary": summary})
            env_errors += summary["env_errors"]
            leaked += summary["leaked_resources"]
            ok = [r for r in results if not r["env_error"] and r["reward"] is not None]
            wins = [1.0 if is_success(r["reward"]) else 0.0 for r in ok]
            for t in by_task_run:
                by_task_run[t].append([])
            for r, w in zip(ok, wins):
                by_task.setdefault(r["task_id"], []).append(w)
                by_task_run.setdefault(r["task_id"], [[] for _ in range(run + 1)])[-1].append(w)
            per_run.append(sum(wins) / len(wins) if wins else 0.0)
            run_wins.append(wins)
            every.extend(results)
            if progress is not None:
                progress(f"{label} run {run + 1}/{runs}: success {per_run[-1]:.2f} "
                         f"({len(wins)} episodes, {summary['env_errors']} env errors)")
    finally:
        if servers is not None:
            stop_actors(servers)
    pooled = [w for ws in by_task.values() for w in ws]
    lo, hi = bootstrap_ci(pooled) if pooled else (0.0, 0.0)
    per_task_wins = {t: ws for t, ws in by_task.items() if ws}
    return {"model": model_path, "split": split, "tasks": len(selected), "runs": runs,
            "temperature": temp, "episodes": len(pooled),
            "success": sum(pooled) / len(pooled) if pooled else 0.0,
            "success_ci95": [lo, hi], "success_per_run": per_run,
            "by_expected": success_by_expected(per_task_wins, expected),
            "pass_at_1": pass_at_1(run_wins, by_task), "pass_at_3": pass_at(by_task, 3),
            "by_family": success_by_group(by_task, family),
            "by_product": success_by_group(by_task, product),
            "cost": cost_per_episode(every),
            "expected": expected,
            "per_task": per_task_wins,
            "per_task_runs": {t: rs for t, rs in by_task_run.items() if any(rs)},
            "env_errors": env_errors, "leaked_resources": leaked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster.evaluate")
    parser.add_argument("--config", required=True)
    parser.add_argument("--model", required=True, help="model folder (or default / tiny)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", default="",
                        help="a second model evaluated first on the same tasks and seeds; "
                             "the output adds the difference model - baseline with its CI")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=FOLDER",
                        help="(with --baseline) a model evaluated between the baseline and "
                             "--model on the same tasks and seeds, under LABEL; the output adds "
                             "LABEL - baseline and model - LABEL (repeatable, in order)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="the JSON result on one line")
    shown.add_argument("--table", action="store_true",
                       help="print a markdown summary table instead of the JSON (--out "
                            "still writes the JSON)")
    parser.add_argument("--out", default="", help="also write the JSON result to this file")
    parser.add_argument("--record", default="",
                        help="JSON lines of finished runs (default: beside --out, "
                             "<out>.runs.jsonl): runs already there are not made again, so "
                             "a stopped evaluation goes on where it stopped")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    also = []
    for item in args.also:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder or label in ("baseline", "model", "rows") \
                or not re.fullmatch(r"[A-Za-z0-9_-]+", label):
            parser.error(f"--also: LABEL=FOLDER with a label of letters, digits, - and _ "
                         f"(not baseline, model or rows), got {item!r}")
        also.append((label, folder))
    if also and not args.baseline:
        parser.error("--also needs --baseline")
    try:
        config = load_config(JobConfig, args.config, args.overrides)
        named = agent_named(args.config, args.overrides)
        # Every model's settings checked before anything starts (a refusal is not found
        # after the baseline's runs).
        chosen = ([("baseline", args.baseline)] if args.baseline else []) + also + [
            ("model", args.model)]
        models = {name: resolve_model(folder) for name, folder in chosen}
        for name, path in models.items():
            print(f"[evaluate] {name} {path}: "
                  f"{describe_agent(served_agent(config, named, path))}", file=sys.stderr)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(config.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Session(config, run_dir) as session:
        config = session.config        # the addresses every Ray node reaches

        def progress(m: str) -> None:
            print(f"[evaluate] {m}", file=sys.stderr, flush=True)
        record = Path(args.record) if args.record else (
            Path(args.out + ".runs.jsonl") if args.out else None)
        if args.baseline:
            before = evaluate(config, models["baseline"], runs=args.runs,
                              label="baseline", progress=progress, record=record, named=named)
            result = {"baseline": before}
            order, previous = ["baseline"], "baseline"
            for label, _ in also:
                result[label] = evaluate(config, models[label], runs=args.runs,
                                         label=label, progress=progress, record=record,
                                         named=named)
                result[f"difference {label} - {previous}"] = compare(result[previous],
                                                                      result[label])
                order.append(label)
                previous = label
            after = evaluate(config, models["model"], runs=args.runs,
                             label="model", progress=progress, record=record, named=named)
            result.update(model=after, difference=compare(before, after))
            if also:
                result[f"difference model - {previous}"] = compare(result[previous], after)
                result["rows"] = [*order, "model"]
        else:
            result = evaluate(config, models["model"], runs=args.runs,
                              progress=progress, record=record, named=named)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.table:
        print(summary_table(result), end="")
    else:
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
