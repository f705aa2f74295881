"""The documentation service's door: what a page may be (size, text, content type, drift), per
procedure the static check (the real checker) and a drafted task that parses or the reason
there is none, and the static-only verdict. The reader and the drafter are stand-ins
(tests/unit/docs_fakes.py) until the real ones land."""
from __future__ import annotations

import pytest

from consolerl.tasks import parse_task
from doccheck.check import check_procedure
from doccheck.service import (MAX_PAGE_BYTES, DocsInputError, DocsService,
                              DocsUnavailable, PageIn, page_text, task_id_for)
from tests.unit.docs_fakes import (NO_PROCEDURE_MD, OTHER_PRODUCT_MD, PAGE_MD, SCRIPT_HTML,
                                   STALE_MD, Draft, fake_draft, fake_extract, inventory)


def service(**kw) -> DocsService:
    return DocsService({"": inventory()}, **{"extractor": fake_extract,
                                             "checker": check_procedure,
                                             "drafter": fake_draft, **kw})


def test_a_page_becomes_checked_steps_a_task_and_a_static_verdict():
    (r,) = service().analyse([PageIn("ram.md", PAGE_MD)])
    assert r.title == "Create a RAM user" and r.source == "ram.md"
    assert [c.label for c in r.checks] == ["ok", "ok", "ok", "missing"]
    assert r.verdict.verdict == "broken" and r.verdict.evidence[0].ref == "4"
    assert r.task is not None and parse_task(r.task, "t").id == r.task_id == r.task["id"]
    assert r.task_id.startswith("doc-create-a-ram-user-")


def test_stale_text_is_labelled_and_static_only_is_inconclusive():
    # the stand-in reader takes every bold phrase past step 2 for a control: the first three
    # steps of the stale page
    short = STALE_MD.split("4. ")[0]
    (r,) = service().analyse([PageIn("ram.md", short.encode(), "markdown")])
    assert [c.label for c in r.checks][2] == "label_differs" and r.checks[2].closest == \
        "Create User"
    assert r.verdict.verdict == "inconclusive" and "not run" in r.verdict.evidence[0].detail


def test_a_step_naming_another_products_control_goes_through_the_static_check():
    (r,) = service().analyse([PageIn("ram.md", OTHER_PRODUCT_MD)])
    assert r.checks[-1].label == "unreachable" and "VPCs" in r.checks[-1].detail
    assert r.verdict.verdict == "broken"


def test_html_with_scripts_is_read_never_run():
    (r,) = service().analyse([PageIn("ram.html", SCRIPT_HTML, "text/html")])
    assert [s.text for s in r.procedure.steps] == [
        "Log on to the RAM console.", "In the left-side navigation pane, choose Users.",
        "Click Create User."]
    assert all(c.label == "ok" for c in r.checks)


def test_a_page_with_no_procedure_says_so():
    (page,) = service().read([PageIn("notes.md", NO_PROCEDURE_MD)])
    assert page.procedures == () and "no procedure found" in page.message


@pytest.mark.parametrize("page,where,status,words", [
    (PageIn("big.md", "x" * (MAX_PAGE_BYTES + 1)), "pages[1].content", 413, "at most"),
    (PageIn("bin.md", b"\x89PNG\r\n\x1a\n\x00\x00"), "pages[1].content", 422, "UTF-8"),
    (PageIn("nul.md", "1. Click **OK**\x00\x01"), "pages[1].content", 422, "binary"),
    (PageIn("half.md", "1. Click \udc80"), "pages[1].content", 422, "Unicode"),
    (PageIn("doc.pdf", "1. x", "application/pdf"), "pages[1].content_type", 422,
     "text/markdown, markdown"),
])
def test_bad_pages_are_refused_naming_the_page(page, where, status, words):
    with pytest.raises(DocsInputError) as err:
        service().read([PageIn("ok.md", PAGE_MD), page])
    assert err.value.where == where and err.value.status == status
    assert page.name in str(err.value) and words in str(err.value)


def test_drift_and_missing_parts_are_clear():
    with pytest.raises(DocsInputError, match="one of ''") as err:
        service().read([PageIn("a.md", PAGE_MD)], drift="rename")
    assert err.value.field == "drift"
    with pytest.raises(DocsUnavailable, match="inventory"):
        DocsService({}).read([PageIn("a.md", PAGE_MD)])
    with pytest.raises(DocsInputError, match="1 to 20 pages"):
        service().read([])


def test_no_drafter_or_a_bad_draft_leaves_no_task_and_says_why():
    def no_draft(*a, **kw):
        return Draft(None, "no form submit found")

    def broken_draft(proc, checks, inv, *, task_id, drift=""):
        return Draft({"schema": 1, "id": task_id})
    (r,) = service(drafter=no_draft).analyse([PageIn("a.md", PAGE_MD)])
    assert r.task is None and r.reason == "no form submit found"
    (r,) = service(drafter=broken_draft).analyse([PageIn("a.md", PAGE_MD)])
    assert r.task is None and "drafting error" in r.reason


def test_extractor_errors_name_the_page():
    def refuses(text, content_type, source="page"):
        raise ValueError("the page is larger than it says")
    with pytest.raises(DocsInputError, match="'a.md'") as err:
        service(extractor=refuses).read([PageIn("a.md", PAGE_MD)])
    assert err.value.where == "pages[0].content"


def test_task_ids_are_valid_and_distinct():
    ids = {task_id_for(f"{i}:p.md", n, "Create a RAM user!" * 5) for i in range(3)
           for n in range(3)}
    assert len(ids) == 9 and all(3 <= len(i) <= 64 for i in ids)
    assert page_text(PageIn("a.md", "\ufeff# T"), 0) == ("# T", "text/markdown")
