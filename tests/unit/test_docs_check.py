"""The static check on a small hand-built inventory shaped like the local console's RAM and
VPC pages (the crawled inventory is exercised in tests/integration/test_docs_corpus_check.py)."""
from __future__ import annotations

import dataclasses

import pytest

from doccheck.check import (check_procedure, help_problem, known_renames, page_networks,
                            similarity)
from doccheck.model import (Control, DocStep, Form, FormField, Inventory, Mention,
                            PageEntry, Procedure)

USERS = "/console/ram/users"


def inventory(rename: bool = False) -> Inventory:
    t = (lambda a, b: b if rename else a)
    form = Form("Create User", (
        FormField("UserName", t("Logon Name", "Username"), required=True, max_length=64),
        FormField("DisplayName", "Display Name"),
    ), submit=t("Create", "Confirm and Create"), action="Ram:CreateUser", post=USERS + "/create",
        cancel="Cancel")
    grant = Form("Add Permissions", (FormField("PolicyName", "System Policy", "radio", True,
                                               ("AliyunECSFullAccess", "ReadOnlyAccess")),),
                 submit="OK", action="Ram:AttachPolicyToUser")
    vpc_form = Form("Create VPC", (FormField("VpcName", "Name"),
                                  FormField("CidrBlock", "IPv4 CIDR Block", "select", True,
                                            ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")),
                                  FormField("Bandwidth", "Bandwidth", "number", minimum=1,
                                            maximum=100)),
                    submit="OK", action="Vpc:CreateVpc", post="/console/vpc/vpcs/create")
    pages = (
        PageEntry(USERS, t("Users", "Identities"), "ram", ("RAM", t("Users", "Identities")),
                  (Control("button", t("Create User", "Add User"), f"page:{USERS}/create",
                           where="toolbar"),
                   Control("link", "{}", f"page:{USERS}/{{}}", where="row"),
                   Control("button", "Delete", f"dialog:Delete user", where="row",
                           danger=True),
                   Control("button", "OK", f"post:{USERS}/{{}}/delete", "Ram:DeleteUser",
                           where="dialog:Delete user"))),
        PageEntry(USERS + "/create", "Create User", "ram", (), (), (form,)),
        PageEntry(USERS + "/{}", "{}", "ram", (),
                  (Control("button", "Add Permissions", f"page:{USERS}/{{}}/grant",
                           where="page"),)),
        PageEntry(USERS + "/{}/grant", "Add Permissions", "ram", (), (), (grant,)),
        PageEntry("/console/vpc/vpcs", "VPCs", "vpc", ("VPC", "VPCs"),
                  (Control("button", "Create VPC", "page:/console/vpc/vpcs/create",
                           where="toolbar"),)),
        PageEntry("/console/vpc/vpcs/create", "Create VPC", "vpc", (), (), (vpc_form,)),
    )
    return Inventory("local", "rename" if rename else "", "2026-11-26T00:00:00Z", "v",
                     pages, (("ram", "Resource Access Management"), ("vpc",
                                                                     "Virtual Private Cloud")))


def step(n, *mentions, note=False):
    return DocStep(str(n), "", tuple(mentions), note=note)


def create_user(submit="OK", first_menu="Users", skip_open=False):
    steps = [step(1, Mention("product", "RAM console")),
             step(2, Mention("menu", first_menu)),
             step(3, Mention("page", "Users"), Mention("control", "Create User")),
             step(4, Mention("field", "Logon Name", "deploy-bot"),
                  Mention("field", "Display Name", "Deploy Bot")),
             step(5, Mention("control", submit))]
    if skip_open:
        del steps[2]
    return Procedure("Create a RAM user", "ram.md", tuple(steps))


def labels(checks):
    return [c.label for c in checks]


def test_a_correct_procedure_is_ok_and_a_wrong_submit_label_is_missing():
    assert labels(check_procedure(create_user("Create"), inventory())) == ["ok"] * 5
    checks = check_procedure(create_user("Add New Member"), inventory())
    assert labels(checks)[:4] == ["ok"] * 4
    # the console's form button reads Create: no control of that name where the step is
    assert checks[4].label == "missing" and checks[4].mention == "Add New Member"


@pytest.mark.parametrize("word", ["OK", "Confirm", "Submit", "Save"])
def test_a_generic_submit_word_names_the_forms_button_under_another_name(word):
    checks = check_procedure(create_user(word), inventory())
    assert labels(checks) == ["ok"] * 4 + ["label_differs"]
    assert checks[4].closest == "Create" and "'Create'" in checks[4].detail


def test_an_optional_step_the_console_lacks_is_not_applicable_and_the_reader_goes_on():
    steps = list(create_user("Create").steps)
    steps.insert(4, DocStep("4a", "(Optional) Click Add Tag to tag the user.",
                            (Mention("control", "Add Tag"),)))
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)),
                             inventory())
    assert labels(checks) == ["ok"] * 4 + ["not_applicable", "ok"]
    assert "optional" in checks[4].detail
    # The same step, not optional, is a defect.
    steps[4] = DocStep("4a", "Click Add Tag to tag the user.", (Mention("control", "Add Tag"),))
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)),
                             inventory())
    assert checks[4].label == "missing"


def test_a_missing_step_makes_the_field_unreachable():
    checks = check_procedure(create_user("Create", skip_open=True), inventory())
    assert checks[2].label == "unreachable"
    assert "Create User" in checks[2].detail


def test_renames_an_older_crawl_records_are_label_differs_not_missing():
    old, new = inventory(), inventory(rename=True)
    assert known_renames([old], new)["create user"] == "add user"
    checks = check_procedure(create_user("Create"), new, previous=[old])
    assert labels(checks) == ["ok", "label_differs", "label_differs", "label_differs",
                              "label_differs"]
    assert checks[2].closest in ("Identities", "Add User")
    # without the history the renamed button is simply not there
    assert check_procedure(create_user("Create"), new)[2].label == "missing"


def test_invented_names_options_and_values_outside_the_field():
    proc = Procedure("Create a VPC", "vpc.md", (
        step(1, Mention("product", "VPC console")),
        step(2, Mention("menu", "VPCs")),
        step(3, Mention("control", "Create VPC")),
        step(4, Mention("option", "10.0.0.0/8", field="IPv4 CIDR Block")),
        step(5, Mention("option", "100.64.0.0/10", field="IPv4 CIDR Block")),
        step(6, Mention("field", "Bandwidth", "500")),
        step(7, Mention("field", "Billing Method", "Pay-as-you-go")),
        step(8, Mention("control", "Provision Network")),
    ))
    assert labels(check_procedure(proc, inventory())) == [
        "ok", "ok", "ok", "ok", "missing", "missing", "missing", "missing"]


def test_a_field_named_with_the_forms_resource_or_as_a_new_name_is_that_field():
    steps = list(create_user("Create").steps)
    steps[3] = step(4, Mention("field", "User Logon Name", "deploy-bot"))
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)),
                             inventory())
    assert checks[3].label == "label_differs" and checks[3].closest == "Logon Name"
    # A word the form's title does not have is another field.
    steps[3] = step(4, Mention("field", "Admin Logon Name", "deploy-bot"))
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)),
                             inventory())
    assert checks[3].label == "missing"
    proc = Procedure("Create a VPC", "vpc.md", (
        step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
        step(3, Mention("control", "Create VPC")), step(4, Mention("field", "New name", "v1"))))
    assert labels(check_procedure(proc, inventory())) == ["ok"] * 4


def test_select_a_resource_where_a_form_is_open_is_that_fields_choice():
    """"From the CIDR list, select the block that ...": the open form's field, not a row."""
    def proc(*opened):
        return Procedure("Create a VPC", "vpc.md", (
            step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
            *opened,
            step(4, Mention("control", "", "row-select", "IPv4 CIDR Block"))))
    checks = check_procedure(proc(step(3, Mention("control", "Create VPC"))), inventory())
    assert labels(checks) == ["ok"] * 4
    # No form open (the VPC list): a row of the list, and this list has no row links.
    assert labels(check_procedure(proc(), inventory()))[-1] == "unreachable"


def test_a_control_named_with_the_resource_it_acts_on_is_that_control():
    """"Click Delete User" on the users list, whose rows have Delete."""
    proc = Procedure("Delete a RAM user", "ram.md", (
        step(1, Mention("product", "RAM console")), step(2, Mention("menu", "Users")),
        step(3, Mention("control", "Delete User")), step(4, Mention("control", "OK"))))
    checks = check_procedure(proc, inventory())
    assert checks[2].label == "label_differs" and checks[2].closest == "Delete"
    proc = Procedure("x", "ram.md", proc.steps[:2] + (step(3, Mention("control",
                                                                      "Delete Policy")),))
    assert check_procedure(proc, inventory())[2].label == "missing"   # not a resource noun


@pytest.mark.parametrize("value, problem", [
    ("finance-reports-2024", ""),
    ("Finance_Reports-2024", "does not take 'FR_'"),
    ("ab", "takes 3 to 63 characters"),
    ("-logs", "starts and ends with a letter or digit"),
    ("http-logs", ""),
])
def test_values_against_the_rules_the_console_states_under_a_field(value, problem):
    help_text = ("3 to 63 characters: lowercase letters, digits and hyphens (-); starts and "
                 "ends with a letter or digit. Unique among all users of OSS.")
    got = help_problem("Bucket Name", help_text, value)
    assert (problem in got and got) if problem else got == ""
    names = ("2 to 128 characters. Starts with a letter; letters, digits, periods (.), "
             "underscores (_), hyphens (-) and colons (:).")
    assert help_problem("Name", names, "web:01.a_b-c") == ""
    assert "' '" in help_problem("Name", names, "web 01")     # "(:)" is a listed character
    assert "rule" in help_problem("Name", names, "1web")
    assert "rule" in help_problem("Description", "At most 256 characters; cannot start with "
                                                 "http:// or https://.", "https://x")


def test_cidr_blocks_against_the_rules_the_console_states():
    vpc = ("10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or a subnet of them, with a mask from /8 "
           "to /28.")
    assert help_problem("IPv4 CIDR Block", vpc, "192.168.0.0/16") == ""
    assert "rule" in help_problem("IPv4 CIDR Block", vpc, "100.64.0.0/16")
    assert "/8 to /28" in help_problem("IPv4 CIDR Block", vpc, "10.0.0.0/29")
    vsw = "Inside the VPC's CIDR block, mask /16 to /29, not overlapping another vSwitch."
    assert "/16 to /29" in help_problem("IPv4 CIDR Block", vsw, "192.168.50.0/30")
    assert help_problem("IPv4 CIDR Block", vsw, "10.1.0.0/24") == ""      # no VPC block known
    import ipaddress
    page = (ipaddress.IPv4Network("10.0.0.0/16"),)
    assert help_problem("IPv4 CIDR Block", vsw, "10.0.1.0/24", page) == ""
    assert "10.0.0.0/16" in help_problem("IPv4 CIDR Block", vsw, "10.1.0.0/24", page)


def test_the_vpc_blocks_a_page_gives():
    proc = Procedure("Create a vSwitch", "v.md", (
        DocStep("1", "Select the VPC whose CIDR block is 10.0.0.0/16."),
        DocStep("2", "In IPv4 CIDR Block, enter 10.0.1.0/24.")),
        prerequisites=("A VPC with the CIDR block 192.168.0.0/16 exists.",),
        context=("VPC app 172.16.0.0/12", "The vSwitch vsw-a of the VPC has 10.9.0.0/24.",
                 "Allow port 22 from 10.8.0.0/24."))
    assert [str(n) for n in page_networks(proc)] == ["192.168.0.0/16", "172.16.0.0/12",
                                                     "10.0.0.0/16"]


def test_a_documented_value_the_fields_help_rules_out_is_a_defect():
    inv = inventory()
    page = inv.pages[1]
    form = page.forms[0]
    logon = dataclasses.replace(form.fields[0], help="1 to 64 characters: letters, digits, "
                                "periods (.), underscores (_) and hyphens (-).")
    form = dataclasses.replace(form, fields=(logon,) + form.fields[1:])
    inv = dataclasses.replace(inv, pages=(inv.pages[0], dataclasses.replace(page, forms=(form,)))
                              + inv.pages[2:])
    steps = list(create_user("Create").steps)
    steps[3] = step(4, Mention("field", "Logon Name", "wang.fang@example.com"))
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)), inv)
    assert checks[3].label == "missing" and "'@'" in checks[3].detail


def test_a_wizards_step_called_a_page_is_that_step():
    inv = inventory()
    wizard = Form("Create VPC", inv.pages[-1].forms[0].fields, submit="OK",
                  action="Vpc:CreateVpc", post="/console/vpc/vpcs/create",
                  steps=("Basics", "Network"), next_label="Next")
    inv = dataclasses.replace(inv, pages=inv.pages[:-1] + (dataclasses.replace(
        inv.pages[-1], forms=(wizard,)),))
    proc = Procedure("Create a VPC", "vpc.md", (
        step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
        step(3, Mention("control", "Create VPC")),
        step(4, Mention("page", "Network"), Mention("field", "Name", "v1")),
        step(5, Mention("page", "Billing"))))
    assert labels(check_procedure(proc, inv)) == ["ok"] * 4 + ["missing"]


def test_a_choice_on_a_wizards_step_is_one_that_step_offers():
    """"On the Image page, select ESSD": not any resource picker of a later step's name."""
    inv = inventory()
    wizard = Form("Create VPC", (
        FormField("Image", "Image", "radio", True, ("Ubuntu", "Debian"), step="Image"),
        FormField("Billing", "Billing Method", "radio", True, ("Subscription", "Pay-As-You-Go"),
                  step="Image"),
        FormField("VpcId", "VPC", "select", True, ("{}",), step="Network")),
        submit="OK", action="Vpc:CreateVpc", post="/console/vpc/vpcs/create",
        steps=("Image", "Network"), next_label="Next")
    inv = dataclasses.replace(inv, pages=inv.pages[:-1] + (dataclasses.replace(
        inv.pages[-1], forms=(wizard,)),))

    def run(*late):
        return labels(check_procedure(Procedure("Create a VPC", "vpc.md", (
            step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
            step(3, Mention("control", "Create VPC")),
            step(4, Mention("page", "Image"), *late))), inv))[3]

    assert run(Mention("option", "Debian")) == "ok"
    assert run(Mention("option", "ESSD")) == "missing"
    assert run(Mention("control", "Next"), Mention("option", "vpc-prod")) == "ok"
    assert run(Mention("option", "vpc-prod")) == "missing"      # still on the Image step
    assert labels(check_procedure(Procedure("Create a VPC", "vpc.md", (
        step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
        step(3, Mention("control", "Create VPC")),
        step(4, Mention("option", "Pay-As-Yuo-Go")))), inv))[3] == "missing"   # a label


def test_a_navigation_sentence_that_goes_on_to_the_pages_own_control():
    """"In the navigation pane, click Users, and then click Create User": the reader reads
    both clicks as navigation; the second is the Users page's button."""
    steps = list(create_user("Create").steps)
    steps[1:3] = [step(2, Mention("menu", "Users"), Mention("menu", "Create User"))]
    checks = check_procedure(Procedure("Create a RAM user", "ram.md", tuple(steps)),
                             inventory())
    assert labels(checks) == ["ok"] * 4
    steps[1] = step(2, Mention("menu", "Users"), Mention("menu", "Invite User"))
    assert labels(check_procedure(Procedure("x", "ram.md", tuple(steps)), inventory()))[1] \
        == "missing"


def test_products_the_console_lacks_and_controls_of_another_product():
    proc = Procedure("Create a database", "rds.md", (
        step(1, Mention("product", "ApsaraDB RDS console")),))
    assert labels(check_procedure(proc, inventory())) == ["missing"]
    proc = Procedure("x", "x.md", (step(1, Mention("product", "RAM console")),
                                   step(2, Mention("menu", "VPCs"))))
    assert labels(check_procedure(proc, inventory())) == ["ok", "unreachable"]


def test_steps_with_nothing_named_are_ok_and_say_why():
    proc = Procedure("x", "x.md", (step(1, note=True), DocStep("2", "Wait.", (), False)))
    checks = check_procedure(proc, inventory())
    assert labels(checks) == ["ok", "ok"]
    assert "note" in checks[0].detail and "could not be read" in checks[1].detail


def test_similarity_ignores_case_punctuation_and_plurals():
    assert similarity("Create user", "Create User") == 1.0
    assert similarity("Security Group", "Security Groups") >= 0.97
    assert similarity("Add New User", "Create User") < 0.85


def test_after_a_flagged_step_the_next_steps_are_not_flagged_for_the_same_break():
    proc = Procedure("Create a RAM user", "ram.md", (
        step(1, Mention("product", "RAM console")),
        step(2, Mention("menu", "Users")),
        step(3, Mention("control", "Add New User")),          # invented name
        step(4, Mention("field", "Logon Name", "deploy-bot")),
        step(5, Mention("control", "Create")),
    ))
    assert labels(check_procedure(proc, inventory())) == ["ok", "ok", "missing", "ok", "ok"]


def test_once_lost_a_control_only_another_product_has_is_not_this_steps_fault():
    proc = Procedure("Create a RAM user", "ram.md", (
        step(1, Mention("product", "RAM console")),
        step(2, Mention("menu", "Users")),
        step(3, Mention("control", "Add New Member")),       # invented: the reader is lost
        step(4, Mention("control", "Create VPC")),           # only the VPC console has it
        step(5, Mention("control", "Frobnicate")),           # nowhere: its own text is wrong
    ))
    checks = check_procedure(proc, inventory())
    assert labels(checks) == ["ok", "ok", "missing", "ok", "missing"]
    assert "lost since step 3" in checks[3].detail


def test_a_tab_the_page_shows_as_a_section_is_that_section():
    inv = inventory()
    page = dataclasses.replace(inv.pages[0], controls=inv.pages[0].controls + (
        Control("button", "Remove", "dialog:Remove", where="section:Permissions"),))
    inv = dataclasses.replace(inv, pages=(page,) + inv.pages[1:])
    proc = Procedure("See a user's permissions", "ram.md", (
        step(1, Mention("product", "RAM console")), step(2, Mention("menu", "Users")),
        step(3, Mention("control", "Permissions", "tab")),
        step(4, Mention("control", "Billing", "tab"))))
    checks = check_procedure(proc, inv)
    assert labels(checks) == ["ok", "ok", "label_differs", "missing"]
    assert "section" in checks[2].detail


def test_a_section_the_page_lacks_but_another_page_has_is_unreachable():
    inv = inventory()
    detail = inv.page(USERS + "/{}")
    with_section = PageEntry(detail.pattern, detail.title, detail.product, (), detail.controls + (
        Control("button", "Add Permissions", f"page:{USERS}/{{}}/grant",
                where="section:Permissions"),))
    pages = tuple(with_section if p.pattern == detail.pattern else p for p in inv.pages)
    inv = Inventory(inv.console, inv.drift, inv.crawled_at, inv.version, pages, inv.products)
    proc = Procedure("Grant", "ram.md", (
        step(1, Mention("product", "RAM console")),
        step(2, Mention("menu", "Users")),
        step(3, Mention("section", "Permissions"), Mention("control", "Add Permissions")),
        step(4, Mention("section", "Nowhere Recorded")),
    ))
    checks = check_procedure(proc, inv)
    assert labels(checks) == ["ok", "ok", "unreachable", "ok"]
    assert "Permissions" in checks[2].detail


def test_a_defect_is_sure_or_only_a_suspicion_a_run_can_clear():
    # A submit word near the form's own button ("Create now" / Create): a suspicion.
    near = check_procedure(create_user("Create now"), inventory())[4]
    assert near.label == "missing" and near.suspect and near.closest == "Create"
    # Nothing near it: sure.
    far = check_procedure(create_user("Add New Member"), inventory())[4]
    assert far.label == "missing" and not far.suspect and far.sure_defect
    # A "control" that reads like a resource's name: perhaps its link in a list.
    named = check_procedure(create_user("web-01"), inventory())[4]
    assert named.label == "missing" and named.suspect
    # The control exists in the product, on a page the steps skipped: a suspicion.
    skipped = check_procedure(create_user("Create", skip_open=True), inventory())[2]
    assert skipped.label == "unreachable" and skipped.suspect
    # Values the field refuses, options it lacks, other products: sure.
    proc = Procedure("Create a VPC", "vpc.md", (
        step(1, Mention("product", "VPC console")), step(2, Mention("menu", "VPCs")),
        step(3, Mention("control", "Create VPC")),
        step(4, Mention("option", "100.64.0.0/10", field="IPv4 CIDR Block")),
        step(5, Mention("field", "Bandwidth", "500"))))
    assert [(c.label, c.suspect) for c in check_procedure(proc, inventory())][3:] == [
        ("missing", False), ("missing", False)]
    other = Procedure("x", "x.md", (step(1, Mention("product", "RAM console")),
                                    step(2, Mention("menu", "VPCs"))))
    assert [c.suspect for c in check_procedure(other, inventory())] == [False, False]
