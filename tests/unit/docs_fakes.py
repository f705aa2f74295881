"""Pages for the tests of the doors (the service, the route, the command line), and, for the
unit tests of the service only, stand-ins for the documentation reader and drafter: a reader
that takes each ``##`` section's numbered list (Markdown, through markdown-it-py) or each
``<h2>`` and its ``<ol>`` (HTML, through selectolax: scripts are never run) with the **bold**
phrases as controls, and a drafter that turns "Create a RAM user" into the catalogue's task.
A small inventory shaped like the local console's RAM pages goes with them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from doccheck.model import (Control, DocStep, Form, FormField, Inventory, Mention,
                            PageEntry, Procedure)

ROOT = Path(__file__).resolve().parents[2]
USERS = "/console/ram/users"

PAGE_MD = """# Create a RAM user
You can create a RAM user for a program.
## Procedure
1. Log on to the **RAM console**.
2. In the left-side navigation pane, choose **Users**.
3. On the **Users** page, click **Create User**.
4. Click **Frobnicate User**.
"""
STALE_MD = """# Create a RAM user
## Procedure
1. Log on to the **RAM console**.
2. In the left-side navigation pane, choose **Users**.
3. On the **Users** page, click **Create a User**.
4. Enter `deploy-bot` in the **Logon Name** field.
5. Click **Create**.
"""
SCRIPT_HTML = """<html><head><script>fetch('http://127.0.0.1:9/pwned')</script>
<link rel=stylesheet href="http://127.0.0.1:9/x.css"></head><body>
<h1>Create a RAM user</h1><h2>Procedure</h2><ol>
<li>Log on to the <b>RAM console</b>.<script>document.title='pwned'</script></li>
<li>In the left-side navigation pane, choose <b>Users</b>.</li><li>Click <b>Create User</b>.<img src="http://127.0.0.1:9/i.png"
 onerror="alert(1)"></li></ol></body></html>"""
OTHER_PRODUCT_MD = """# Create a RAM user
## Procedure
1. Log on to the **RAM console**.
2. In the left-side navigation pane, choose **Users**.
3. On the **Users** page, click **Create VPC**.
"""
NO_PROCEDURE_MD = "# Release notes\n\nNothing to do here: this page has no steps.\n"


def inventory() -> Inventory:
    form = Form("Create User", (FormField("UserName", "Logon Name", required=True,
                                          max_length=64),
                                FormField("DisplayName", "Display Name")),
                submit="Create", action="Ram:CreateUser", post=USERS + "/create")
    pages = (
        PageEntry(USERS, "Users", "ram", ("RAM", "Users"),
                  (Control("button", "Create User", f"page:{USERS}/create", where="toolbar"),)),
        PageEntry(USERS + "/create", "Create User", "ram", (), (), (form,)),
        PageEntry("/console/vpc/vpcs", "VPCs", "vpc", ("VPC", "VPCs"),
                  (Control("button", "Create VPC", "page:/console/vpc/vpcs/create",
                           where="toolbar"),)),
    )
    return Inventory("local", "", "2026-11-26T00:00:00Z", "v1", pages,
                     (("ram", "RAM console"), ("vpc", "VPC console")))


def _mentions(number: int, bolds: list[str], text: str) -> tuple[Mention, ...]:
    out = []
    for b in bolds:
        if f"{b}** page" in text or f"{b} page" in text:
            out.append(Mention("page", b))
        elif b.endswith("console"):
            out.append(Mention("product", b))
        elif number == 2:
            out.append(Mention("menu", b))
        else:
            out.append(Mention("control", b))
    return tuple(out)


def fake_extract(text: str, content_type: str, source: str = "page") -> list[Procedure]:
    """Each section with a numbered list is a procedure titled by the page's first heading."""
    if content_type == "text/html":
        from selectolax.lexbor import LexborHTMLParser as HTMLParser
        tree = HTMLParser(text)
        title = (tree.css_first("h1") or tree.css_first("h2"))
        steps = []
        for n, li in enumerate(tree.css("ol > li"), 1):
            for s in li.css("script"):
                s.decompose()
            steps.append(DocStep(str(n), " ".join(li.text().split()),
                                 _mentions(n, [b.text() for b in li.css("b")], li.text())))
        return [Procedure(title.text() if title else source, source, tuple(steps))] \
            if steps else []
    from markdown_it import MarkdownIt
    tokens = MarkdownIt().parse(text)
    title, steps, n, in_item = source, [], 0, False
    for i, t in enumerate(tokens):
        if t.type == "heading_open" and t.tag == "h1":
            title = tokens[i + 1].content
        elif t.type == "list_item_open":
            n, in_item = n + 1, True
        elif t.type == "inline" and in_item:
            bolds = [c.content for j, c in enumerate(t.children or [])
                     if c.type == "text" and j and t.children[j - 1].type == "strong_open"]
            steps.append(DocStep(str(n), t.content, _mentions(n, bolds, t.content)))
            in_item = False
    return [Procedure(title, source, tuple(steps))] if steps else []


@dataclass(frozen=True)
class Draft:
    task: dict | None
    reason: str = ""
    source: str = "rules"


def fake_draft(proc, checks, inventory, *, task_id: str, drift: str = "") -> Draft:
    """"Create a RAM user" -> the catalogue's ram-create-user-0 under ``task_id``."""
    if "ram user" not in proc.title.lower():
        return Draft(None, "no form submit found in the procedure")
    data = yaml.safe_load((ROOT / "tasks" / "ram" / "ram-create-user-0.yaml").read_text())
    return Draft(dict(data, id=task_id, drift=drift, split="heldout"))


def docs_service():
    """A DocsService over :func:`inventory` with the real checker and these stand-ins."""
    from doccheck.check import check_procedure
    from doccheck.service import DocsService
    return DocsService({"": inventory()}, extractor=fake_extract, checker=check_procedure,
                       drafter=fake_draft)
