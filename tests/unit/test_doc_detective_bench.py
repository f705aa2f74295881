"""benchmarks.doc_detective without Doc Detective: which sections of a page are procedures, the
test copy a doc team would hand to Doc Detective, the labels file, the tuned markup's finds."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from benchmarks.doc_detective import (MARKUP, at_step, load_labels, marked_up_copy, sections,
                                      step_numbers)

MD = """# Create a RAM user

Intro with **bold**.

## Prerequisites

- An account.

## Create a user

1. Log on to the [RAM console](https://ram.console.aliyun.com/).
2. On the **Users** page, click **Create User**.

## Delete a user

1. Log on to the [RAM console](https://ram.console.aliyun.com/).
2. Find the user and click **Delete** in the **Actions** column.
"""
HTML = """<html><body><article><h1>Stop an instance</h1><p>Intro</p>
<h2>Before you start</h2><ul><li>An instance.</li></ul>
<h2>Stop an instance</h2><ol><li>Log on to the <a href="https://ecs.console.aliyun.com/">ECS
console</a>.</li><li>Click <span class="uicontrol">Stop</span>.</li></ol></article></body></html>"""


def test_sections_are_the_numbered_procedures_of_a_page():
    assert [t for t, _ in sections(MD, "markdown")] == ["Create a user", "Delete a user"]
    assert [t for t, _ in sections(HTML, "html")] == ["Stop an instance"]


def test_the_copy_is_one_test_per_procedure_signed_in_to_its_console():
    copy = marked_up_copy(MD, "markdown", sections(MD, "markdown"), "http://127.0.0.1:9",
                     ["", "rename"], "alice")
    assert copy.count("<!-- test end -->") == 2
    assert '"http://127.0.0.1:9/console/signin"' in copy
    assert '"http://127.0.0.1:9/console/signin?drift=rename"' in copy
    assert "(http://127.0.0.1:9/console/ram/users)" in copy and "aliyun.com" not in copy
    assert "Prerequisites" not in copy and "$DD_CONSOLE_PASSWORD" in copy
    starts = [json.loads(m) for m in re.findall(r"<!-- test (\{.*?\}) -->", copy)]
    assert [s["testId"] for s in starts] == ["p0", "p1"]


def test_labels_are_keyed_by_page_and_title(tmp_path):
    path = tmp_path / "labels.yaml"
    path.write_text("- {page: ram/a.md, title: Create a user, status: stale, drift: rename}\n")
    assert load_labels(path)[("ram/a.md", "Create a user")]["status"] == "stale"
    assert load_labels(tmp_path / "none.yaml") == {}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_tuned_markup_finds_only_bold_that_no_click_names():
    md = MARKUP["tuned"]["markdown"][1]["regex"][0]
    text = ("On the **Users** page, click **Create User**. Select **HTTP (80)** from the "
            "**Protocol** list. > **Note** x | **Logon Name** |")
    js = (f"const r=new RegExp({json.dumps(md)},'g');"
          f"console.log(JSON.stringify([...{json.dumps(text)}.matchAll(r)].map(m=>m[1])))")
    out = subprocess.run(["node", "-e", js], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["Users", "Protocol", "Logon Name"]


def test_a_failed_line_is_placed_at_its_step_markdown_and_html():
    md = ("## P\n\n1. Log on.\n2. Configure:\n   1. Set **A**.\n   b. Set **B**.\n"
          "3. Click **OK**.\n\nDone.\n")
    assert step_numbers(md, "markdown") == {3: "1", 4: "2", 5: "2.1", 6: "2.b", 7: "3", 8: "3"}
    html = ("<h2>P</h2>\n<ol>\n<li>Log on.</li>\n<li>Configure:\n<ul>\n<li><b>A</b></li>\n</ul>"
            "</li>\n<li>Delete:<ol type=\"a\">\n<li>x</li>\n</ol></li>\n</ol>\n<p>Done</p>\n")
    at = step_numbers(html, "html")
    assert (at[3], at[4], at[6], at[8], at[9]) == ("1", "2", "2", "3", "3.a")
    assert 12 not in at
    assert at_step("4.b", ("4",)) and at_step("4", ("4.2",)) and not at_step("5", ("4",))
