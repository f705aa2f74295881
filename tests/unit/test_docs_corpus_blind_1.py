"""The first blind documentation corpus (docs/corpus-blind-1) and its ground truth (labels.yaml)
agree: every entry has the schema's keys in order with consistent values, every labelled
procedure is a heading of an existing page whose first step logs on to the console, every step
number it names (defective, stale, reworded, optional) exists, every page is labelled, and the
README's counts are current."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from selectolax.lexbor import LexborHTMLParser as HTMLParser

from tests.unit.test_docs_corpus import (DEFECTS, PRODUCTS, STATUSES, check_procedure_entry,
                                         load_labels)

CORPUS = Path(__file__).resolve().parents[2] / "docs" / "corpus-blind-1"
KEYS = ("page", "title", "status", "drift", "defect", "defective_steps", "stale_steps",
        "operation", "note", "reworded_steps", "optional_steps")
STEP_RE = re.compile(r"[1-9][0-9]*(\.([1-9][0-9]*|[a-z]))?")

LABELS = load_labels(CORPUS)


def _id(entry: dict) -> str:
    return f"{entry['page']}#{entry['title']}"


def test_every_entry_is_well_formed():
    seen = set()
    for e in LABELS:
        where = _id(e)
        assert tuple(e) == KEYS, where
        assert e["status"] in STATUSES, where
        assert (e["page"], e["title"]) not in seen, f"labelled twice: {where}"
        seen.add((e["page"], e["title"]))
        assert e["drift"] == ("rename" if e["status"] == "stale" else ""), where
        if e["status"] == "defective":
            assert e["defect"] in DEFECTS and e["defective_steps"], where
        else:
            assert e["defect"] == "" and e["defective_steps"] == [], where
        assert bool(e["stale_steps"]) == (e["status"] == "stale"), where
        # Reworded and optional-without-control steps belong to procedures that work.
        if e["reworded_steps"] or e["optional_steps"]:
            assert e["status"] == "correct", where
        for key in ("defective_steps", "stale_steps", "reworded_steps", "optional_steps"):
            assert isinstance(e[key], list), where
            for number in e[key]:
                assert isinstance(number, str) and STEP_RE.fullmatch(number), (where, key, number)
            assert len(set(e[key])) == len(e[key]), (where, key)
        assert e["operation"] == "" or re.fullmatch(r"(Ecs|Vpc|Ram|Oss):[A-Z][A-Za-z]+",
                                                   e["operation"]), where
        assert isinstance(e["note"], str) and e["note"].strip(), where


def _top_step_text(entry: dict, number: int) -> str:
    """The text of top-level step ``number`` of the procedure."""
    text = (CORPUS / entry["page"]).read_text(encoding="utf-8")
    if entry["page"].endswith(".md"):
        after = re.split(rf"^#+ {re.escape(entry['title'])}$", text, maxsplit=1,
                         flags=re.MULTILINE)[1]
        return re.search(rf"^{number}\. (.*)$", after, re.MULTILINE).group(1)
    after = re.split(rf"<h[123][^>]*>{re.escape(entry['title'])}</h[123]>", text, maxsplit=1)[1]
    ol = HTMLParser(after).css_first("ol")
    return [c for c in ol.iter() if c.tag == "li"][number - 1].text()


@pytest.mark.parametrize("entry", LABELS, ids=_id)
def test_procedure_is_a_heading_of_its_page_and_its_steps_exist(entry):
    check_procedure_entry(CORPUS, entry)
    # The extra step lists are checked the same way, by putting them where the check looks.
    for key in ("reworded_steps", "optional_steps"):
        if entry[key]:
            check_procedure_entry(CORPUS, {**entry, "defective_steps": list(entry[key]),
                                           "stale_steps": []})
    assert re.match(r"log on to the .*console", _top_step_text(entry, 1).strip().lower()), \
        entry["title"]


def test_optional_steps_say_so():
    """A step labelled optional is written as optional or conditional ("(Optional) ...",
    "If ...")."""
    for e in LABELS:
        for number in e["optional_steps"]:
            if "." in number:       # a sub-step: its text is not looked up here
                continue
            text = _top_step_text(e, int(number.split(".")[0])).strip()
            assert text.startswith("(Optional)") or text.startswith("If "), (_id(e), number)


def test_corpus_mix():
    status = Counter(e["status"] for e in LABELS)
    assert len(LABELS) >= 40
    products = Counter(e["page"].split("/")[0] for e in LABELS)
    assert set(products) == set(PRODUCTS) and min(products.values()) >= 8, products
    defects = Counter(e["defect"] for e in LABELS if e["status"] == "defective")
    assert all(defects[d] >= 2 for d in DEFECTS), defects
    assert status["stale"] >= 4 and status["defective"] >= 12
    reworded = [e for e in LABELS if e["reworded_steps"]]
    assert len(reworded) >= 6
    assert sum(bool(e["optional_steps"]) for e in LABELS) >= 5
    pages = {e["page"] for e in LABELS}
    assert 25 <= len(pages) <= 35
    assert sum(p.endswith(".html") for p in pages) >= 6
    assert all(1 <= sum(e["page"] == p for e in LABELS) <= 3 for p in pages)


def test_every_page_is_labelled():
    pages = {e["page"] for e in LABELS}
    on_disk = {p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
               if p.suffix in (".md", ".html") and p.parent != CORPUS}
    assert on_disk == pages


def test_readme_counts_are_current():
    readme = (CORPUS / "README.md").read_text(encoding="utf-8")
    status = Counter(e["status"] for e in LABELS)
    pages = {e["page"] for e in LABELS}
    html = sum(p.endswith(".html") for p in pages)
    assert f"{len(LABELS)} procedures" in readme
    assert f"on {len(pages)} pages ({len(pages) - html} Markdown, {html} HTML)" in readme
    for name in STATUSES:
        assert f"| {name} | {status[name]} |" in readme, name
    defects = Counter(e["defect"] for e in LABELS if e["defect"])
    for name in DEFECTS:
        assert f"| {name} | {defects[name]} |" in readme, name
    for product in PRODUCTS:
        mine = [e for e in LABELS if e["page"].startswith(product + "/")]
        row = " | ".join(str(sum(e["status"] == s for e in mine)) for s in STATUSES)
        assert f"| {product} | {row} | {len(mine)} |" in readme, product
    reworded = sum(bool(e["reworded_steps"]) for e in LABELS)
    optional = sum(bool(e["optional_steps"]) for e in LABELS)
    assert f"| correct, reworded | {reworded} |" in readme
    assert f"| correct, optional step without a control | {optional} |" in readme
