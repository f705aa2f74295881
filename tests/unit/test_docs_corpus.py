"""The documentation corpus (docs/corpus) and its ground truth (labels.yaml) agree: every labelled
procedure is a heading of an existing page, its labelled step numbers exist, and the corpus
holds the mix the benchmark needs (products, statuses, defect kinds, HTML pages)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt
from selectolax.lexbor import LexborHTMLParser as HTMLParser

CORPUS = Path(__file__).resolve().parents[2] / "docs" / "corpus"
PRODUCTS = ("ecs", "vpc", "ram", "oss")
STATUSES = ("correct", "defective", "stale")
DEFECTS = ("renamed_control", "missing_step", "out_of_order", "no_such_field", "no_such_option",
           "refused")
KEYS = ("page", "title", "status", "drift", "defect", "defective_steps", "stale_steps",
        "operation", "note")


def load_labels(corpus: Path) -> list[dict]:
    return yaml.safe_load((corpus / "labels.yaml").read_text(encoding="utf-8"))


LABELS = load_labels(CORPUS)


def _md_steps(text: str, title: str) -> list[list[str]] | None:
    """Top-level steps of the procedure under heading ``title`` (each a list of its sub-step
    numbers), or None when no heading has that text."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    start = level = None
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tokens[i + 1].content.strip() == title:
            start, level = i, int(tok.tag[1])
            break
    if start is None:
        return None
    steps: list[list[str]] = []
    depth = None
    nested: list[str] = []      # the kinds of the lists open inside the current step
    for tok in tokens[start + 3:]:
        if tok.type == "heading_open" and int(tok.tag[1]) <= level:
            break
        if tok.type == "ordered_list_open" and depth is None:
            depth = tok.level
        elif depth is None:
            continue
        elif tok.type == "ordered_list_close" and tok.level == depth:
            break
        elif tok.type == "list_item_open" and tok.level == depth + 1:
            steps.append([])
        elif tok.type in ("ordered_list_open", "bullet_list_open") and tok.level == depth + 2:
            nested.append(tok.type)
        elif tok.type in ("ordered_list_close", "bullet_list_close") and tok.level == depth + 2:
            nested.pop()
        elif tok.type == "list_item_open" and tok.level == depth + 3 and \
                nested[-1] == "ordered_list_open":
            steps[-1].append(str(len(steps[-1]) + 1))
    return steps


def _html_steps(text: str, title: str) -> list[list[str]] | None:
    tree = HTMLParser(text)
    nodes = tree.css("h1, h2, h3, ol")
    for i, node in enumerate(nodes):
        if node.tag in ("h1", "h2", "h3") and node.text(strip=True) == title:
            break
    else:
        return None
    for node in nodes[i + 1:]:
        if node.tag in ("h1", "h2") and int(node.tag[1]) <= int(nodes[i].tag[1]):
            return []
        if node.tag == "ol":
            steps = []
            for li in (c for c in node.iter() if c.tag == "li"):
                subs: list[str] = []
                for ol in (c for c in li.iter() if c.tag == "ol"):
                    lettered = ol.attributes.get("type") == "a"
                    count = sum(c.tag == "li" for c in ol.iter())
                    subs += [chr(ord("a") + k) if lettered else str(k + 1) for k in range(count)]
                steps.append(subs)
            return steps
    return []


def _steps(corpus: Path, entry: dict) -> list[list[str]] | None:
    text = (corpus / entry["page"]).read_text(encoding="utf-8")
    if entry["page"].endswith(".md"):
        return _md_steps(text, entry["title"])
    return _html_steps(text, entry["title"])


def check_entries(labels: list[dict], keys: tuple[str, ...] = KEYS) -> None:
    """Every label entry has the schema's ``keys``, in order, and values that fit together
    (the held-out and blind corpora's tests run the same checks)."""
    seen = set()
    for e in labels:
        where = f"{e.get('page')}: {e.get('title')}"
        assert tuple(e) == keys, where
        assert e["status"] in STATUSES, where
        assert (e["page"], e["title"]) not in seen, f"labelled twice: {where}"
        seen.add((e["page"], e["title"]))
        assert e["drift"] == ("rename" if e["status"] == "stale" else ""), where
        if e["status"] == "defective":
            assert e["defect"] in DEFECTS and e["defective_steps"], where
        else:
            assert e["defect"] == "" and e["defective_steps"] == [], where
        assert bool(e["stale_steps"]) == (e["status"] == "stale"), where
        assert e["operation"] == "" or re.fullmatch(r"(Ecs|Vpc|Ram|Oss):[A-Z][A-Za-z]+",
                                                   e["operation"]), where
        assert e["note"].strip(), where


def test_every_entry_is_well_formed():
    check_entries(LABELS)


def check_procedure_entry(corpus: Path, entry: dict) -> None:
    """The entry's page exists, its title is a heading there with numbered steps under it, and
    every step number it labels exists."""
    path = corpus / entry["page"]
    assert path.is_file(), f"no page {entry['page']}"
    assert entry["page"].split("/")[0] in PRODUCTS
    assert path.suffix in (".md", ".html")
    steps = _steps(corpus, entry)
    assert steps is not None, f"{entry['title']!r} is not a heading of {entry['page']}"
    assert steps, f"no numbered steps under {entry['title']!r}"
    for number in entry["defective_steps"] + entry["stale_steps"]:
        top, _, sub = str(number).partition(".")
        assert 1 <= int(top) <= len(steps), f"step {number} of {entry['title']!r}"
        if sub:
            assert sub in steps[int(top) - 1], f"step {number} of {entry['title']!r}"


@pytest.mark.parametrize("entry", LABELS, ids=lambda e: f"{e['page']}#{e['title']}")
def test_procedure_is_a_heading_of_its_page_and_its_steps_exist(entry):
    check_procedure_entry(CORPUS, entry)


def test_corpus_mix():
    status = Counter(e["status"] for e in LABELS)
    assert len(LABELS) >= 40
    assert status["correct"] >= 27
    assert status["defective"] >= 12
    assert status["stale"] >= 5
    assert {e["page"].split("/")[0] for e in LABELS} == set(PRODUCTS)
    defects = Counter(e["defect"] for e in LABELS if e["status"] == "defective")
    assert all(defects[d] >= 2 for d in DEFECTS), defects
    pages = {e["page"] for e in LABELS}
    assert sum(p.endswith(".html") for p in pages) >= 8
    assert all(1 <= sum(e["page"] == p for e in LABELS) <= 3 for p in pages)


def check_pages_labelled(corpus: Path, labels: list[dict]) -> None:
    """Every page of ``corpus`` is labelled and every labelled page exists."""
    pages = {e["page"] for e in labels}
    on_disk = {p.relative_to(corpus).as_posix() for p in corpus.rglob("*")
               if p.suffix in (".md", ".html") and p.parent != corpus}
    assert on_disk == pages


def check_readme_counts(corpus: Path, labels: list[dict]) -> str:
    """The corpus README's counts (procedures, pages by format, per status, per defect, per
    product and status) are the labels'; returns the README for further checks."""
    readme = (corpus / "README.md").read_text(encoding="utf-8")
    status = Counter(e["status"] for e in labels)
    pages = {e["page"] for e in labels}
    html = sum(p.endswith(".html") for p in pages)
    assert f"{len(labels)} procedures" in readme
    assert f"on {len(pages)} pages ({len(pages) - html} Markdown, {html} HTML)" in readme
    for name in STATUSES:
        assert f"| {name} | {status[name]} |" in readme, name
    defects = Counter(e["defect"] for e in labels if e["defect"])
    for name in DEFECTS:
        assert f"| {name} | {defects[name]} |" in readme, name
    for product in PRODUCTS:
        mine = [e for e in labels if e["page"].startswith(product + "/")]
        row = " | ".join(str(sum(e["status"] == s for e in mine)) for s in STATUSES)
        assert f"| {product} | {row} | {len(mine)} |" in readme, product
    return readme


def test_every_page_is_labelled():
    check_pages_labelled(CORPUS, LABELS)


def test_readme_counts_are_current():
    check_readme_counts(CORPUS, LABELS)
