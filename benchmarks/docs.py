"""The documentation checker on the labelled corpus: ``python -m benchmarks.docs --json``.

Reads every page of ``docs/corpus`` (labels in ``docs/corpus/labels.yaml``), extracts its
procedures, checks each step against the committed UI inventory of the console profile the
label names (``local.json``; the ``rename`` profile with the default one as its history), drafts
a task from each procedure and validates the drafts against a local cloud (parse, provision and
destroy the prerequisites, an SDK twin of the operation must satisfy the rule). Prints one JSON
object:

- ``procedures``: labelled procedures found in the pages; ``extracted``: the fraction with every
  step read into actions;
- ``static_precision`` / ``static_recall``: over steps, a defect label (missing, unreachable,
  ambiguous, not_applicable) against the steps the labels call defective;
- ``stale_detected``: stale procedures whose stale steps are all ``label_differs`` and that have
  no defect label;
- ``check_ms_per_page_p50``: extraction plus the static check of a page, no agent;
- ``drafted_valid``: non-defective procedures whose drafted task is valid;
  ``rule_satisfiable``: drafted tasks whose rule the SDK twin satisfied;
- ``crawl_s``: one crawl of the local console (default profile) through an env worker;
- ``misses``: what the figures count against, per procedure.

Blind batches (``docs/corpus-blind-N``, written by people who never saw the checker, its
results or the other batch; their labels add ``reworded_steps``, steps worded otherwise than
the console that still work there, and ``optional_steps``, optional or conditional steps whose
control the console lacks) are reported apart, one object each (``blind_1``, ``blind_2``, ...),
with the keys above (no ``crawl_s``) plus, from each procedure's static-only verdict
(:func:`doccheck.verdict.procedure_verdict` with no samples):

- ``broken_precision`` / ``broken_recall``: procedures the verdict calls ``broken`` against the
  procedures labelled ``defective``;
- ``stale_vs_broken_accuracy``: over the procedures that are defective, stale, or correct but
  reworded, the share whose verdict is ``broken`` exactly when they are defective (worded
  differently is not broken).

A ``not_applicable`` label on a labelled optional step counts neither as a flag nor as a false
alarm. ``--blind 1`` measures only the first batch (a batch is measured once before any fix made
from it: choose which), ``--blind none`` none; by default every batch present.

``--no-cloud`` skips what needs a running cloud (the drafts' validation and the crawl).
Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from consolerl.stats import percentile
from doccheck.check import check_procedure
from doccheck.extract import extract
from doccheck.service import DocsService
from doccheck.model import DEFECT_LABELS, Inventory, Procedure, StepCheck, StepLabel
from doccheck.verdict import procedure_verdict

CORPUS = Path(__file__).resolve().parent.parent / "docs" / "corpus"
BLIND = "corpus-blind-"          # docs/corpus-blind-1, docs/corpus-blind-2, ...


def _progress(msg: str) -> None:
    print(f"[docs] {msg}", file=sys.stderr, flush=True)


@dataclass
class Item:
    """One labelled procedure and what the checker made of it."""

    label: dict[str, Any]
    proc: Procedure | None = None
    checks: tuple[StepCheck, ...] = ()
    draft: Any = None
    validation: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.label['page']}#{self.label['title']}"


def content_type(path: Path) -> str:
    return "text/html" if path.suffix.lower() in (".html", ".htm") else "text/markdown"


def inventories() -> tuple[dict[str, Inventory], dict[str, list[Inventory]]]:
    """The committed inventories by drift profile, and each one's history (older crawls):
    the default console is the history of every drifted one."""
    service = DocsService.default()
    invs = dict(service.inventories)
    return invs, {drift: list(service.previous.get(drift, ())) for drift in invs}


def read_corpus(corpus: Path) -> tuple[list[Item], list[float], int]:
    """Extract and statically check every page; returns the labelled items, the per-page time
    (ms, extraction + check) and how many extracted procedures no label names."""
    labels = yaml.safe_load((corpus / "labels.yaml").read_text())
    labels = labels["procedures"] if isinstance(labels, dict) else labels
    invs, history = inventories()
    by_page: dict[str, list[dict[str, Any]]] = {}
    for entry in labels:
        by_page.setdefault(entry["page"], []).append(entry)
    items: list[Item] = []
    times: list[float] = []
    unlabelled = 0
    for page, entries in sorted(by_page.items()):
        path = corpus / page
        started = time.perf_counter()
        procs = extract(path.read_bytes(), content_type(path), source=page)
        # each procedure against the console its label names (a page may mix a stale
        # procedure, checked against the drifted console, with ones for the default console)
        drifts = {e["title"]: e.get("drift", "") or "" for e in entries}
        checked = {}
        for p in procs:
            drift = drifts.get(p.title, "")
            checked[p.title] = (p, check_procedure(p, invs[drift], history[drift]))
        times.append((time.perf_counter() - started) * 1000)
        unlabelled += len(set(checked) - {e["title"] for e in entries})
        for entry in entries:
            item = Item(entry)
            found = checked.get(entry["title"])
            if found is None:
                item.notes.append("procedure not found by the extractor")
            else:
                item.proc, item.checks = found
            items.append(item)
    return items, times, unlabelled


def _optional_na(item: Item, check: StepCheck) -> bool:
    """A labelled optional step the check calls ``not_applicable``: right, and no flag."""
    return check.label == StepLabel.NOT_APPLICABLE and \
        check.number in {str(s) for s in item.label.get("optional_steps") or ()}


def static_figures(items: list[Item]) -> dict[str, Any]:
    flagged: set[tuple[str, str]] = set()
    defective: set[tuple[str, str]] = set()
    stale_ok, stale_total = 0, 0
    for item in items:
        lab = item.label
        defective |= {(item.key, str(s)) for s in lab.get("defective_steps") or ()}
        flagged |= {(item.key, c.number) for c in item.checks
                    if c.label in DEFECT_LABELS and not _optional_na(item, c)}
        if lab["status"] == "stale":
            stale_total += 1
            by_number = {c.number: c.label for c in item.checks}
            stale = [str(s) for s in lab.get("stale_steps") or ()]
            if item.checks and all(by_number.get(s) == "label_differs" for s in stale) \
                    and not any(c.label in DEFECT_LABELS for c in item.checks):
                stale_ok += 1
            else:
                item.notes.append("stale steps not all label_differs: " + ", ".join(
                    f"{c.number}={c.label}" for c in item.checks if c.label != "ok"))
    for item in items:
        for c in item.checks:
            pair = (item.key, c.number)
            if pair in flagged and pair not in defective:
                item.notes.append(f"false alarm: step {c.number} {c.label}: {c.detail}")
        for s in item.label.get("defective_steps") or ():
            if (item.key, str(s)) not in flagged:
                got = next((c for c in item.checks if c.number == str(s)), None)
                item.notes.append(f"defect missed: step {s} is "
                                  f"{got.label + ': ' + got.detail if got else 'absent'}")
    hit = len(flagged & defective)
    return {
        "static_precision": round(hit / len(flagged), 4) if flagged else None,
        "static_recall": round(hit / len(defective), 4) if defective else None,
        "stale_detected": round(stale_ok / stale_total, 4) if stale_total else None,
        "defective_steps": len(defective), "flagged_steps": len(flagged),
    }


def verdict_figures(items: list[Item]) -> dict[str, Any]:
    """Per procedure, the static-only verdict against its label (blind batches)."""
    broken, defective, contrast, right = set(), set(), 0, 0
    for item in items:
        if item.proc is None:
            continue
        checks = [c for c in item.checks if not _optional_na(item, c)]
        verdict = procedure_verdict(checks, [], samples=0).verdict
        status = item.label["status"]
        if verdict == "broken":
            broken.add(item.key)
        if status == "defective":
            defective.add(item.key)
        if status in ("defective", "stale") or item.label.get("reworded_steps"):
            contrast += 1
            right += (verdict == "broken") == (status == "defective")
        if verdict == "broken" and status != "defective":
            item.notes.append(f"called broken, labelled {status}")
    hit = len(broken & defective)
    return {"broken_precision": round(hit / len(broken), 4) if broken else None,
            "broken_recall": round(hit / len(defective), 4) if defective else None,
            "stale_vs_broken_accuracy": round(right / contrast, 4) if contrast else None,
            "called_broken": len(broken)}


def blind_batches(which: str) -> list[Path]:
    """The blind corpora to measure: every ``docs/corpus-blind-N`` (``all``), the numbered
    ones (``1,2``) or none (``none``)."""
    docs = CORPUS.parent
    present = sorted((p for p in docs.glob(BLIND + "*") if (p / "labels.yaml").is_file()),
                     key=lambda p: int(p.name.removeprefix(BLIND)))
    if which == "all":
        return present
    if which == "none":
        return []
    wanted = [docs / f"{BLIND}{n.strip()}" for n in which.split(",") if n.strip()]
    for path in wanted:
        if path not in present:
            raise SystemExit(f"--blind: no blind batch {path.name} (have: "
                             f"{', '.join(p.name for p in present) or 'none'})")
    return wanted


def corpus_figures(items: list[Item], times: list[float], unlabelled: int) -> dict[str, Any]:
    found = [i for i in items if i.proc is not None]
    return {
        "procedures": len(found),
        "labelled": len(items),
        "unlabelled_extracted": unlabelled,
        "extracted": round(sum(i.proc.extracted for i in found) / len(found), 4)
        if found else None,
        **static_figures(items),
        "check_ms_per_page_p50": round(percentile(times, 0.5), 2),
        "check_ms_per_page_max": round(max(times), 2) if times else None,
        "pages": len(times),
    }


def draft_all(items: list[Item], prefix: str = "doc") -> None:
    """Each procedure drafted into a task, with its replay plan (as the service does)."""
    from doccheck.draft import draft_task
    from doccheck.replay import attach_replay
    invs, history = inventories()
    for i, item in enumerate(items):
        if item.proc is None:
            continue
        drift = item.label.get("drift", "") or ""
        item.draft = draft_task(item.proc, item.checks, invs[drift],
                                task_id=f"{prefix}-{i:03d}", drift=drift)
        if item.draft.task is None:
            item.notes.append(f"no draft: {item.draft.reason}")
        else:
            why = attach_replay(item.draft.task, item.proc, invs[drift], history[drift])
            if why:
                item.notes.append(why)


def replay_figures(items: list[Item], runs: dict[str, Any]) -> dict[str, Any]:
    """Each procedure's verdict with its replay run (none: the static-only verdict), against
    its label: ``works_share``: correct and stale procedures whose verdict is ``works`` or
    ``works_text_stale``; ``broken_precision``: procedures called ``broken`` that are
    defective; ``works_on_defective``: defective procedures called works (the replay did
    something the labels say cannot be done as written); ``verdicts``: per label status, the
    count of each verdict."""
    from collections import Counter
    verdicts: dict[str, Counter] = {}
    broken = hit = sound = works = ran = passed = wrong_works = 0
    for item in items:
        if item.proc is None:
            continue
        task = item.draft.task if item.draft is not None else None
        run = runs.get(task["id"]) if task is not None else None
        checks = [c for c in item.checks if not _optional_na(item, c)]
        v = procedure_verdict(checks, [run] if run else [], samples=1 if run else 0,
                              executor="replay")
        status = item.label["status"]
        verdicts.setdefault(status, Counter())[v.verdict] += 1
        ran += run is not None
        passed += run is not None and run.verdict == "success"
        if v.verdict == "broken":
            broken += 1
            hit += status == "defective"
            if status != "defective":
                item.notes.append(f"replay verdict broken, labelled {status}")
        if status == "defective" and v.verdict in ("works", "works_text_stale"):
            wrong_works += 1
            item.notes.append(f"replay verdict {v.verdict}, labelled defective: "
                              + "; ".join(e.detail for e in v.evidence)[:300])
        if status in ("correct", "stale"):
            sound += 1
            works += v.verdict in ("works", "works_text_stale")
            if v.verdict not in ("works", "works_text_stale"):
                why = (run.end_detail or "; ".join(run.reasons) or run.verdict) if run else \
                    "not replayed"
                item.notes.append(f"replay verdict {v.verdict}: {str(why)[:200]}")
    return {"replayed": ran, "replay_passed": passed, "sound": sound, "works": works,
            "works_share": round(works / sound, 4) if sound else None,
            "broken": broken, "broken_defective": hit,
            "broken_precision": round(hit / broken, 4) if broken else None,
            "works_on_defective": wrong_works,
            "verdicts": {k: dict(sorted(c.items())) for k, c in sorted(verdicts.items())}}


def validate_all(items: list[Item], cloud: Any) -> None:
    """Each drafted task validated against the local cloud, in its first account."""
    from env_workers.accounts import local_cloud_accounts
    from doccheck.validate import validate_draft
    account = local_cloud_accounts()[0]
    drafted = [i for i in items if i.draft is not None and i.draft.task is not None]
    for n, item in enumerate(drafted, 1):
        item.validation = validate_draft(item.draft.task, account=account,
                                         endpoint=cloud.endpoint, settle_s=10.0)
        if not item.validation.valid:
            item.notes.append("invalid draft: " + "; ".join(item.validation.problems)[:300])
        _progress(f"validated {n}/{len(drafted)} {item.key}: "
                  f"{'valid' if item.validation.valid else 'INVALID'}")


def draft_figures(items: list[Item]) -> dict[str, Any]:
    sound = [i for i in items if i.label["status"] != "defective"]
    drafted = [i for i in items if i.draft is not None and i.draft.task is not None]
    checked = [i for i in drafted if i.validation is not None]
    valid = [i for i in sound if i.validation is not None and i.validation.valid]
    satisfied = [i for i in checked if i.validation.twin_satisfied]
    return {
        "drafted": len(drafted),
        "drafted_valid": round(len(valid) / len(sound), 4) if sound and checked else None,
        "rule_satisfiable": round(len(satisfied) / len(checked), 4) if checked else None,
    }


def crawl_seconds(cloud: Any) -> float:
    """One crawl of the local console (default profile), in its second account."""
    import asyncio

    from env_workers.accounts import local_cloud_accounts
    from doccheck.crawl import CrawlConfig, crawl
    started = time.perf_counter()
    inv = asyncio.run(crawl(cloud.url, local_cloud_accounts()[1],
                            config=CrawlConfig(trail_qps=50.0)))
    _progress(f"crawled {len(inv.pages)} page patterns")
    return round(time.perf_counter() - started, 1)


def task_suite() -> dict[str, Any]:
    """The static check over the task suite's own procedures (``tasks/``, plain prose read by
    :mod:`doccheck.prose`): every step that is not ``ok``. A task on a drift
    profile without a committed inventory (wizard, nav, more_menu, extra_confirm, all) is
    checked against the default console's."""
    from collections import Counter

    from consolerl.tasks import TASKS_DIR, load_suite
    from doccheck.prose import procedure_from_text
    invs, history = inventories()
    flags, counts = [], Counter()
    tasks = load_suite(TASKS_DIR)
    for t in tasks:
        drift = t.drift if t.drift in invs else ""
        proc = procedure_from_text(t.title, t.procedure, t.id, t.product)
        for step, c in zip(proc.steps, check_procedure(proc, invs[drift], history[drift])):
            counts[c.label] += 1
            if c.label != "ok":
                flags.append({"task": t.id, "drift": t.drift, "checked_as": drift,
                              "expected": t.expected, "step": c.number, "label": c.label,
                              "text": step.text, "detail": c.detail})
    return {"tasks": len(tasks), "steps": sum(counts.values()), "labels": dict(counts),
            "flags": flags}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.docs",
                                     description="The documentation checker on the corpus.")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--no-cloud", action="store_true",
                        help="skip the drafts' validation and the crawl (no local cloud)")
    parser.add_argument("--tasks", action="store_true",
                        help="instead: the static check over the task suite's procedures")
    parser.add_argument("--blind", default="all",
                        help="blind batches to measure: all (default), none, or numbers (1,2)")
    parser.add_argument("--run", action="store_true",
                        help="also replay every drafted procedure in a browser (doccheck.replay"
                             ") and report the verdicts with those runs (key 'replay')")
    parser.add_argument("--workers", type=int, default=2, help="--run: env workers")
    args = parser.parse_args(argv)
    if args.tasks:
        print(json.dumps(task_suite(), indent=None if args.json else 1))
        return 0
    items, times, unlabelled = read_corpus(args.corpus)
    _progress(f"{len(items)} procedures checked, p50 {percentile(times, 0.5):.1f} ms a page")
    out: dict[str, Any] = corpus_figures(items, times, unlabelled)
    blind: dict[str, tuple[list[Item], dict[str, Any]]] = {}
    for path in blind_batches(args.blind):
        b_items, b_times, b_unlabelled = read_corpus(path)
        name = "blind_" + path.name.removeprefix(BLIND)
        _progress(f"{name}: {len(b_items)} procedures checked")
        blind[name] = (b_items, {**corpus_figures(b_items, b_times, b_unlabelled),
                                 **verdict_figures(b_items)})
        draft_all(b_items, name.replace("_", ""))
    draft_all(items)
    if not args.no_cloud:
        from benchmarks.services import cloud_and_redis
        with cloud_and_redis("docs-bench-", ("--transition", "0.3", "--network-ready", "0.1",
                                             "--lookup-qps", "0")) as (cloud, _redis):
            validate_all(items, cloud)
            out.update(draft_figures(items))
            for b_items, figures in blind.values():
                validate_all(b_items, cloud)
                figures.update(draft_figures(b_items))
            if args.run:
                from benchmarks.docs_replay import replay_tasks
                groups = [(out, items)] + [(f, b) for b, f in blind.values()]
                drafts = [i.draft.task for _, its in groups for i in its
                          if i.draft is not None and i.draft.task is not None]
                runs = replay_tasks(drafts, cloud, _redis.url, args.workers, _progress)
                for figures, its in groups:
                    figures["replay"] = replay_figures(its, runs)
                sound = sum(f["replay"]["sound"] for f, _ in groups)
                works = sum(f["replay"]["works"] for f, _ in groups)
                broken = sum(f["replay"]["broken"] for f, _ in groups)
                hit = sum(f["replay"]["broken_defective"] for f, _ in groups)
                out["replay_all"] = {
                    "corpora": 1 + len(blind), "sound": sound, "works": works,
                    "works_share": round(works / sound, 4) if sound else None,
                    "broken": broken,
                    "broken_precision": round(hit / broken, 4) if broken else None}
            out["crawl_s"] = crawl_seconds(cloud)
    else:
        out["drafted"] = sum(i.draft is not None and i.draft.task is not None for i in items)
        for b_items, figures in blind.values():
            figures["drafted"] = sum(i.draft is not None and i.draft.task is not None
                                     for i in b_items)
    out["misses"] = {i.key: i.notes for i in items if i.notes}
    for name, (b_items, figures) in blind.items():
        figures["misses"] = {i.key: i.notes for i in b_items if i.notes}
        out[name] = figures
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
