"""The held-out documentation corpus (docs/corpus-heldout) and its ground truth (labels.yaml)
agree: every labelled procedure is a heading of an existing page, its labelled step numbers exist,
every page is labelled, and the corpus holds the mix its README states (18 procedures: 9 correct,
6 defective with each defect kind, 3 stale; at least 3 per product, at least 3 HTML pages)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt
from selectolax.lexbor import LexborHTMLParser as HTMLParser

CORPUS = Path(__file__).resolve().parents[2] / "docs" / "corpus-heldout"
PRODUCTS = ("ecs", "vpc", "ram", "oss")
STATUSES = ("correct", "defective", "stale")
DEFECTS = ("renamed_control", "missing_step", "out_of_order", "no_such_field", "no_such_option",
           "refused")
KEYS = ("page", "title", "status", "drift", "defect", "defective_steps", "stale_steps",
        "operation", "note")


def _labels() -> list[dict]:
    return yaml.safe_load((CORPUS / "labels.yaml").read_text(encoding="utf-8"))


LABELS = _labels()


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


def _steps(entry: dict) -> list[list[str]] | None:
    text = (CORPUS / entry["page"]).read_text(encoding="utf-8")
    if entry["page"].endswith(".md"):
        return _md_steps(text, entry["title"])
    return _html_steps(text, entry["title"])


def test_every_entry_is_well_formed():
    seen = set()
    for e in LABELS:
        where = f"{e.get('page')}: {e.get('title')}"
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
        assert e["operation"] == "" or re.fullmatch(r"(Ecs|Vpc|Ram|Oss):[A-Z][A-Za-z]+",
                                                   e["operation"]), where
        assert e["note"].strip(), where


@pytest.mark.parametrize("entry", LABELS, ids=lambda e: f"{e['page']}#{e['title']}")
def test_procedure_is_a_heading_of_its_page_and_its_steps_exist(entry):
    path = CORPUS / entry["page"]
    assert path.is_file(), f"no page {entry['page']}"
    assert entry["page"].split("/")[0] in PRODUCTS
    assert path.suffix in (".md", ".html")
    steps = _steps(entry)
    assert steps is not None, f"{entry['title']!r} is not a heading of {entry['page']}"
    assert steps, f"no numbered steps under {entry['title']!r}"
    assert "log on to the" in _first_step_text(entry).lower(), entry["title"]
    for number in entry["defective_steps"] + entry["stale_steps"]:
        top, _, sub = str(number).partition(".")
        assert 1 <= int(top) <= len(steps), f"step {number} of {entry['title']!r}"
        if sub:
            assert sub in steps[int(top) - 1], f"step {number} of {entry['title']!r}"


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
