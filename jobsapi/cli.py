"""``console-rl``: the jobs API from a shell (over :class:`.client.JobsClient`).

    export CONSOLE_RL_URL=http://rl.internal:8000 CONSOLE_RL_TOKEN=crl_...
    console-rl jobs submit --split heldout --samples 4 --temperature 0.7 --watch
    console-rl jobs submit --ids ram-create-user-0,ecs-add-rule-0 --idempotency-key nightly-0601
    console-rl jobs submit --inline my-procedure.yaml --max-steps 20 --priority 7 --deadline-s 3600
    console-rl jobs list [--limit 50]          console-rl jobs get JOB
    console-rl jobs watch JOB                  console-rl jobs cancel JOB
    console-rl jobs results JOB [--verdict failure] [--task TASK]
    console-rl jobs report JOB [--html report.html]
    console-rl tasks list [--product ram] [--split heldout]
    console-rl docs check PAGE.md PAGE.html [--drift rename] [--run --samples 3] [--html OUT] [--json]
                                          (without --run: checked here, no server, no token)
    console-rl quota

``--url``/``--token`` override the environment; ``--json`` prints the API's JSON. Errors go to
stderr as ``error: ...`` with exit status 1 (2 for usage errors); ``jobs watch`` exits 0 when
the job completed and 1 when it failed, was cancelled or expired.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from consolerl.errors import ConsoleRLError

from .client import ApiError, JobsClient
from .schema import (EVENT_TYPES, JobCompletedEvent, JobStatusEvent,
                     RolloutCompletedEvent)

DEFAULT_URL = "http://127.0.0.1:8000"


class UsageError(ConsoleRLError, ValueError):
    pass


def _table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def _load_inline(paths: list[str]) -> list[dict[str, Any]]:
    import yaml  # only here (JSON is YAML too)
    tasks: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"--inline {path}: {exc}") from None
        items = data if isinstance(data, list) else [data]
        if not items or not all(isinstance(t, dict) for t in items):
            raise UsageError(f"--inline {path}: must hold a task (a mapping) or a list of them")
        tasks += items
    return tasks


# ---- commands ----------------------------------------------------------------------------------
def _job_text(job: dict[str, Any]) -> str:
    e, v = job["episodes"], job["verdicts"]
    total = len(job["task_ids"]) * job["samples_per_task"]
    lines = [f"job       {job['id']}  ({job['state']})", f"model     {job['model']}"
             + (f" (policy version {job['policy_version']})" if job.get("policy_version")
                is not None else ""),
             f"tasks     {len(job['task_ids'])} x {job['samples_per_task']} samples = {total} "
             "rollouts: " + ", ".join(job["task_ids"][:5])
             + (", ..." if len(job["task_ids"]) > 5 else ""),
             "episodes  " + ", ".join(f"{k} {n}" for k, n in e.items()),
             "verdicts  " + ", ".join(f"{k} {n}" for k, n in v.items()),
             (f"created   {_when(job['created_at'])}   started {_when(job.get('started_at'))}"
              f"   finished {_when(job.get('finished_at'))}")]
    if job.get("error"):
        lines.append(f"error     {job['error']}")
    return "\n".join(lines)


def cmd_submit(api: JobsClient, args: argparse.Namespace) -> int:
    if args.ids is not None:
        ids = [i.strip() for i in args.ids.split(",") if i.strip()]
        if not ids:
            raise UsageError("--ids: give task ids separated by commas")
        tasks: dict[str, Any] = {"ids": ids}
    elif args.split is not None:
        tasks = {"split": args.split}
    elif args.regex is not None:
        tasks = {"id_regex": args.regex}
    else:
        tasks = {"inline": _load_inline(args.inline)}
    sampling = {k: v for k, v in (("temperature", args.temperature),
                                  ("max_steps", args.max_steps)) if v is not None}
    job = api.submit(tasks=tasks, samples_per_task=args.samples, model=args.model,
                     sampling=sampling or None, priority=args.priority,
                     deadline_s=args.deadline_s, idempotency_key=args.idempotency_key)
    _out(args, job, f"submitted {job['id']} ({job['state']}): {len(job['task_ids'])} tasks x "
                    f"{job['samples_per_task']} samples")
    return watch(api, job["id"], args.json) if args.watch else 0


def cmd_list(api: JobsClient, args: argparse.Namespace) -> int:
    jobs = []
    for job in api.iter_jobs(page_size=min(args.limit, 100)):
        jobs.append(job)
        if len(jobs) >= args.limit:
            break
    rows = [(j["id"], j["state"], _when(j["created_at"]),
             f"{len(j['task_ids'])}x{j['samples_per_task']}",
             f"{j['episodes']['completed']}/{len(j['task_ids']) * j['samples_per_task']}",
             f"{j['verdicts']['success']}/{j['verdicts']['failure']}") for j in jobs]
    _out(args, jobs, _table(rows, ("JOB", "STATE", "CREATED", "TASKSxK", "DONE", "OK/FAIL"))
         if jobs else "no jobs")
    return 0


def cmd_get(api: JobsClient, args: argparse.Namespace) -> int:
    job = api.job(args.job)
    _out(args, job, _job_text(job))
    return 0


def watch(api: JobsClient, job_id: str, as_json: bool = False) -> int:
    """Follow the job's events to its end: a progress bar over its rollouts (or, with
    ``as_json``, one JSON line per event); 0 when it completed, 1 otherwise."""
    from tqdm import tqdm
    job = api.job(job_id)
    bar = None if as_json else tqdm(total=len(job["task_ids"]) * job["samples_per_task"],
                                    desc=f"{job_id} {job['state']}", unit="rollout",
                                    file=sys.stderr, dynamic_ncols=True)
    tally = {"success": 0, "failure": 0, "other": 0, "retries": 0}
    final: dict[str, Any] = {"state": job["state"]}
    try:
        for event in api.events(job_id):
            if as_json:
                print(json.dumps({"id": event.id, "event": event.type, "data": event.data}),
                      flush=True)
                final = event.data if event.type == "job.completed" else final
                continue
            if event.type not in EVENT_TYPES:
                continue                                    # a newer server's event
            payload = event.payload
            if isinstance(payload, JobStatusEvent):
                bar.set_description(f"{job_id} {payload.state}")
            elif isinstance(payload, RolloutCompletedEvent):
                if payload.state == "queued":               # an env error: it runs again
                    tally["retries"] += 1
                else:
                    verdict = payload.verdict
                    key = verdict if verdict in ("success", "failure") else \
                        "failure" if verdict == "infeasible" else "other"
                    tally[key] += 1
                    bar.update(1)
                bar.set_postfix({k: n for k, n in tally.items()
                                 if n or k in ("success", "failure")})
            elif isinstance(payload, JobCompletedEvent):
                final = event.data
    finally:
        if bar is not None:
            bar.close()
    if not as_json:
        verdicts = ", ".join(f"{k} {n}" for k, n in final.get("verdicts", {}).items() if n)
        episodes = ", ".join(f"{k} {n}" for k, n in final.get("episodes", {}).items() if n)
        print(f"job {job_id} {final.get('state')}: episodes {episodes or 'none'}; "
              f"verdicts {verdicts or 'none'}")
    return 0 if final.get("state") == "completed" else 1


def cmd_cancel(api: JobsClient, args: argparse.Namespace) -> int:
    job = api.cancel(args.job)
    note = " (stopping its running episodes)" if job["state"] == "running" else ""
    _out(args, job, f"{job['id']}: {job['state']}{note}")
    return 0


def cmd_results(api: JobsClient, args: argparse.Namespace) -> int:
    rows = list(api.results(args.job, verdict=args.verdict, task_id=args.task))
    _out(args, rows, _table([(r["id"], r["task_id"], r["sample"], r["state"], r["verdict"],
                              r["reward"], r["attempts"]) for r in rows],
                            ("ROLLOUT", "TASK", "SAMPLE", "STATE", "VERDICT", "REWARD",
                             "ATTEMPTS")) if rows else "no results")
    return 0


def _report_text(rep: dict[str, Any]) -> str:
    rows = []
    for p in rep["procedures"]:
        rate = "-" if p["pass_rate"] is None else \
            f"{p['pass_rate'] * 100:.0f}% ({p['passes']}/{p['completed']})"
        evidence = p.get("evidence") or [{"detail": ""}]
        rows.append((p["task_id"], p["verdict"], rate, evidence[0]["detail"][:100]))
    totals = ", ".join(f"{n} {v}" for v, n in rep["totals"].items())
    return (f"report of {rep['job_id']} ({rep['state']}): {totals}\n"
            + _table(rows, ("TASK", "VERDICT", "PASS RATE", "EVIDENCE")))


def cmd_report(api: JobsClient, args: argparse.Namespace) -> int:
    if args.html:
        Path(args.html).write_text(api.report_html(args.job))
        print(f"saved the report of {args.job} to {args.html}")
        return 0
    rep = api.report(args.job)
    _out(args, rep, _report_text(rep))
    return 0


def cmd_tasks(api: JobsClient, args: argparse.Namespace) -> int:
    tasks = api.tasks(product=args.product, split=args.split)
    _out(args, tasks, _table([(t["id"], t["product"], t["split"], t["difficulty"], t["title"])
                              for t in tasks], ("TASK", "PRODUCT", "SPLIT", "DIFFICULTY",
                                                "TITLE")) if tasks else "no tasks")
    return 0


def cmd_quota(api: JobsClient, args: argparse.Namespace) -> int:
    q = api.quota()
    used = q["used"]
    _out(args, q, f"team {q['team']}\n" + _table([
        ("queued jobs", used.get("queued_jobs"), q["queued_jobs"]),
        ("running episodes", used.get("running_episodes"), q["concurrent_episodes"]),
        ("env-minutes today", used.get("env_minutes_today"), q["env_minutes_per_day"]),
        ("samples per job", "", q["samples_per_job"])], ("QUOTA", "USED", "LIMIT")))
    return 0


# ---- documentation: console-rl docs check ----------------------------------------------------
_PAGE_TYPES = {".md": "text/markdown", ".markdown": "text/markdown", ".html": "text/html",
               ".htm": "text/html"}


def _read_page(path: str) -> dict[str, str]:
    kind = _PAGE_TYPES.get(Path(path).suffix.lower())
    if kind is None:
        raise UsageError(f"{path}: a page is Markdown or HTML ({', '.join(_PAGE_TYPES)})")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return {"name": Path(path).name, "content": text, "content_type": kind}


def _docs_json(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per procedure (static check only): its page, title, steps with their labels, verdict."""
    return [{"page": page["name"], "title": p["title"], "task_id": p["task_id"],
             "steps": [{"number": s["number"], "text": s["text"], "label": s["label"]}
                       for s in p["steps"]],
             "verdict": p["verdict"]["verdict"], "evidence": p["verdict"]["evidence"],
             "task": p["task"] is not None, "reason": p["reason"]}
            for page in result["pages"] for p in page["procedures"]]


def _report_json(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """Per procedure of a run's report: the same shape as :func:`_docs_json`, merged."""
    return [{"page": p.get("page", ""), "title": p["title"], "task_id": p["task_id"],
             "steps": [{"number": s["number"], "text": s["text"], "label": s["label"]}
                       for s in p["steps"]],
             "verdict": p["verdict"], "evidence": p["evidence"], "passes": p["passes"],
             "completed": p["completed"], "pass_rate": p["pass_rate"]}
            for p in rep["procedures"]]


def _docs_text(procs: list[dict[str, Any]], messages: list[str]) -> str:
    lines = list(messages)
    for p in procs:
        lines.append(f"{p['page']}: {p['title']}  [{p['verdict']}]")
        for s in p["steps"]:
            lines.append(f"  {s['number']:>4}. [{s['label'] or '-'}] {s['text']}")
        lines += [f"  {e['kind']}: {e['detail']}" for e in p["evidence"]]
    return "\n".join(lines) or "no procedures"


def _static_report(result: dict[str, Any]) -> dict[str, Any]:
    """A docs result in the report's shape, for the HTML page of a check that did not run."""
    procs = [{"task_id": p["task_id"], "title": p["title"], "page": page["name"],
              "samples": 0, "completed": 0, "env_failed": 0, "passes": 0, "pass_rate": None,
              "verdict": p["verdict"]["verdict"], "evidence": p["verdict"]["evidence"],
              "steps": p["steps"], "screenshot": None}
             for page in result["pages"] for p in page["procedures"]]
    from doccheck import VERDICTS
    return {"job_id": "static check (not run)", "state": "not run", "model": "-",
            "policy_version": None, "samples_per_task": 0, "procedures": procs,
            "totals": {v: sum(p["verdict"] == v for p in procs) for v in VERDICTS}}


class LocalDocs:
    """The static check of ``console-rl docs check`` without ``--run``, here, with no server
    and no token: the same reading, check and drafting the jobs API's ``POST /v1/docs`` does
    (:class:`doccheck.DocsService` with the committed inventories), answered in its shape."""

    def docs(self, pages: list[dict[str, str]], drift: str = "", run: bool = False,
             samples: int | None = None) -> dict[str, Any]:
        if run:
            raise UsageError("--run: runs go through the jobs API (pass --url and --token)")
        from doccheck import DocsInputError, DocsService, DocsUnavailable, PageIn
        from .routers.docs import DocsResult, page_out
        try:
            read = DocsService.default().read(
                [PageIn(p["name"], p["content"], p["content_type"]) for p in pages], drift)
        except DocsInputError as exc:
            raise UsageError(f"{exc.where}: {exc}") from None
        except DocsUnavailable as exc:
            raise UsageError(f"cannot check documentation here: {exc}") from None
        result = DocsResult(drift=drift, pages=[page_out(p) for p in read])
        if not any(p.procedures for p in read):
            result.message = "no procedure found in any page"
        return result.model_dump(mode="json")


def cmd_docs_check(api: JobsClient | LocalDocs, args: argparse.Namespace) -> int:
    pages = [_read_page(p) for p in args.pages]
    if args.samples is not None and not args.run_job:
        raise UsageError("--samples: only with --run")
    if args.executor != "agent" and not args.run_job:
        raise UsageError("--executor: only with --run")
    result = api.docs(pages, drift=args.drift, run=args.run_job, samples=args.samples,
                      **({"model": "replay"} if args.executor == "replay" else {}))
    messages = [f"{p['name']}: {p['message']}" for p in result["pages"] if p["message"]]
    messages += [result["message"]] if result.get("message") else []
    job = result.get("job")
    if not job:
        if args.html:
            from .report import render_html
            Path(args.html).write_text(render_html(_static_report(result)))
            print(f"saved the check to {args.html}", file=sys.stderr)
        procs = _docs_json(result)
        print(json.dumps({"drift": args.drift, "procedures": procs, "messages": messages},
                         indent=2) if args.json else _docs_text(procs, messages))
        return 0
    print(f"running {job['id']}: {len(job['task_ids'])} procedures x "
          f"{job['samples_per_task']} samples", file=sys.stderr)
    import contextlib
    with contextlib.redirect_stdout(sys.stderr):       # progress and its summary on stderr
        code = watch(api, job["id"])
    rep = api.report(job["id"])
    if args.html:
        Path(args.html).write_text(api.report_html(job["id"]))
        print(f"saved the report of {job['id']} to {args.html}", file=sys.stderr)
    procs = _report_json(rep)
    print(json.dumps({"drift": args.drift, "job_id": job["id"], "state": rep["state"],
                      "procedures": procs, "messages": messages}, indent=2)
          if args.json else _docs_text(procs, messages))
    return code


def add_docs_commands(groups: Any, common: argparse.ArgumentParser) -> None:
    docs = groups.add_parser("docs", help="check pages of documentation").add_subparsers(
        dest="cmd", required=True)
    sub = docs.add_parser("check", parents=[common], help="check pages against the console "
                                                          "(and run them with --run)")
    sub.add_argument("pages", nargs="+", metavar="PAGE", help="Markdown (.md) or HTML (.html)")
    sub.add_argument("--drift", default="", help="the console profile to check against")
    sub.add_argument("--run", action="store_true", dest="run_job",
                     help="run the drafted tasks with the agent")
    sub.add_argument("--samples", type=int, help="samples per procedure (K) with --run")
    sub.add_argument("--executor", choices=("agent", "replay"), default="agent",
                     help="with --run, who carries the procedures out: the served agent "
                          "(default) or the replay of the static check's resolution")
    sub.add_argument("--html", metavar="FILE", help="save the HTML report to FILE")
    sub.set_defaults(run=cmd_docs_check)


# ---- parsing -----------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    s = argparse.SUPPRESS          # given before or after the command, either works
    common.add_argument("--url", default=s, help=f"API URL (env CONSOLE_RL_URL, {DEFAULT_URL})")
    common.add_argument("--token", default=s, help="bearer token (env CONSOLE_RL_TOKEN)")
    common.add_argument("--json", action="store_true", default=s, help="print raw JSON")
    top = argparse.ArgumentParser(prog="console-rl", parents=[common],
                                  description="Run documented console procedures with the "
                                              "trained agent (the console-rl jobs API).")
    groups = top.add_subparsers(dest="group", required=True,
                                metavar="{jobs,tasks,quota,docs}")
    jobs = groups.add_parser("jobs", help="submit, follow and read jobs").add_subparsers(
        dest="cmd", required=True)
    sub = jobs.add_parser("submit", parents=[common], help="submit a job")
    sel = sub.add_mutually_exclusive_group(required=True)
    sel.add_argument("--ids", help="task ids, comma-separated")
    sel.add_argument("--split", choices=("train", "heldout"))
    sel.add_argument("--regex", help="an RE2 regular expression searched in each task id (no "
                                     "backreferences or lookaround)")
    sel.add_argument("--inline", nargs="+", metavar="FILE", help="task files (YAML or JSON)")
    sub.add_argument("--samples", type=int, help="samples per task (K)")
    sub.add_argument("--model", help="'live' (default), 'oracle' (the scripted teacher: "
                     "catalogue tasks only, seconds an episode) or a registered model")
    sub.add_argument("--temperature", type=float)
    sub.add_argument("--max-steps", type=int)
    sub.add_argument("--priority", type=int, help="0-9, higher first")
    sub.add_argument("--deadline-s", type=float, help="expire after this many seconds")
    sub.add_argument("--idempotency-key", help="resubmitting with it returns the same job")
    sub.add_argument("--watch", action="store_true", help="then follow it to its end")
    sub.set_defaults(run=cmd_submit)
    sub = jobs.add_parser("list", parents=[common], help="the team's jobs, newest first")
    sub.add_argument("--limit", type=int, default=20)
    sub.set_defaults(run=cmd_list)
    for name, run, text in (("get", cmd_get, "one job"), ("cancel", cmd_cancel, "cancel a job"),
                            ("watch", lambda api, a: watch(api, a.job, a.json),
                             "follow a job to its end")):
        jobs.add_parser(name, parents=[common], help=text).set_defaults(run=run)
    sub = jobs.add_parser("results", parents=[common], help="a job's rollouts")
    sub.add_argument("--verdict", choices=("success", "failure", "infeasible", "undetermined"))
    sub.add_argument("--task", help="only this task id")
    sub.set_defaults(run=cmd_results)
    sub = jobs.add_parser("report", parents=[common], help="per-procedure verdicts")
    sub.add_argument("--html", metavar="FILE", help="save the HTML report to FILE")
    sub.set_defaults(run=cmd_report)
    for name in ("get", "watch", "cancel", "results", "report"):
        jobs.choices[name].add_argument("job", metavar="JOB")
    tasks = groups.add_parser("tasks", help="the task catalog").add_subparsers(
        dest="cmd", required=True)
    sub = tasks.add_parser("list", parents=[common], help="list tasks")
    sub.add_argument("--product")
    sub.add_argument("--split", choices=("train", "heldout"))
    sub.set_defaults(run=cmd_tasks)
    groups.add_parser("quota", parents=[common], help="the team's quota and use"
                      ).set_defaults(run=cmd_quota)
    add_docs_commands(groups, common)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inventory"]:      # local files: no API, no token
        from doccheck import inventory_diff_main
        return inventory_diff_main(argv[1:])
    top = parser()
    try:
        args = top.parse_args(argv)
    except SystemExit as exc:                  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    args.json = getattr(args, "json", False)
    if args.group == "docs" and not args.run_job:     # the static check: no API, no token
        try:
            return cmd_docs_check(LocalDocs(), args)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    url = getattr(args, "url", None) or os.environ.get("CONSOLE_RL_URL") or DEFAULT_URL
    token = getattr(args, "token", None) or os.environ.get("CONSOLE_RL_TOKEN", "")
    if not token:
        print("error: no token: pass --token or set CONSOLE_RL_TOKEN", file=sys.stderr)
        return 2
    try:
        with JobsClient(url, token) as api:
            return args.run(api, args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:                  # a malformed token or URL (never echoed)
        print(f"error: {str(exc).replace(token, 'crl_***')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
