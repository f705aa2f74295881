"""The documentation checker with the agent, end to end through the jobs API:
``python -m benchmarks.docs_agent --model runs/demo/final --samples 3 --json``.

Starts the jobs API on this machine (``cluster.serve`` with ``configs/serve.yaml``: its own
Redis, local cloud, Ray, the policy ``--model`` on the transformers backend, ``--workers`` env
workers) in a temporary run folder, then sends every page of the corpus to ``POST /v1/docs``
with ``run: true`` (one request per console profile the labels name), follows the jobs to their
end and reads their reports. A procedure that was run gets the report's verdict (static check
and K runs merged); one with no drafted task keeps the answer's static-only verdict.

Prints one JSON object: ``works_share`` (correct and stale procedures whose verdict is
``works`` or ``works_text_stale``), ``broken_precision`` (procedures reported ``broken`` that the
labels call defective), ``broken_without_evidence`` (must be 0), per label status the share of each
verdict (``correct``: works / works_text_stale / inconclusive / broken), ``episodes``,
``wall_s`` and, per procedure, its label, verdict and evidence. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from benchmarks.docs import CORPUS, content_type
from jobsapi.auth import TeamQuota, TokenBook
from jobsapi.client import ApiError, JobsClient

ROOT = Path(__file__).resolve().parent.parent
MAX_PAGES = 20          # pages per POST /v1/docs


def _progress(msg: str) -> None:
    print(f"[docs-agent] {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_api(run_dir: Path, model: str, workers: int, max_steps: int
              ) -> tuple[subprocess.Popen, str, str]:
    """``cluster.serve`` in ``run_dir``; returns the process, its URL and a token."""
    port = _free_port()
    tokens = run_dir / "tokens.json"
    token = TokenBook(tokens).create("docs-bench", ["jobs:read", "jobs:write"],
                                     TeamQuota(concurrent_episodes=workers, samples_per_job=500,
                                               env_minutes_per_day=10000.0))
    args = [sys.executable, "-m", "cluster.serve", "--config", "configs/serve.yaml",
            f"policy.model={model}", f"run.dir={run_dir / 'run'}", f"api.port={port}",
            f"api.tokens_file={tokens}", f"api.workers={workers}",
            f"agent.max_steps={max_steps}", "api.default_team=docs-bench",
            f"cloud.endpoint=127.0.0.1:{_free_port()}",
            f"stream.url=redis://127.0.0.1:{_free_port()}/0",
            f"env.pool.key_prefix=consolerl:docsbench:{port}:pool"]
    log = open(run_dir / "serve.log", "w")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "RAY_ADDRESS": "local"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cluster.serve exited {proc.returncode}; see "
                               f"{run_dir / 'serve.log'}")
        try:
            with JobsClient(url, token, timeout=5) as api:
                api.quota()
            return proc, url, token
        except ApiError:
            time.sleep(3)
    proc.terminate()
    raise RuntimeError(f"the API did not answer in 600 s; see {run_dir / 'serve.log'}")


def wait(api: JobsClient, job_id: str, limit_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    last = ""
    while time.monotonic() < deadline:
        job = api.job(job_id)
        state = f"{job['state']} {json.dumps(job.get('episodes', {}), sort_keys=True)}"
        if state != last:
            _progress(f"job {job_id}: {state}")
            last = state
        if job["state"] in ("succeeded", "failed", "cancelled", "expired", "completed"):
            return job
        time.sleep(10)
    api.cancel(job_id)
    raise TimeoutError(f"job {job_id} did not end in {limit_s:.0f} s")


def run_corpus(url: str, token: str, corpus: Path, samples: int, limit_s: float,
               executor: str = "agent") -> dict[tuple[str, str], dict[str, Any]]:
    """(page, title) -> {verdict, evidence, source: report|static}. ``executor``: ``agent``
    (the served policy, model ``live``) or ``replay`` (model ``replay``)."""
    labels = yaml.safe_load((corpus / "labels.yaml").read_text())
    by_drift: dict[str, set[str]] = {}
    for e in labels:
        by_drift.setdefault(e.get("drift") or "", set()).add(e["page"])
    out: dict[tuple[str, str], dict[str, Any]] = {}
    chunks = [(drift, sorted(pages)[i:i + MAX_PAGES]) for drift, pages in sorted(by_drift.items())
              for i in range(0, len(pages), MAX_PAGES)]
    with JobsClient(url, token, timeout=120) as api:
        jobs = []
        for drift, pages in chunks:
            body = [{"name": p, "content": (corpus / p).read_text(),
                     "content_type": content_type(corpus / p)} for p in pages]
            answer = api.docs(body, drift=drift, run=True, samples=samples,
                              **({"model": "replay"} if executor == "replay" else {}))
            task_of: dict[str, tuple[str, str]] = {}
            for page in answer["pages"]:
                for proc in page["procedures"]:
                    key = (page["name"], proc["title"])
                    out[key] = {"verdict": proc["verdict"]["verdict"],
                                "evidence": proc["verdict"]["evidence"], "source": "static",
                                "reason": proc["reason"]}
                    if proc["task"] is not None:
                        task_of[proc["task_id"]] = key
            job = answer.get("job")
            if job:
                _progress(f"drift {drift!r}: job {job['id']} with {len(task_of)} procedures "
                          f"x {samples}")
                jobs.append((job["id"], task_of))
        for job_id, task_of in jobs:
            wait(api, job_id, limit_s)
            report = api.report(job_id)
            for p in report["procedures"]:
                key = task_of.get(p["task_id"])
                if key is not None:
                    out[key] = {"verdict": p["verdict"], "evidence": p.get("evidence", []),
                                "source": "report", "passes": p.get("passes"),
                                "completed": p.get("completed")}
    return out


def figures(corpus: Path, verdicts: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    labels = yaml.safe_load((corpus / "labels.yaml").read_text())
    shares: dict[str, Counter] = {}
    broken_ok = broken_all = no_evidence = 0
    rows = []
    for e in labels:
        got = verdicts.get((e["page"], e["title"]), {"verdict": "missing", "evidence": []})
        shares.setdefault(e["status"], Counter())[got["verdict"]] += 1
        if got["verdict"] == "broken":
            broken_all += 1
            broken_ok += e["status"] == "defective"
            no_evidence += not got["evidence"]
        rows.append({"page": e["page"], "title": e["title"], "status": e["status"],
                     "verdict": got["verdict"], "source": got.get("source"),
                     "evidence": [ev.get("detail", "")[:160] for ev in got["evidence"]][:3]})
    share = {status: {v: round(n / sum(c.values()), 4) for v, n in sorted(c.items())}
             for status, c in shares.items()}
    sound = [r for r in rows if r["status"] in ("correct", "stale")]
    works = sum(r["verdict"] in ("works", "works_text_stale") for r in sound)
    return {"works_share": round(works / len(sound), 4) if sound else None,
            "broken_precision": round(broken_ok / broken_all, 4) if broken_all else None,
            "broken": broken_all, "broken_without_evidence": no_evidence,
            "correct_broken": shares.get("correct", Counter())["broken"],
            "shares": share, "procedures": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.docs_agent",
                                     description="The documentation checker with the agent.")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--model", default="runs/demo/final")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--executor", choices=("agent", "replay"), default="agent",
                        help="who runs the drafted procedures: the served policy (agent) or "
                             "the replay of the static check's resolution (replay)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--limit-s", type=float, default=5400.0,
                        help="give up on a job after this long")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="docs-agent-") as tmp:
        proc, url, token = start_api(Path(tmp), args.model, args.workers, args.max_steps)
        _progress(f"API at {url}")
        try:
            verdicts = run_corpus(url, token, args.corpus, args.samples, args.limit_s,
                                  args.executor)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
    out = {"model": args.model, "executor": args.executor, "samples": args.samples,
           "workers": args.workers,
           "max_steps": args.max_steps, **figures(args.corpus, verdicts),
           "wall_s": round(time.monotonic() - started, 1)}
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
