"""The documentation-verification report of a job: per procedure, the pass rate over its K
samples and a verdict, and for a broken one where and why it broke.

Verdicts (env errors never count against a procedure: a rollout that failed for the
environment's sake is left out, and too few that ran leave it ``inconclusive``):
- ``works``: every completed sample passed (the agent did it and the audit log agrees);
- ``broken``: none passed;
- ``flaky``: some passed;
- ``inconclusive``: fewer than half of the samples completed, or the judges could not decide
  on any of them.

For a broken procedure: the step where the agent failed (the first step of the procedure whose
named controls the agent never acted on; the last step when it acted on every one), the agent's
infeasibility reason, the deciding audit events and the screenshot of the failing page (the
last page of a failing sample).
"""
from __future__ import annotations

import html
import re
from typing import Any

from consolerl.tasks import Task

from .schema import Job, Rollout

_STEP = re.compile(r"^\s*(\d+)[.)]\s+(.*)$")
_PHRASE = re.compile(r"\b([A-Z][\w/-]*(?:\s+[A-Z][\w/-]*)*)")
_SKIP = {"Open", "Click", "Choose", "On", "In", "Enter", "Select", "Go", "Set", "The", "A",
         "Allow", "Deny", "Type", "Fill"}


def procedure_steps(procedure: str) -> list[str]:
    steps = [m.group(2).strip() for m in map(_STEP.match, procedure.splitlines()) if m]
    return steps or [line.strip() for line in procedure.splitlines() if line.strip()]


def _phrases(step: str) -> list[str]:
    out = []
    for m in _PHRASE.finditer(step):
        words = [w for w in m.group(1).split() if w not in _SKIP]
        if words and not (len(words) == 1 and len(words[0]) <= 2):
            out.append(" ".join(words).lower())
    return out


def failed_step(task: Task, rollout: Rollout) -> dict[str, Any]:
    """Where a failing sample stopped following the procedure (see the module docstring)."""
    steps = procedure_steps(task.procedure)
    touched = " ".join(f"{s.target} {s.title}" for s in rollout.steps).lower()
    for i, text in enumerate(steps):
        phrases = _phrases(text)
        if phrases and not any(p in touched for p in phrases):
            return {"index": i + 1, "text": text}
    return {"index": len(steps), "text": steps[-1] if steps else ""}


def procedure_verdict(samples: int, done: list[Rollout]) -> str:
    decided = [r for r in done if r.verdict != "undetermined"]
    if len(done) * 2 < samples or not decided:
        return "inconclusive"
    passes = sum(r.verdict == "success" for r in decided)
    if passes == len(decided):
        return "works"
    return "broken" if passes == 0 else "flaky"


def build_report(job: Job, tasks: dict[str, Task], rollouts: list[Rollout]) -> dict[str, Any]:
    procedures = []
    for tid in job.task_ids:
        mine = [r for r in rollouts if r.task_id == tid]
        done = [r for r in mine if r.state == "completed"]
        passes = sum(r.verdict == "success" for r in done)
        entry: dict[str, Any] = {
            "task_id": tid, "title": tasks[tid].title if tid in tasks else tid,
            "samples": len(mine), "completed": len(done),
            "env_failed": sum(r.state == "failed" for r in mine),
            "passes": passes, "pass_rate": round(passes / len(done), 4) if done else None,
            "verdict": procedure_verdict(len(mine), done) if mine else "inconclusive",
        }
        failing = [r for r in done if r.verdict in ("failure", "infeasible")]
        if entry["verdict"] in ("broken", "flaky") and failing and tid in tasks:
            worst = next((r for r in failing if r.verdict == "infeasible"), failing[0])
            shots = [s.screenshot for s in worst.steps if s.screenshot]
            entry["failure"] = {
                "rollout_id": worst.id,
                "step": failed_step(tasks[tid], worst),
                "infeasible_reason": worst.infeasible_reason,
                "end_reason": worst.end_reason,
                "audit_events": [e.model_dump() for e in worst.deciding_events],
                "reasons": worst.reasons[:3],
                "screenshot": shots[-1] if shots else None,
                "last_url": worst.steps[-1].url if worst.steps else "",
            }
        procedures.append(entry)
    totals = {v: sum(p["verdict"] == v for p in procedures)
              for v in ("works", "broken", "flaky", "inconclusive")}
    return {"object": "report", "job_id": job.id, "state": job.state, "model": job.model,
            "policy_version": job.policy_version, "samples_per_task": job.samples_per_task,
            "created_at": job.created_at, "finished_at": job.finished_at, "totals": totals,
            "procedures": procedures}


_COLOURS = {"works": "#1a7f37", "broken": "#cf222e", "flaky": "#9a6700",
            "inconclusive": "#57606a"}


def render_html(report: dict[str, Any], artifact_url: str = "/v1/artifacts/") -> str:
    e = html.escape
    rows = []
    for p in report["procedures"]:
        colour = _COLOURS[p["verdict"]]
        rate = "–" if p["pass_rate"] is None else f"{p['pass_rate'] * 100:.0f}%"
        detail = ""
        f = p.get("failure")
        if f:
            events = "".join(
                f"<li><code>{e(a['event_name'])}</code> at {e(a['event_time'])}"
                f"{' — error <code>' + e(a['error_code']) + '</code>' if a['error_code'] else ''}"
                "</li>" for a in f["audit_events"]) or "<li>none in the audit log</li>"
            shot = (f'<img alt="the failing page" src="{e(artifact_url + f["screenshot"])}">'
                    if f["screenshot"] else "<p>No screenshot.</p>")
            reason = (f"<p><b>Agent's reason:</b> {e(f['infeasible_reason'])}</p>"
                      if f["infeasible_reason"] else "")
            why = "".join(f"<li>{e(r)}</li>" for r in f["reasons"])
            why = f"<p><b>Why:</b></p><ul>{why}</ul>" if why else ""
            detail = (f"<div class=detail><p><b>Failed at step {f['step']['index']}:</b> "
                      f"{e(f['step']['text'])}</p>{reason}{why}<p><b>Deciding audit "
                      f"events:</b></p><ul>{events}</ul>{shot}</div>")
        rows.append(
            f"<section class=proc><h2>{e(p['title'])} <small>{e(p['task_id'])}</small></h2>"
            f"<p><span class=badge style='background:{colour}'>{p['verdict']}</span> "
            f"passed {p['passes']} of {p['completed']} completed ({rate}); "
            f"{p['samples']} samples, {p['env_failed']} lost to the environment</p>"
            f"{detail}</section>")
    totals = ", ".join(f"{n} {v}" for v, n in report["totals"].items())
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>Documentation check {e(report['job_id'])}</title>
<style>
body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1f2328}}
.proc{{border:1px solid #d0d7de;border-radius:6px;padding:.5rem 1rem;margin:1rem 0}}
.badge{{color:#fff;border-radius:1rem;padding:.1rem .6rem;font-weight:600}}
small{{color:#57606a;font-weight:normal}} img{{max-width:100%;border:1px solid #d0d7de}}
</style></head><body>
<h1>Documentation check</h1>
<p>Job <code>{e(report['job_id'])}</code> ({e(report['state'])}), model {e(report['model'])}
(policy version {report['policy_version']}), {report['samples_per_task']} samples per
procedure. <b>{e(totals)}</b>.</p>
{''.join(rows) or '<p>No procedures.</p>'}
</body></html>
"""
