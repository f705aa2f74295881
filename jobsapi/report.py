"""The documentation-verification report of a job: per procedure, the pass rate over its K
samples and a verdict with its evidence (:func:`doccheck.verdict.procedure_verdict`:
``works``, ``works_text_stale``, ``broken`` only with evidence, ``inconclusive``), the steps
annotated with the static check when there is one, and a screenshot.

Environment errors never count against a procedure: a rollout the environment failed is left
out. The static check comes from a documentation job's spec (``POST /v1/docs`` with ``run``
keeps it there) or, for catalogue tasks, from whoever ran one (``static``); without it a
catalogue task is ``broken`` only on the audit log's or the catalogue's evidence.

For a procedure that did not work: where the agent stopped (the first step whose named controls
it never acted on; the last step when it acted on every one), its infeasibility reason, the
deciding audit events and the screenshot of its last page. Otherwise (it worked, or it is
broken on static evidence though every sample passed): the last screenshot of a passing
sample. The HTML embeds the screenshots (``data:`` URIs), so the page shows them wherever it
is opened, with no credential.
"""
from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from consolerl.tasks import Task
from consolerl.text import numbered_step

from doccheck import VERDICTS, Procedure, StepCheck, procedure_verdict, to_json
from .schema import ORACLE_MODEL, REPLAY_MODEL, SCRIPTED_MODELS, Job, Rollout

_PHRASE = re.compile(r"\b([A-Z][\w/-]*(?:\s+[A-Z][\w/-]*)*)")
_SKIP = {"Open", "Click", "Choose", "On", "In", "Enter", "Select", "Go", "Set", "The", "A",
         "Allow", "Deny", "Type", "Fill"}


def procedure_steps(procedure: str) -> list[str]:
    steps = [m[1].strip() for m in map(numbered_step, procedure.splitlines()) if m]
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


def _steps(task: Task | None, proc: Procedure | None,
           checks: Sequence[StepCheck]) -> list[dict[str, Any]]:
    """The procedure's steps, each with its static label when there is a check."""
    if proc is not None:
        texts = [(s.number, s.text) for s in proc.steps]
    elif task is not None:
        texts = [(str(i), t) for i, t in enumerate(procedure_steps(task.procedure), 1)]
    else:
        texts = [(c.number, c.mention) for c in checks]
    by_number = {c.number: c for c in checks}
    out = []
    for number, text in texts:
        c = by_number.get(number)
        out.append({"number": number, "text": text, "label": c.label if c else None,
                    "closest": c.closest if c else "", "detail": c.detail if c else ""})
    return out


def _last_shot(rollout: Rollout) -> str | None:
    shots = [s.screenshot for s in rollout.steps if s.screenshot]
    return shots[-1] if shots else None


def build_report(job: Job, tasks: Mapping[str, Task], rollouts: list[Rollout],
                 static: Mapping[str, Sequence[StepCheck]] | None = None,
                 procedures: Mapping[str, Procedure] | None = None) -> dict[str, Any]:
    """The report as JSON data. ``static``: task id -> the static check of its procedure;
    ``procedures``: task id -> the documented procedure it was drafted from (its page and
    steps; a documentation job has both in its spec)."""
    static, procedures = static or {}, procedures or {}
    entries = []
    for tid in job.task_ids:
        task, proc = tasks.get(tid), procedures.get(tid)
        checks = tuple(static.get(tid, ()))
        mine = [r for r in rollouts if r.task_id == tid]
        done = [r for r in mine if r.state == "completed"]
        operations = {rule.event for rule in task.success.required_events} if task else set()
        known = task.infeasible_reason or "the catalogue marks it infeasible" \
            if task is not None and task.expected == "infeasible" else ""
        verdict = procedure_verdict(checks, mine, samples=job.samples_per_task,
                                    operations=operations, known_defect=known,
                                    executor="replay" if job.model == REPLAY_MODEL
                                    else "agent")
        passes = sum(r.verdict == "success" for r in done)
        entry: dict[str, Any] = {
            "task_id": tid, "title": proc.title if proc else task.title if task else tid,
            "page": proc.source if proc else "",
            "samples": len(mine), "completed": len(done),
            "env_failed": sum(r.state == "failed" for r in mine),
            "passes": passes, "pass_rate": round(passes / len(done), 4) if done else None,
            "verdict": verdict.verdict, "evidence": to_json(verdict.evidence),
            "steps": _steps(task, proc, checks), "screenshot": None,
        }
        winning = [r for r in done if r.verdict == "success" and _last_shot(r)]
        failing = [r for r in done if r.verdict in ("failure", "infeasible", "undetermined")]
        works = verdict.verdict.startswith("works")
        if (works or not failing) and winning:
            entry["screenshot"] = _last_shot(winning[0])
        elif not works and failing:
            worst = next((r for r in failing if r.verdict == "infeasible"), failing[0])
            entry["screenshot"] = _last_shot(worst)
            entry["failure"] = {
                "rollout_id": worst.id,
                "step": failed_step(task, worst) if task else None,
                "infeasible_reason": worst.infeasible_reason,
                "claim": worst.claim.model_dump() if worst.claim else None,
                "decided_by": worst.decided_by,
                "end_reason": worst.end_reason,
                "end_detail": worst.end_detail,
                "audit_events": [e.model_dump() for e in worst.deciding_events],
                "reasons": worst.reasons[:3],
                "screenshot": entry["screenshot"],
                "last_url": worst.steps[-1].url if worst.steps else "",
            }
        entries.append(entry)
    totals = {v: sum(p["verdict"] == v for p in entries) for v in VERDICTS}
    return {"object": "report", "job_id": job.id, "state": job.state, "model": job.model,
            "scripted": job.model in SCRIPTED_MODELS,
            "executor": ("replay" if job.model == REPLAY_MODEL else
                         "oracle" if job.model == ORACLE_MODEL else "agent"),
            "policy_version": job.policy_version, "samples_per_task": job.samples_per_task,
            "created_at": job.created_at, "finished_at": job.finished_at, "totals": totals,
            "procedures": entries}


def screenshot_ids(report: Mapping[str, Any]) -> list[str]:
    """The artifacts the report's HTML shows (fetch them for :func:`render_html`)."""
    return [p["screenshot"] for p in report["procedures"] if p.get("screenshot")]


# ---- HTML -------------------------------------------------------------------------------------
COLOURS = {"works": "#1a7f37", "works_text_stale": "#4d7c0f", "broken": "#cf222e",
           "inconclusive": "#57606a"}
_LABEL_COLOURS = {"ok": "#1a7f37", "label_differs": "#9a6700", "missing": "#cf222e",
                  "unreachable": "#cf222e", "ambiguous": "#bc4c00",
                  "not_applicable": "#cf222e"}
_e = html.escape


def _badge(text: str, colour: str, cls: str = "badge") -> str:
    return f"<span class={cls} style='background:{colour}'>{_e(text)}</span>"


def _step_html(s: dict[str, Any]) -> str:
    label = s.get("label")
    badge = _badge(label, _LABEL_COLOURS.get(label, "#57606a"), "label") if label else ""
    near = (f" <span class=closest>the console: <b>{_e(s['closest'])}</b></span>"
            if s.get("closest") and label not in (None, "ok") else "")
    detail = (f"<div class=stepdetail>{_e(s['detail'])}</div>"
              if s.get("detail") and label not in (None, "ok") else "")
    return (f"<li value='{_e(str(s['number']).split('.')[0])}' data-step='{_e(s['number'])}' "
            f"data-label='{_e(label or '')}'>{badge} {_e(s['text'])}{near}{detail}</li>")


def _image(aid: str | None, images: Mapping[str, tuple[str, bytes] | None], alt: str) -> str:
    if not aid:
        return ""
    if aid in images and images[aid] is None:
        return "<p class=noshot>Screenshot no longer kept (past its retention).</p>"
    found = images.get(aid)
    if found is None:
        return (f"<p class=noshot>Screenshot <code>{_e(aid)}</code> (not embedded: "
                f"<code>GET /v1/artifacts/{_e(aid)}</code> with a token).</p>")
    mime, data = found
    if mime not in ("image/png", "image/jpeg", "image/webp", "image/gif"):
        return ""
    uri = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return f'<img class=screenshot alt="{_e(alt)}" src="{uri}">'


def _failure_html(f: dict[str, Any]) -> str:
    events = "".join(
        f"<li><code>{_e(a['event_name'])}</code> at {_e(a['event_time'])}"
        f"{' — error <code>' + _e(a['error_code']) + '</code>' if a['error_code'] else ''}"
        "</li>" for a in f["audit_events"]) or "<li>none in the audit log</li>"
    step = (f"<p><b>The agent stopped at step {f['step']['index']}:</b> "
            f"{_e(f['step']['text'])}</p>" if f.get("step") else "")
    reason = (f"<p><b>Agent's reason:</b> {_e(f['infeasible_reason'])}</p>"
              if f["infeasible_reason"] else "")
    claim = f.get("claim")
    if claim:
        said = "; ".join(claim["reasons"]) or claim["kind"]
        reason += (f"<p><b>Checked against the evidence:</b> {_e(claim['kind'])} — "
                   f"{_e(said)}</p>")
    why = "".join(f"<li>{_e(r)}</li>" for r in f["reasons"])
    why = f"<p><b>Why:</b></p><ul>{why}</ul>" if why else ""
    return (f"<div class=detail>{step}{reason}{why}<p><b>Deciding audit events:</b></p>"
            f"<ul>{events}</ul></div>")


def _procedure_html(p: dict[str, Any],
                    images: Mapping[str, tuple[str, bytes] | None]) -> str:
    rate = "–" if p["pass_rate"] is None else f"{p['pass_rate'] * 100:.0f}%"
    evidence = "".join(
        f"<li><b>{_e(ev['kind'])}</b>{' (' + _e(ev['ref']) + ')' if ev['ref'] else ''}"
        f": {_e(ev['detail'])}</li>" for ev in p["evidence"])
    steps = "".join(_step_html(s) for s in p["steps"])
    verdict = p["verdict"]
    alt = "the last page of a failing sample" if p.get("failure") else \
        "the last page of a passing sample"
    return (f"<section class=proc data-verdict='{_e(verdict)}'><h3>{_e(p['title'])} "
            f"<small>{_e(p['task_id'])}</small></h3>"
            f"<p>{_badge(verdict, COLOURS.get(verdict, '#57606a'))} passed {p['passes']} of "
            f"{p['completed']} completed ({rate}); {p['samples']} samples, {p['env_failed']} "
            f"lost to the environment</p><p><b>Evidence:</b></p><ul class=evidence>{evidence}"
            f"</ul><ol class=steps>{steps}</ol>"
            f"{_failure_html(p['failure']) if p.get('failure') else ''}"
            f"{_image(p.get('screenshot'), images, alt)}</section>")


def render_html(report: dict[str, Any],
                images: Mapping[str, tuple[str, bytes] | None] | None = None) -> str:
    """The report as one self-contained page: per documentation page its procedures, each with
    its verdict, evidence, steps annotated with the static check, and the screenshot embedded
    from ``images`` (artifact id -> (mime, bytes); None: no longer kept, said so; one it lacks
    is named, not linked). Every text from a page, an agent or the console is escaped."""
    images = images or {}
    pages: dict[str, list[str]] = {}
    for p in report["procedures"]:
        pages.setdefault(p.get("page") or "", []).append(_procedure_html(p, images))
    body = "".join(
        f"<article class=page><h2>{_e(page) if page else 'Catalogue tasks'}</h2>"
        f"{''.join(items)}</article>" for page, items in pages.items())
    totals = ", ".join(f"{n} {v}" for v, n in report["totals"].items())
    who = (f"model {_e(report['model'])} (policy version {report['policy_version']})"
           if not report.get("scripted") else
           f"model {_e(report['model'])}: the replay, not a trained agent (each procedure's "
           "steps as the static check resolved them, carried out literally in the browser "
           "and judged by the audit log: a pass shows the steps work as written)"
           if report.get("executor") == "replay" else
           f"model {_e(report['model'])}: the scripted teacher, not a trained agent (it "
           "follows a fixed script per task: a pass says the console and the pipeline work, "
           "not that an agent can follow the documentation)")
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>Documentation check {_e(report['job_id'])}</title>
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<style>
body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#1f2328}}
.proc{{border:1px solid #d0d7de;border-radius:6px;padding:.5rem 1rem;margin:1rem 0}}
.badge,.label{{color:#fff;border-radius:1rem;padding:.1rem .6rem;font-weight:600}}
.label{{font-size:.8em;padding:0 .5rem}} .closest{{color:#9a6700}}
.stepdetail{{color:#57606a;font-size:.9em}}
small{{color:#57606a;font-weight:normal}} img{{max-width:100%;border:1px solid #d0d7de}}
</style></head><body>
<h1>Documentation check</h1>
<p>Job <code>{_e(report['job_id'])}</code> ({_e(report['state'])}), {who},
{report['samples_per_task']} samples per procedure. <b>{_e(totals)}</b>.</p>
{body or '<p>No procedures.</p>'}
</body></html>
"""
