"""Every blind documentation corpus (docs/corpus-blind-N) and its ground truth (labels.yaml)
agree: every entry has the schema's keys in order with consistent values, every labelled
procedure is a heading of an existing page whose first step logs on to the console, every step
number it names (defective, stale, reworded, optional) exists, every page is labelled, and the
README's counts are current. (Label consistency only: no checker result is looked at.)"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from selectolax.lexbor import LexborHTMLParser as HTMLParser

from tests.unit.test_docs_corpus import (DEFECTS, PRODUCTS, check_entries,
                                         check_pages_labelled, check_procedure_entry,
                                         check_readme_counts, load_labels)

DOCS = Path(__file__).resolve().parents[2] / "docs"
BATCHES = sorted((p for p in DOCS.glob("corpus-blind-*") if (p / "labels.yaml").is_file()),
                 key=lambda p: int(p.name.rsplit("-", 1)[1]))
KEYS = ("page", "title", "status", "drift", "defect", "defective_steps", "stale_steps",
        "operation", "note", "reworded_steps", "optional_steps")
STEP_LISTS = ("defective_steps", "stale_steps", "reworded_steps", "optional_steps")
STEP_RE = re.compile(r"[1-9][0-9]*(\.([1-9][0-9]*|[a-z]))?")
# What each batch's README calls a correct procedure with an optional step the console lacks
# (their writers worded it each their own way).
OPTIONAL_ROW = ("correct, optional step without a control",
                "correct, with an optional step the console lacks")
ENTRIES = [(corpus, e) for corpus in BATCHES for e in load_labels(corpus)]


def _id(entry: dict) -> str:
    return f"{entry['page']}#{entry['title']}"


@pytest.fixture(params=BATCHES, ids=lambda p: p.name)
def batch(request) -> tuple[Path, list[dict]]:
    return request.param, load_labels(request.param)


def test_the_blind_batches_are_numbered_from_one():
    assert [p.name for p in BATCHES] == [f"corpus-blind-{n}" for n in
                                         range(1, len(BATCHES) + 1)]
    assert len(BATCHES) >= 4


def test_every_entry_is_well_formed(batch):
    _, labels = batch
    check_entries(labels, KEYS)
    for e in labels:
        where = _id(e)
        # Reworded and optional steps belong to procedures that work on the default console.
        if e["reworded_steps"] or e["optional_steps"]:
            assert e["status"] == "correct", where
        for key in STEP_LISTS:
            assert isinstance(e[key], list), where
            for number in e[key]:
                assert isinstance(number, str) and STEP_RE.fullmatch(number), (where, key, number)
            assert len(set(e[key])) == len(e[key]), (where, key)
        assert isinstance(e["note"], str), where


def _top_step_text(corpus: Path, entry: dict, number: int) -> str:
    """The text of top-level step ``number`` of the procedure."""
    text = (corpus / entry["page"]).read_text(encoding="utf-8")
    if entry["page"].endswith(".md"):
        after = re.split(rf"^#+ {re.escape(entry['title'])}$", text, maxsplit=1,
                         flags=re.MULTILINE)[1]
        return re.search(rf"^{number}\. (.*)$", after, re.MULTILINE).group(1)
    after = re.split(rf"<h[123][^>]*>{re.escape(entry['title'])}</h[123]>", text, maxsplit=1)[1]
    ol = HTMLParser(after).css_first("ol")
    return [c for c in ol.iter() if c.tag == "li"][number - 1].text()


@pytest.mark.parametrize("corpus,entry", ENTRIES,
                         ids=[f"{c.name}:{_id(e)}" for c, e in ENTRIES])
def test_procedure_is_a_heading_of_its_page_and_its_steps_exist(corpus, entry):
    check_procedure_entry(corpus, entry)
    # The extra step lists are checked the same way, by putting them where the check looks.
    extra = entry["reworded_steps"] + entry["optional_steps"]
    if extra:
        check_procedure_entry(corpus, {**entry, "defective_steps": extra, "stale_steps": []})
    assert re.match(r"log on to the .*console",
                    _top_step_text(corpus, entry, 1).strip().lower()), entry["title"]


def test_corpus_mix(batch):
    _, labels = batch
    status = Counter(e["status"] for e in labels)
    assert len(labels) >= 40
    products = Counter(e["page"].split("/")[0] for e in labels)
    assert set(products) == set(PRODUCTS) and min(products.values()) >= 8, products
    defects = Counter(e["defect"] for e in labels if e["status"] == "defective")
    assert all(defects[d] >= 2 for d in DEFECTS), defects
    assert status["stale"] >= 4 and status["defective"] >= 12
    assert sum(bool(e["reworded_steps"]) for e in labels) >= 6
    assert sum(bool(e["optional_steps"]) for e in labels) >= 4
    pages = {e["page"] for e in labels}
    assert 25 <= len(pages) <= 35
    assert sum(p.endswith(".html") for p in pages) >= 6
    assert all(1 <= sum(e["page"] == p for e in labels) <= 3 for p in pages)


def test_every_page_is_labelled(batch):
    check_pages_labelled(*batch)


def test_readme_counts_are_current(batch):
    corpus, labels = batch
    readme = check_readme_counts(corpus, labels)
    reworded = sum(bool(e["reworded_steps"]) for e in labels)
    optional = sum(bool(e["optional_steps"]) for e in labels)
    assert f"| correct, reworded | {reworded} |" in readme
    assert any(f"| {row} | {optional} |" in readme for row in OPTIONAL_ROW)


def test_optional_steps_say_so(batch):
    """A step labelled optional is written as optional or conditional ("(Optional) ...",
    "If ...")."""
    corpus, labels = batch
    for e in labels:
        for number in e["optional_steps"]:
            if "." in number:       # a sub-step: its text is not looked up here
                continue
            text = _top_step_text(corpus, e, int(number)).strip()
            assert text.startswith("(Optional)") or text.startswith("If "), (_id(e), number)
