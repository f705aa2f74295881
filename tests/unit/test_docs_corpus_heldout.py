"""The held-out documentation corpus (docs/corpus-heldout) and its ground truth (labels.yaml)
agree: every labelled procedure is a heading of an existing page, its labelled step numbers exist,
every page is labelled, and the corpus holds the mix its README states (18 procedures: 9 correct,
6 defective with each defect kind, 3 stale; at least 3 per product, at least 3 HTML pages)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from selectolax.lexbor import LexborHTMLParser as HTMLParser

from tests.unit.test_docs_corpus import (DEFECTS, PRODUCTS, check_entries,
                                         check_pages_labelled, check_procedure_entry,
                                         check_readme_counts, load_labels)

CORPUS = Path(__file__).resolve().parents[2] / "docs" / "corpus-heldout"

LABELS = load_labels(CORPUS)


def test_every_entry_is_well_formed():
    check_entries(LABELS)


@pytest.mark.parametrize("entry", LABELS, ids=lambda e: f"{e['page']}#{e['title']}")
def test_procedure_is_a_heading_of_its_page_and_its_steps_exist(entry):
    check_procedure_entry(CORPUS, entry)
    assert "log on to the" in _first_step_text(entry).lower(), entry["title"]


def _first_step_text(entry: dict) -> str:
    text = (CORPUS / entry["page"]).read_text(encoding="utf-8")
    if entry["page"].endswith(".md"):
        after = text.split(entry["title"], 1)[1]
        return re.search(r"^1\. (.*)$", after, re.MULTILINE).group(1)
    after = text.split(f">{entry['title']}<", 1)[1]
    return HTMLParser(after).css_first("li").text()


def test_corpus_mix():
    status = Counter(e["status"] for e in LABELS)
    assert len(LABELS) == 18
    assert (status["correct"], status["defective"], status["stale"]) == (9, 6, 3)
    products = Counter(e["page"].split("/")[0] for e in LABELS)
    assert set(products) == set(PRODUCTS) and min(products.values()) >= 3, products
    defects = Counter(e["defect"] for e in LABELS if e["status"] == "defective")
    assert all(defects[d] >= 1 for d in DEFECTS), defects
    pages = {e["page"] for e in LABELS}
    assert 10 <= len(pages) <= 14
    assert sum(p.endswith(".html") for p in pages) >= 3
    assert all(1 <= sum(e["page"] == p for e in LABELS) <= 3 for p in pages)


def test_every_page_is_labelled():
    check_pages_labelled(CORPUS, LABELS)


def test_readme_counts_are_current():
    check_readme_counts(CORPUS, LABELS)
