"""The UI inventory on disk and its diff: load/save round trip, version stability, refusal of
malformed files, the diff's renamed/added/removed/changed, the look-ups, the CLI's exit codes;
and the crawler's path and text normaliser (no browser)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from doccheck import inventory as inv_mod
from doccheck.crawl_forms import text_value
from doccheck.crawl_page import Normaliser, product_of
from doccheck.inventory import (Change, InventoryError, default_inventories, diff,
                                diff_main, load, page_by_menu, pages_for_product,
                                save, version_of)
from doccheck.model import (Control, Form, FormField, Inventory, PageEntry,
                            to_json)
from jobsapi.cli import main as cli_main

USERS = PageEntry(
    "/console/ram/users", "Users", "ram", ("RAM", "Users"),
    controls=(Control("navitem", "Users", "page:/console/ram/users", where="nav"),
              Control("link", "Create User", "page:/console/ram/users/create", where="toolbar"),
              Control("button", "Delete", "dialog:Delete", "Ram:DeleteUser", "row", True),
              Control("button", "OK", "post:/console/ram/users/{}/delete", "Ram:DeleteUser",
                      "dialog:Delete")),
    columns=("Logon Name", "User ID"), example="/console/ram/users")
CREATE = PageEntry(
    "/console/ram/users/create", "Create User", "ram",
    forms=(Form("Create User", (FormField("UserName", "Logon Name", required=True),
                                FormField("Acl", "ACL", "radio", options=("Private", "Public"))),
                "Create", "Ram:CreateUser", "/console/ram/users/create", cancel="Cancel"),),
    example="/console/ram/users/create")


def make(pages=(USERS, CREATE), drift="", at="2026-01-01T00:00:00Z") -> Inventory:
    return Inventory("local", drift, at, version_of(pages), tuple(pages),
                     products=(("ram", "RAM"),))


def test_save_then_load_round_trips(tmp_path):
    inv = make()
    path = save(inv, tmp_path / "sub" / "inv.json")
    assert load(path) == inv
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_version_ignores_time_example_and_order():
    a = make()
    b = make(pages=(replace(CREATE, example="/x"), USERS), at="2030-01-01T00:00:00Z")
    assert a.version == b.version
    assert a.version.startswith("sha256:")
    assert version_of([replace(USERS, title="People"), CREATE]) != a.version


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not JSON"),
    ("[]", "expected a JSON object"),
    (json.dumps({"schema": 99, "console": "x", "drift": "", "crawled_at": "", "version": "",
                 "pages": []}), "schema"),
    (json.dumps({"console": "x", "drift": ""}), "missing field(s) crawled_at, version, pages"),
    (json.dumps({"console": "x", "drift": "", "crawled_at": "", "version": "", "pages": [],
                 "surprise": 1}), "unknown field(s) surprise"),
    (json.dumps({"console": "x", "drift": "", "crawled_at": "", "version": "",
                 "pages": [{"pattern": "/a", "title": "A", "bogus": 2}]}), "bogus"),
])
def test_malformed_files_are_refused_with_the_reason(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InventoryError, match="bad.json") as err:
        load(path)
    assert needle in str(err.value)
    assert isinstance(err.value, ValueError)


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(InventoryError, match="cannot read"):
        load(tmp_path / "none.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InventoryError, match="not UTF-8"):
        load(tmp_path / "bin.json")


def test_identical_crawls_have_no_diff():
    assert diff(make(), make(at="2031-01-01T00:00:00Z")) == []


def test_renames_are_reported_as_renamed():
    renamed_users = replace(USERS, title="Identities", menu_path=("RAM", "Identities"),
                            controls=(
        Control("navitem", "Identities", "page:/console/ram/users", where="nav"),
        Control("link", "Add User", "page:/console/ram/users/create", where="toolbar"),
        Control("button", "Release", "dialog:Release", "Ram:DeleteUser", "row", True),
        Control("button", "Confirm", "post:/console/ram/users/{}/delete", "Ram:DeleteUser",
                "dialog:Release")))
    form = CREATE.forms[0]
    renamed_create = replace(CREATE, title="Add User", forms=(replace(
        form, title="Add User", submit="Confirm and Create",
        fields=(replace(form.fields[0], label="Username"), form.fields[1])),))
    changes = diff(make(), make(pages=(renamed_users, renamed_create), drift="rename"))
    got = {(c.kind, c.page, c.what, c.old, c.new) for c in changes}
    users, create = USERS.pattern, CREATE.pattern
    assert {("renamed", users, "title", "Users", "Identities"),
            ("renamed", users, "menu", "RAM > Users", "RAM > Identities"),
            ("renamed", users, "nav", "Users", "Identities"),
            ("renamed", users, "control", "Create User", "Add User"),
            ("renamed", users, "control", "Delete", "Release"),
            ("renamed", users, "control", "OK", "Confirm"),
            ("renamed", create, "title", "Create User", "Add User"),
            ("renamed", create, "submit", "Create", "Confirm and Create"),
            ("renamed", create, "field", "Logon Name", "Username")} <= got
    assert all(c.kind == "renamed" for c in changes), changes


def test_added_removed_and_changed():
    extra = PageEntry("/console/ram/groups", "Groups", "ram", ("RAM", "Groups"))
    form = CREATE.forms[0]
    changed = replace(CREATE, forms=(replace(form, action="Ram:CreateUserV2", fields=(
        replace(form.fields[0], required=False), replace(form.fields[1], options=("Private",)),
        FormField("Tags", "Tags"))),),)
    users = replace(USERS, controls=USERS.controls[:1] + USERS.controls[2:] + (
        Control("link", "Export", "page:/console/ram/users/export", where="toolbar"),))
    changes = diff(make(), make(pages=(users, changed, extra)))
    got = {(c.kind, c.page, c.what) for c in changes}
    assert ("added", "/console/ram/groups", "page") in got
    assert ("removed", USERS.pattern, "control") in got     # Create User
    assert ("added", USERS.pattern, "control") in got       # Export
    assert ("changed", CREATE.pattern, "field") in got      # required
    assert ("removed", CREATE.pattern, "option") in got     # Public
    assert ("added", CREATE.pattern, "field") in got        # Tags
    assert ("changed", CREATE.pattern, "form") in got       # the action
    assert ("removed", "/console/ram/groups", "page") in {
        (c.kind, c.page, c.what) for c in diff(make(pages=(USERS, CREATE, extra)), make())}


def test_lookups():
    inv = make()
    assert page_by_menu(inv, ("RAM", "Users")) is not None
    assert page_by_menu(inv, ("users",)).pattern == "/console/ram/users"
    assert page_by_menu(inv, ("Nope",)) is None
    assert [p.pattern for p in pages_for_product(inv, "RAM")] == [USERS.pattern, CREATE.pattern]
    assert inv_mod.controls_named(USERS, "create  user")[0].target.endswith("/create")
    assert inv_mod.form_by_action(inv, "Ram:CreateUser")[0][0] is CREATE


def test_cli_diff_exit_codes_and_json(tmp_path, capsys):
    a = save(make(), tmp_path / "a.json")
    b = save(make(pages=(replace(USERS, title="People"), CREATE)), tmp_path / "b.json")
    assert cli_main(["inventory", "diff", str(a), str(a)]) == 0        # no token needed
    assert cli_main(["inventory", "diff", str(a), str(b)]) == 1
    assert "renamed  /console/ram/users: title 'Users' -> 'People'" in capsys.readouterr().out
    assert diff_main(["diff", str(a), str(b), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["changes"] == [{"kind": "renamed", "page": "/console/ram/users", "what": "title",
                                "old": "Users", "new": "People"}]
    (tmp_path / "bad.json").write_text("{")
    assert diff_main(["diff", str(a), str(tmp_path / "bad.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert diff_main(["diff", str(a)]) == 2


def test_change_reads_as_a_line():
    assert str(Change("added", "/p", "control", "", "Export")) == "added    /p: control 'Export'"


def test_committed_inventories_load_and_match_their_version():
    files = default_inventories()
    assert set(files) == {"", "rename", "more_menu", "wizard", "nav"}
    for drift, path in files.items():
        inv = load(path)
        assert inv.drift == drift and inv.version == version_of(inv.pages)
    # the rename profile changes labels only: every difference is a rename
    changes = diff(load(files[""]), load(files["rename"]))
    assert changes and all(c.kind == "renamed" for c in changes), \
        [str(c) for c in changes if c.kind != "renamed"]
    assert Change("renamed", "/console/ram/users", "control", "Create User", "Add User") in changes


# ---- the crawler's normaliser and value generation (no browser) ---------------------------------
def test_normaliser_paths_and_texts():
    norm = Normaliser("127.0.0.1:9", known={"crawlab12r0-user", "alice"}, seen={"ReadOnlyAccess"})
    assert norm.path("http://127.0.0.1:9/console/ram/users/crawlab12r0-user/grant") == \
        "/console/ram/users/{}/grant"
    assert norm.path("http://h/console/ram/users/crawlab12r0-user/policies/ReadOnlyAccess/"
                     "detach") == "/console/ram/users/{}/policies/{}/detach"
    assert norm.path("http://h/console/ecs/instances/i-bp1234567890abcdefgh") == \
        "/console/ecs/instances/{}"
    assert norm.path("http://h/console/vpc/vswitches/create?vpc=vpc-bp0123456789abcdefgh") == \
        "/console/vpc/vswitches/create"
    assert norm.path("http://h/console/x/create?direction=egress") == \
        "/console/x/create?direction=egress"
    assert norm.text("Rename i-bp1234567890abcdefgh") == "Rename {}"
    assert norm.text("Welcome, alice") == "Welcome, {}"
    assert norm.text("ecs.t6-c1m1.large") == "ecs.t6-c1m1.large"
    assert norm.on_console("http://127.0.0.1:9/console/ram/users")
    assert not norm.on_console("http://127.0.0.1:9/console/signout")
    assert not norm.on_console("http://127.0.0.1:9/metrics")
    assert not norm.on_console("http://evil.example/console/")
    assert product_of("/console/ram/users/{}") == "ram" and product_of("/console/") == ""


def test_generated_values_follow_the_form():
    base = {"value": "", "placeholder": "", "kind": "text", "required": True, "min": "",
            "maxlength": 0, "label": "Logon Name"}
    assert text_value(base, "crawlx-f1") == "crawlx-f1"
    assert text_value({**base, "maxlength": 4}, "crawlx-f1") == "craw"
    assert text_value({**base, "value": "kept"}, "s") is None
    assert text_value({**base, "placeholder": "192.168.1.0/24"}, "s") == "192.168.1.0/24"
    assert text_value({**base, "required": False, "label": "Comments"}, "s") is None
    assert text_value({**base, "required": False, "label": "VPC Name"}, "s") == "s"


def test_what_a_request_sent_is_kept_only_where_the_console_chose_it():
    from doccheck.crawl import normalise_sends
    sent = {"UserName": "crawlab12r0-user", "PolicyName": "ReadOnlyAccess",
            "PolicyType": "System", "RegionId": "cn-hangzhou", "Amount": "1",
            "PortRange": "22/22", "Priority": "1"}
    got = normalise_sends(sent, fields=("PolicyName",),
                          specific=lambda v: v == "crawlab12r0-user",
                          context=("http://h/console/x/i-ab1c2d3e4f5g", "TCP 22/22 0.0.0.0/0",
                                   "cn-hangzhou"))
    # names sorted; the user (the crawl's), the field's choice, the region and the row's
    # port are "{}"; an "1" inside an ID is no evidence, so Amount and Priority stay.
    assert got == (("Amount", "1"), ("PolicyName", "{}"), ("PolicyType", "System"),
                   ("PortRange", "{}"), ("Priority", "1"), ("RegionId", "{}"),
                   ("UserName", "{}"))
    assert normalise_sends({}) == ()


def test_actions_learnt_with_their_sends_reach_the_entry():
    from doccheck.crawl_page import with_actions
    sends = (("PolicyType", "System"), ("UserName", "{}"))
    entry = with_actions(CREATE, {}, {"/console/ram/users/create": ("Ram:CreateUser", sends)})
    assert entry.forms[0].action == "Ram:CreateUser" and entry.forms[0].sends == sends
    key = ("OK", "dialog:Delete", "post:/console/ram/users/{}/delete")
    entry = with_actions(USERS, {key: ("Ram:DeleteUser", (("UserName", "{}"),))}, {})
    ok = next(c for c in entry.controls if c.label == "OK")
    assert ok.sends == (("UserName", "{}"),)
    # a bare action (no sends) still works, and leaves what was there
    assert with_actions(USERS, {key: "Ram:DeleteUser"}, {}).controls == USERS.controls
    back = inv_mod.parse(json.loads(json.dumps(to_json(make((entry, CREATE))))), "x")
    assert back.page("/console/ram/users").controls[-1].sends == (("UserName", "{}"),)


def test_a_controls_target_and_place_are_typed_and_stay_the_files_strings():
    from doccheck.model import Target, TargetKind, Where, WhereKind, from_json, to_json
    c = Control("button", "OK", "post:/console/ram/users/{}", where="dialog:Delete user")
    assert (c.target.kind, c.target.name) == (TargetKind.POST, "/console/ram/users/{}")
    assert (c.where.kind, c.where.name) == (WhereKind.DIALOG, "Delete user")
    assert c.target == "post:/console/ram/users/{}" and isinstance(c.where, Where)
    opener = Control("button", "Delete", "dialog:Delete user", where="row")
    assert opener.opens(c.where) and not c.opens(opener.where)
    assert to_json(c)["target"] == "post:/console/ram/users/{}" and from_json(Control, to_json(c)) == c
    assert not Control("link", "Docs").target and Target.of("page", "/x") == "page:/x"
    with pytest.raises(ValueError, match="Target: 'page' is not one of"):
        Control("link", "x", "page")
    with pytest.raises(ValueError, match="Where: 'sidebar' is not one of"):
        Control("link", "x", where="sidebar")
