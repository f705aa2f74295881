"""Step text an attacker writes: the reader and static check answer every generated step, never
raise on it and stay fast, whatever characters it holds (the reader's own placeholder
characters ``⟨b0⟩`` included)."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doccheck import DocsService, PageIn

# Pieces of real step text and of what breaks readers: the reader's placeholder brackets and
# look-alikes, markup, punctuation runs, clause joiners, and UI names.
PIECES = st.sampled_from([
    "⟨", "⟩", "⟨b0⟩", "⟨c1⟩", "⟨m2⟩", "⟨l3⟩", "⟨b99⟩", "〈", "**", "`", "*", "_", "[", "]", "(",
    ")", "((", "))", '"', "“", "”", ">", " > ", ", ", ", and then ", "; ", ". ", ":", "\\",
    "Click ", "Enter ", "Choose ", "Select ", "**Create User**", "**OK**", "`user-1`",
    "the **Logon Name** field", "Identities > Users", " ", "\t", "é", "用户", "<b>", "</b>",
])
STEP = st.lists(PIECES, max_size=80).map("".join)


@pytest.fixture(scope="module")
def service() -> DocsService:
    return DocsService.default()


def _page(step: str) -> str:
    return (f"# Users\n\n## Create a user\n\n1. Log on to the RAM console.\n2. {step}\n"
            f"3. Click **OK**.\n")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(step=STEP)
def test_any_step_text_is_read_without_error(service, step):
    started = time.perf_counter()
    results = service.analyse([PageIn("p.md", _page(step))])
    assert time.perf_counter() - started < 1.0, step
    assert [r.title for r in results] == ["Create a user"]


@pytest.mark.parametrize("text", ["and ⟨b9⟩ then ⟨c1⟩", "⟨b0⟩⟨b0⟩ **⟨b0⟩**", "`⟨c0⟩` ⟨l0⟩"])
def test_the_readers_placeholder_characters_in_a_page_are_plain_text(service, text):
    results = service.analyse([PageIn("p.md", _page(f"Click **Create User** {text}."))])
    assert [r.title for r in results] == ["Create a user"]


@pytest.mark.parametrize("step", ["(" * 10_000 + ")" * 10_000, "Click **OK**" + ", and then" * 2_000,
                                  "Click " + "(a " * 5_000 + ")" * 5_000])
def test_long_punctuation_runs_in_one_step_stay_fast(service, step):
    started = time.perf_counter()
    service.analyse([PageIn("p.md", _page(step))])
    assert time.perf_counter() - started < 1.0


# Runs of markup at the size a page may have (2 MiB), in one step: only the first
# MAX_INLINE_CHARS of a paragraph are read as markup, an HTML block's pieces are capped, and the
# HTML depth guard reads the page in one pass: every one answers (or is refused with the
# reader's error) in about a second, where code spans, links and bold runs took a minute.
UNITS = ["((", ", and then", "[**x**](", "**", "`a` ", '"', " > ", "[a](b) ", "<b>x</b>",
         "_a_ ", "<", "&amp;", "\\*"]


@pytest.mark.parametrize("kind", ["text/markdown", "text/html"])
@pytest.mark.parametrize("unit", UNITS)
def test_two_mib_of_markup_in_one_step_answers_within_seconds(service, kind, unit):
    from doccheck import DocsInputError
    junk = (unit * (1_990_000 // len(unit) + 1))[:1_990_000]
    page = (_page(f"Click **Create User** {junk}") if kind == "text/markdown" else
            f"<h2>Create a user</h2><ol><li>Log on to the RAM console.</li><li>Click "
            f"<b>Create User</b> {junk}</li><li>Click <b>OK</b>.</li></ol>")
    started = time.perf_counter()
    try:
        results = service.analyse([PageIn("p", page, kind)])
        assert [r.title for r in results] == ["Create a user"]
    except DocsInputError as exc:           # a clear refusal is an answer
        assert "elements" in str(exc)
    # (a loaded 2-core machine: the figure idle is under a second)
    assert time.perf_counter() - started < 5.0
