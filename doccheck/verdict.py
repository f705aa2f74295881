"""A procedure's verdict: its static check and its runs merged, each verdict with the evidence
that supports it. A doc team acts on ``broken``, so ``broken`` needs evidence it can be sure
of; an agent that failed says something about the agent, not the doc.

The static check's defect labels (``missing``, ``unreachable``, ``ambiguous``,
:data:`~.model.DEFECT_LABELS`; an optional step the console has nothing for,
``not_applicable``, is none) are *sure* (nothing near the named control anywhere the steps
reach, a value the console refuses, a product it lacks) or *suspicions*
(:attr:`~.model.StepCheck.suspect`: the control is on another page, several match, or a
control near it in name is where the step is: a reworded label may be the same control). Who
ran the samples (``executor``): the learned agent, or the replay (:mod:`.replay`: the steps as
the static check resolved them, carried out literally); either is judged by the audit log.

In order:

1. **broken, static**: a sure defect. This wins over passing samples: a run that reached the
   goal another way does not make a control that is not there appear; the passes are kept on
   the verdict.
2. **works** / **works_text_stale**: at least one completed sample passed: the reward
   service's rule found the required audit events, so success is evidence. ``passes`` of
   ``samples`` (the completed ones) is the pass rate (there is no ``flaky``: a procedure that
   works some of the time works). ``works_text_stale`` when a step's label differs from the
   console's, or a suspected defect the run got past (the evidence names each such step and
   the console's label).
3. **broken, confirmed infeasible**: no sample passed, and a sample the agent (or the replay,
   which reports the console's refusal of the documented values, quoting it) reported
   infeasible has its claim confirmed by the reward service's evidence channel
   (:mod:`reward_service.evidence`): what its reason names as missing is on no page it saw nor
   in the console's inventory, or the console refused the documented values as it reported.
   Neither the agent's word nor a judge's makes ``broken``: a claim the pages contradict, one
   that names nothing of the procedure, or one the channel could not check is listed as
   evidence of the agent, and decides nothing; nor does a confirmed claim whose missing names
   the static check found renamed (the agent did not recognise the new label: the text is
   stale, the procedure not shown broken).
4. **inconclusive**: otherwise: too few samples completed (fewer than ``min_completed`` of the
   ``samples`` asked for; rollouts the environment failed never count), or no sample passed
   and nothing sure shows the doc is wrong: a suspected defect no run got past stays a
   suspicion, listed as evidence with where the run stopped. Refusals of the console seen
   without a confirmed claim are listed but decide nothing (the agent may have typed a wrong
   value itself).

With no samples at all (``samples == 0``: the static check alone), the verdict is ``broken``
with a sure defect as evidence, else ``inconclusive`` with the static summary ("static check
passed; not run", or the suspicions): a static pass shows the labels are right, not that the
procedure works.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from consolerl.text import norm

from .model import (DEFECT_LABELS, Evidence, EvidenceKind, StepCheck, StepLabel, Verdict,
                    VerdictKind)


class _Event(Protocol):
    event_name: str
    error_code: str | None


class _Claim(Protocol):
    kind: str
    confirmed: bool
    reasons: Sequence[str]
    missing: Sequence[str]


class Rollout(Protocol):
    """What the verdict reads of one sample. The jobs API's rollout model (``jobsapi.schema``)
    has these fields; the checker does not import it (the jobs API sits above the checker)."""
    id: str
    sample: int
    state: str
    verdict: str | None
    infeasible_reason: str | None
    end_detail: str | None          # why a scripted run (the replay) stopped early

    @property
    def claim(self) -> _Claim | None: ...

    @property
    def deciding_events(self) -> Sequence[_Event]: ...

EXECUTORS = ("agent", "replay")
NOT_RUN = "static check passed; not run"
NO_EVIDENCE = "the agent did not complete it; no evidence the doc is wrong"


def static_evidence(checks: Sequence[StepCheck]
                    ) -> tuple[list[Evidence], list[Evidence], list[Evidence]]:
    """(sure defects, suspected defects, stale): one :class:`Evidence` per defective step (a
    suspicion says so) and per step whose label differs, ``ref`` the step number."""
    defects, suspects, stale = [], [], []
    for c in checks:
        if c.label in DEFECT_LABELS:
            near = f"; the closest control is {c.closest!r}" if c.closest else ""
            what = f" {c.mention!r}" if c.mention else ""
            detail = c.detail or f"{c.label.replace('_', ' ')}{what}"
            doubt = " (suspected: a run may get past it)" if c.suspect else ""
            (suspects if c.suspect else defects).append(Evidence(
                EvidenceKind.STATIC, f"step {c.number} ({c.label}{doubt}): {detail}"
                                     f"{near if c.closest not in detail else ''}", c.number))
        elif c.label == StepLabel.LABEL_DIFFERS:
            says = f"says {c.mention!r}" if c.mention else "names a control"
            stale.append(Evidence(EvidenceKind.STATIC, f"step {c.number} {says}; the console's label is "
                                            f"{c.closest!r}", c.number))
    return defects, suspects, stale


def _got_past(checks: Sequence[StepCheck]) -> list[Evidence]:
    """What a passing run says of the suspected steps: the text is stale there."""
    out = []
    for c in checks:
        if c.label in DEFECT_LABELS and c.suspect:
            says = f"says {c.mention!r}" if c.mention else "names a control"
            near = f"; the console's closest is {c.closest!r}" if c.closest else ""
            out.append(Evidence(EvidenceKind.STATIC, f"step {c.number} {says}, which the static "
                                f"check suspected ({c.label}); the run got past it{near}",
                                c.number))
    return out


def _refusals(rollout: Rollout, operations: Collection[str]) -> list[Evidence]:
    return [Evidence(EvidenceKind.AUDIT, f"sample {rollout.sample}: the console refused "
                              f"{e.event_name} with {e.error_code}", e.event_name)
            for e in rollout.deciding_events
            if e.error_code and (not operations or e.event_name in operations)]


def procedure_verdict(checks: Sequence[StepCheck], rollouts: Sequence[Rollout], *,
                      samples: int, operations: Collection[str] = (), known_defect: str = "",
                      min_completed: float = 0.5, executor: str = "agent") -> Verdict:
    """The verdict of one procedure (see the module docstring for the rule).

    ``checks``: its static check (empty when none ran); ``rollouts``: its samples as the jobs
    API keeps them (only ``state == "completed"`` ones count); ``samples``: how many were asked
    for (0: static only); ``operations``: the audit event names of the task's operation (its
    required events: a refusal of another event proves nothing about this procedure; empty:
    any refused event counts); ``known_defect``: the catalogue's reason a procedure does not
    work as written (``expected: infeasible`` tasks), "" for others; ``executor``: who ran the
    samples (:data:`EXECUTORS`), named in the evidence. ``Verdict.samples`` is the number of
    completed samples and ``passes`` how many of them passed."""
    if samples < 0 or not 0.0 <= min_completed <= 1.0:
        raise ValueError("procedure_verdict: samples must be >= 0 and min_completed in [0, 1]")
    if executor not in EXECUTORS:
        raise ValueError(f"procedure_verdict: executor must be one of {', '.join(EXECUTORS)}")
    defects, suspects, stale = static_evidence(checks)
    who = "the replay" if executor == "replay" else "the agent"
    done = [r for r in rollouts if r.state == "completed"]
    passed = [r for r in done if r.verdict == "success"]
    counts = {"passes": len(passed), "samples": len(done)}
    if defects:
        extra = []
        if passed:
            extra.append(Evidence(EvidenceKind.AUDIT, f"the agent reached the goal in {len(passed)} of "
                                           f"{len(done)} samples by another way than the "
                                           "steps say"))
        return Verdict(VerdictKind.BROKEN, tuple(defects + extra), **counts)
    if samples == 0:
        if suspects:
            summary = (f"static check: {len(suspects)} suspected defect(s), which a run may "
                       "get past; not run")
        elif stale:
            summary = f"static check: {len(stale)} stale label(s); not run"
        else:
            summary = NOT_RUN
        return Verdict(VerdictKind.INCONCLUSIVE,
                       (Evidence(EvidenceKind.STATIC, summary), *suspects, *stale))
    if passed:
        names = sorted({e.event_name for e in passed[0].deciding_events if not e.error_code})
        proof = Evidence(EvidenceKind.AUDIT, f"{who} passed {len(passed)} of {len(done)} completed "
                                  "samples; the audit log has the operation"
                                  + (f" ({', '.join(names)})" if names else ""),
                         names[0] if names else passed[0].id)
        past = _got_past(checks)
        return Verdict(VerdictKind.WORKS_TEXT_STALE if stale or past else VerdictKind.WORKS,
                       (proof, *past, *stale), **counts)
    claimed = [r for r in done if r.verdict == "infeasible"]
    # What the static check found renamed is not missing: a claim that only names such
    # controls is the agent not recognising the new label.
    renamed = {norm(c.mention): c.closest for c in checks
               if c.label == StepLabel.LABEL_DIFFERS and c.mention}
    for r in claimed:
        if r.claim is not None and r.claim.confirmed and r.claim.missing and all(
                any(m in old or old in m for old in renamed) for m in r.claim.missing):
            continue
        if r.claim is not None and r.claim.confirmed:
            reason = r.infeasible_reason or "no reason given"
            known = f" (the catalogue's known defect: {known_defect})" if known_defect else ""
            return Verdict(VerdictKind.BROKEN, (*_refusals(r, operations), Evidence(
                EvidenceKind.INFEASIBILITY, f"sample {r.sample}: {who} reported it cannot be done as "
                                 f"written: {reason}; confirmed: "
                                 f"{'; '.join(r.claim.reasons) or r.claim.kind}{known}",
                r.id)), **counts)
    unconfirmed = [Evidence(EvidenceKind.AGENT, f"sample {r.sample}: {who} reported it cannot be done "
                                     f"({r.infeasible_reason or 'no reason given'}), not "
                                     f"confirmed: {_why_not(r, renamed)}", r.id)
                   for r in claimed]
    stopped = [Evidence(EvidenceKind.AGENT, f"sample {r.sample}: {who} stopped: {r.end_detail}",
                        r.id) for r in done if r.end_detail]
    seen = [e for r in done for e in _refusals(r, operations)] + unconfirmed + stopped[:1]
    if len(done) < max(1, min_completed * samples):
        lost = sum(r.state == "failed" for r in rollouts)
        why = (f"only {len(done)} of {samples} samples completed"
               + (f" ({lost} lost to the environment)" if lost else "") + "; too few to judge")
        return Verdict(VerdictKind.INCONCLUSIVE,
                       (Evidence(EvidenceKind.AGENT, why), *seen, *suspects, *stale), **counts)
    undecided = sum(r.verdict == "undetermined" for r in done)
    why = (NO_EVIDENCE if executor == "agent" else NO_EVIDENCE.replace("the agent", who)) + (
        f" (the judges could not decide {undecided} of {len(done)})" if undecided else "")
    return Verdict(VerdictKind.INCONCLUSIVE,
                   (Evidence(EvidenceKind.AGENT, why), *seen, *suspects, *stale), **counts)


def _why_not(r: Rollout, renamed: dict[str, str]) -> str:
    if r.claim is None:
        return "unchecked"
    if r.claim.confirmed:
        return ("what it says is missing the console has under another label ("
                + ", ".join(f"{m!r} is now {renamed[o]!r}" for m in r.claim.missing
                            for o in renamed if m in o or o in m) + ")")
    return r.claim.kind + (f" ({r.claim.reasons[0]})" if r.claim.reasons else "")


__all__ = ["EXECUTORS", "NOT_RUN", "NO_EVIDENCE", "Rollout", "procedure_verdict",
           "static_evidence"]
