"""Drafting a task from a procedure (doccheck.draft) against a hand-made inventory
of the local console: the operation, the success rule, generated values, prerequisites, and a
reason when there is no task."""
from __future__ import annotations

import dataclasses
import re

import pytest

from consolerl.resources import fill
from consolerl.tasks import parse_task
from infra.console_sim.products import all_products
from doccheck import operations
from doccheck.draft import Draft, draft_task, norm, snake
from doccheck.model import Form, FormField, PageEntry, StepCheck
from tests import docs_fixture as fx


def drafted(proc, checks=(), inventory=None, **kw) -> dict:
    d = draft_task(proc, checks, inventory or fx.inventory(), task_id="draft-test", **kw)
    assert isinstance(d, Draft) and d.task is not None, d.reason
    parse_task(d.task, "draft")          # every draft is a task the suite's parser accepts
    assert d.task["split"] == "heldout" and d.task["expected"] == "success"
    assert "oracle" not in d.task and d.source == "rules"
    return d.task


def test_ram_create_user():
    task = drafted(fx.ram_create_user("deploy-bot"))
    assert (task["product"], task["start_page"]) == ("ram", "/console/ram/users")
    (op,) = task["success"]["required_events"]
    assert (op["service"], op["event"]) == ("Ram", "CreateUser")
    assert op["where"] == {"requestParameters.UserName": "{user_name}",
                           "requestParameters.DisplayName": "Deploy Bot"}
    # The doc's name, unique per episode, in the rule and in the text the agent reads.
    assert task["parameters"] == {"user_name": "deploy-bot-{episode}"}
    assert "`{user_name}`" in task["procedure"] and "deploy-bot" not in task["procedure"]
    assert task["procedure"].startswith("1. Log on to the RAM console.\n2. ")
    assert task["success"]["forbidden_events"] == [
        {"event": "DeleteUser", "service": "Ram",
         "where": {"requestParameters.UserName": "{user_name}"}}]
    (state,) = task["success"]["end_state"]
    assert state["action"] == "GetUser" and state["expect"] == {
        "User.UserName": "{user_name}", "User.DisplayName": "Deploy Bot"}
    assert "prerequisites" not in task


def test_vpc_create_with_cidr_and_a_generated_name():
    task = drafted(fx.vpc_create("10.0.0.0/8"))
    (op,) = task["success"]["required_events"]
    assert op["event"] == "CreateVpc" and op["where"] == {
        "requestParameters.VpcName": "{vpc_name}", "requestParameters.CidrBlock": "10.0.0.0/8"}
    name = fill(task["parameters"]["vpc_name"], {"episode": "0a1b2c3d"})
    assert re.fullmatch(r"[a-z][a-z0-9-]{1,127}", name)       # the cloud's VPC name rule
    assert "4. Enter a name for the VPC. (Use `{vpc_name}` as the VPC Name.)" in task["procedure"]
    # Deleting the VPC this operation made is forbidden (a reference to its response).
    assert task["success"]["forbidden_events"] == [
        {"event": "DeleteVpc", "service": "Vpc",
         "where": {"requestParameters.VpcId": {"ref": "op.responseElements.VpcId"}}}]


def test_ecs_add_rule_declares_the_security_group_it_edits():
    proc = fx.ecs_add_rule()
    checks = fx.ok_checks(proc, {"2": "/console/ecs/security-groups",
                                 "3": "/console/ecs/security-groups/{}",
                                 "4": "/console/ecs/security-groups/{}/rules/create"})
    task = drafted(proc, checks)
    assert task["start_page"] == "/console/ecs/security-groups"
    assert [(p["id"], p["type"]) for p in task["prerequisites"]] == [
        ("net", "vpc"), ("sg", "security_group")]
    assert task["prerequisites"][1]["properties"]["vpc"] == "${net}"
    (op,) = task["success"]["required_events"]
    assert op["event"] == "AuthorizeSecurityGroup" and op["where"] == {
        "requestParameters.SecurityGroupId": "{sg}", "requestParameters.Policy": "accept",
        "requestParameters.IpProtocol": "TCP", "requestParameters.PortRange": "22/22",
        "requestParameters.SourceCidrIp": "10.0.0.0/8"}
    assert {e["event"] for e in task["success"]["forbidden_events"]} == {
        "RevokeSecurityGroup", "DeleteSecurityGroup"}
    # The agent is told which group: where it picks it (step 3).
    assert "3. Find the security group and click Manage Rules in the Actions column. (The " \
           "security group is `{sg}`.)" in task["procedure"]
    assert draft_task(proc, checks, fx.inventory(), task_id="x").reason == ""


def test_oss_set_acl_on_a_prerequisite_bucket():
    task = drafted(fx.oss_set_acl())
    assert task["prerequisites"] == [{"id": "b", "type": "oss_bucket",
                                      "properties": {"name": "data-{episode}"}}]
    (op,) = task["success"]["required_events"]
    assert op["where"] == {"requestParameters.BucketName": "{b}",
                           "requestParameters.Acl": "public-read"}   # the option's value
    assert task["success"]["end_state"] == [{"service": "Oss", "action": "GetBucketAcl",
                                             "params": {"BucketName": "{b}"},
                                             "expect": {"Acl": "public-read"}}]


def test_stop_through_a_confirmation_dialog_needs_a_running_instance():
    task = drafted(fx.ecs_stop_instance())
    (op,) = task["success"]["required_events"]
    assert op["event"] == "StopInstance" and op["where"] == {
        "requestParameters.InstanceId": "{vm}"}
    vm = task["prerequisites"][-1]
    assert vm["type"] == "instance" and vm["properties"]["status"] == "Running"
    assert [p["id"] for p in task["prerequisites"]] == ["net", "sw", "sg", "vm"]
    assert task["success"]["end_state"][0]["expect"] == {"Instances.Instance.0.Status":
                                                         "Stopped"}
    assert "(The instance is `{vm}`.)" in task["procedure"].splitlines()[1]


def test_no_operation_is_a_reason_not_a_task():
    d = draft_task(fx.no_operation(), (), fx.inventory(), task_id="draft-none")
    assert d.task is None and d.reason.startswith("no operation:")
    assert "/console/ram/users" in d.reason
    assert draft_task(dataclasses.replace(fx.no_operation(), steps=()), (), fx.inventory(),
                      task_id="x").reason == "the procedure has no steps"


@pytest.mark.parametrize("title, action, fits", [
    ("Delete a vSwitch on the VPC details page", "Vpc:DeleteVSwitch", True),
    ("Delete a vSwitch on the VPC details page", "Vpc:DeleteVpc", False),
    ("Remove a system policy from a RAM user", "Ram:DetachPolicyFromUser", True),
    ("Remove a system policy from a RAM user", "Ram:DeleteUser", False),
    ("Delete an inbound security group rule", "Ecs:RevokeSecurityGroup", True),
    ("Delete an inbound security group rule", "Ecs:DeleteSecurityGroup", False),
    ("Delete a security group", "Ecs:DeleteInstance", False),
    ("Create a bucket for website images", "Oss:DeleteBucket", False),
    ("Change the instance type", "Ecs:StartInstance", False),
    ("Restart an instance", "Ecs:RebootInstance", True),
    ("Stop an instance", "Ecs:RebootInstance", False),
    ("Find a RAM user by logon name and delete it", "Ram:DeleteUser", True),   # two verbs
    ("Find and delete a vSwitch by ID", "Vpc:DeleteVSwitch", True),
    ("Find a RAM user by logon name", "Ram:DeleteUser", False),
    ("Start a stopped instance", "Ecs:StartInstance", True),
    ("Release EIPs", "Vpc:ReleaseEipAddress", True),
    ("Allow ping requests", "Ecs:AuthorizeSecurityGroup", True),     # no resource named
    ("Rename an instance", "Ecs:ModifyInstanceAttribute", True),
    ("How to grant permissions to the RAM user", "Ram:AttachPolicyToUser", True),
    ("Create a user", "", True),                    # no recorded action: nothing says no
])
def test_the_operation_must_do_what_the_title_says(title, action, fits):
    assert (operations.title_misfit(title, action) == "") is fits


def test_a_title_the_steps_operation_does_not_fit_is_not_drafted():
    proc = fx.ram_create_user("deploy-bot")
    d = draft_task(dataclasses.replace(proc, title="Delete a RAM user"), (), fx.inventory(),
                   task_id="draft-misfit")
    assert d.task is None and d.reason.startswith("no operation: the title says 'delete'")
    assert "Ram:CreateUser" in d.reason


def test_a_form_without_a_recorded_action_is_a_reason():
    inv = fx.inventory()
    pages = tuple(dataclasses.replace(p, forms=tuple(dataclasses.replace(f, action="")
                                                     for f in p.forms)) for p in inv.pages)
    d = draft_task(fx.ram_create_user(), (), dataclasses.replace(inv, pages=pages),
                   task_id="draft-x")
    assert d.task is None and "no recorded API action" in d.reason


def test_a_renamed_submit_is_found_through_the_static_checks_closest_label():
    inv = fx.inventory("rename")
    pages = tuple(dataclasses.replace(p, forms=tuple(
        dataclasses.replace(f, submit="Apply") for f in p.forms))
        if p.pattern == "/console/oss/buckets/{}/acl" else p for p in inv.pages)
    inv = dataclasses.replace(inv, pages=pages)
    proc = fx.oss_set_acl()
    checks = list(fx.ok_checks(proc, {"2": "/console/oss/buckets",
                                      "3": "/console/oss/buckets/{}/acl"}))
    checks[4] = StepCheck("5", "label_differs", "Save", "Apply", 0.4,
                          "/console/oss/buckets/{}/acl")
    task = drafted(proc, checks, inv, drift="rename")
    assert task["drift"] == "rename"
    assert task["success"]["required_events"][0]["event"] == "PutBucketAcl"


def test_a_procedure_the_static_check_found_defective_is_not_drafted():
    proc = fx.ram_create_user()
    checks = [StepCheck(s.number, "ok") for s in proc.steps]
    checks[2] = StepCheck("3", "missing", "Create User", detail="no such button")
    d = draft_task(proc, checks, fx.inventory(), task_id="draft-defect")
    assert d.task is None
    assert d.reason.startswith("not drafted: the static check found defects at step(s) 3")
    # A label that merely differs (stale text) is no defect: that one is drafted.
    checks[2] = StepCheck("3", "label_differs", "Create User", "Add User", 0.5)
    assert draft_task(proc, checks, fx.inventory(), task_id="draft-stale").task is not None


def _with_sends(inv, pattern: str, sends: tuple[tuple[str, str], ...], **changes):
    """``inv`` with the forms (and post controls) on ``pattern`` carrying ``sends``."""
    pages = tuple(dataclasses.replace(p, forms=tuple(
        dataclasses.replace(f, sends=sends, **changes) for f in p.forms),
        controls=tuple(dataclasses.replace(c, sends=sends) if c.target.startswith("post:")
                       else c for c in p.controls))
        if p.pattern == pattern else p for p in inv.pages)
    return dataclasses.replace(inv, pages=pages)


def test_what_the_console_sends_unasked_comes_from_the_crawl():
    # The grant form sends PolicyType=System, a constant no doc names; the user is the
    # path's resource, learnt as "{}".
    inv = _with_sends(fx.inventory(), "/console/ram/users/{}/grant", (
        ("PolicyName", "{}"), ("PolicyType", "System"), ("UserName", "{}")))
    proc = fx.Procedure("Grant", "ram.md", (
        fx.step("1", "Log on to the RAM console.", fx.M("product", "RAM console")),
        fx.step("2", "In the left-side navigation pane, choose Identities > Users.",
                fx.M("menu", "Identities > Users")),
        fx.step("3", "Find the user and click Add Permissions.",
                fx.M("control", "Add Permissions")),
        fx.step("4", "Select ReadOnlyAccess.", fx.M("option", "ReadOnlyAccess",
                                                    field="System Policy")),
        fx.step("5", "Click OK.", fx.M("control", "OK"))))
    task = drafted(proc, inventory=inv)
    assert task["success"]["required_events"][0]["where"] == {
        "requestParameters.UserName": "{dev}", "requestParameters.PolicyName": "ReadOnlyAccess",
        "requestParameters.PolicyType": "System"}


def test_a_resource_the_form_sends_but_the_doc_does_not_name_is_a_prerequisite():
    # "Find vpc-prod and click Create vSwitch": the form's VPC select is set by the row; the
    # crawl learnt the request carries VpcId. The VPC's block must hold the doc's vSwitch.
    inv = _with_sends(fx.inventory(), "/console/vpc/vswitches/create", (
        ("CidrBlock", "{}"), ("ClientToken", "{}"), ("RegionId", "{}"), ("VSwitchName", "{}"),
        ("VpcId", "{}"), ("ZoneId", "{}")))
    proc = fx.Procedure("Create a vSwitch", "vpc.md", (
        fx.step("1", "Log on to the VPC console.", fx.M("product", "VPC console")),
        fx.step("2", "In the left-side navigation pane, click VPCs.", fx.M("menu", "VPCs")),
        fx.step("3", "Find vpc-prod and click Create vSwitch.", fx.M("control", "Create vSwitch")),
        fx.step("4", "Select cn-hangzhou-i from the Zone list.",
                fx.M("option", "cn-hangzhou-i", field="Zone")),
        fx.step("5", "Enter 10.0.1.0/24 in the IPv4 CIDR Block field.",
                fx.M("field", "IPv4 CIDR Block", "10.0.1.0/24")),
        fx.step("6", "Click Create.", fx.M("control", "Create"))),
        prerequisites=("The VPC vpc-prod uses the CIDR block 10.0.0.0/12.",))
    task = drafted(proc, inventory=inv)
    where = task["success"]["required_events"][0]["where"]
    assert where["requestParameters.VpcId"] == "{net}"
    assert where["requestParameters.CidrBlock"] == "10.0.1.0/24"
    assert "requestParameters.RegionId" not in where and \
        "requestParameters.ClientToken" not in where
    (vpc,) = task["prerequisites"]
    assert vpc["type"] == "vpc" and vpc["properties"]["cidr_block"] == "10.0.0.0/12"
    assert "(The VPC is `{net}`.)" in task["procedure"].splitlines()[2]
    # Without a block in the doc's prerequisites: the /16 around the vSwitch's.
    task = drafted(dataclasses.replace(proc, prerequisites=()), inventory=inv)
    assert task["prerequisites"][0]["properties"]["cidr_block"] == "10.0.0.0/16"


def test_a_required_name_the_doc_leaves_and_the_form_sends_is_generated():
    inv = _with_sends(fx.inventory(), "/console/ram/users/create", (
        ("DisplayName", "{}"), ("UserName", "{}")))
    proc = fx.ram_create_user()
    steps = list(proc.steps)
    steps[3] = fx.step("4", "Enter Deploy Bot as the display name.",
                       fx.M("field", "Display Name", "Deploy Bot"))
    task = drafted(dataclasses.replace(proc, steps=tuple(steps)), inventory=inv)
    where = task["success"]["required_events"][0]["where"]
    assert where["requestParameters.UserName"] == "{user_name}"
    assert "prerequisites" not in task          # a name to make, not a user to provision
    assert "`{user_name}`" in task["procedure"]


def test_a_confirmed_row_action_acts_on_the_dialogs_resource():
    # The row's Delete (its action known) opens a dialog whose OK posts to the user's path.
    inv = fx.inventory()
    pages = tuple(dataclasses.replace(p, controls=tuple(
        dataclasses.replace(c, action="Ram:DeleteUser") if c.label == "Delete" else c
        for c in p.controls)) if p.pattern == "/console/ram/users" else p for p in inv.pages)
    proc = fx.Procedure("Delete a user", "ram.md", (
        fx.step("1", "Log on to the RAM console.", fx.M("product", "RAM console")),
        fx.step("2", "In the left-side navigation pane, choose Identities > Users.",
                fx.M("menu", "Identities > Users")),
        fx.step("3", "Find the user and click Delete.", fx.M("control", "Delete")),
        fx.step("4", "Click OK.", fx.M("control", "OK"))))
    task = drafted(proc, inventory=dataclasses.replace(inv, pages=pages))
    assert task["success"]["required_events"][0]["where"] == {
        "requestParameters.UserName": "{dev}"}
    assert task["prerequisites"][0]["type"] == "ram_user"


def test_the_fields_the_doc_fills_find_the_form_when_no_step_clicks_submit():
    proc = fx.ram_create_user()
    proc = dataclasses.replace(proc, steps=proc.steps[:4])     # "Click Create" left out
    task = drafted(proc)
    assert task["success"]["required_events"][0]["event"] == "CreateUser"


def test_an_option_whose_value_the_crawl_did_not_record_allows_label_or_slug():
    inv = fx.inventory()
    pages = tuple(dataclasses.replace(p, forms=tuple(dataclasses.replace(f, fields=tuple(
        dataclasses.replace(x, values=()) for x in f.fields)) for f in p.forms))
        for p in inv.pages)
    task = drafted(fx.oss_set_acl(), inventory=dataclasses.replace(inv, pages=pages))
    where = task["success"]["required_events"][0]["where"]
    assert where["requestParameters.Acl"] == {"in": ["Public Read", "public-read"]}
    assert "end_state" not in task["success"]        # no value known to read back


def test_a_resource_no_declaration_covers_needs_the_resource_coder():
    inv = fx.inventory()
    extra = PageEntry("/console/ecs/disks/{}/resize", "Resize Disk", "ecs", forms=(Form(
        "Resize Disk", (FormField("NewSize", "Capacity", "number"),), submit="OK",
        action="Ecs:ResizeDisk", post="/console/ecs/disks/{}/resize"),))
    inv = dataclasses.replace(inv, pages=inv.pages + (extra,))
    proc = fx.Procedure("Resize a disk", "ecs.md", (
        fx.step("1", "Go to the Resize Disk page.", fx.M("page", "Resize Disk")),
        fx.step("2", "Set Capacity to 40.", fx.M("field", "Capacity", "40")),
        fx.step("3", "Click OK.", fx.M("control", "OK"))))
    d = draft_task(proc, (), inv, task_id="draft-disk")
    assert d.task is None and "no LLM endpoint is configured for the ResourceCoder" in d.reason


def test_prose_prerequisites_no_declaration_covers_are_noted():
    proc = dataclasses.replace(fx.oss_set_acl(), prerequisites=(
        "You have an Alibaba Cloud account.", "An ECS instance runs in the region."))
    d = draft_task(proc, (), fx.inventory(), task_id="draft-prose")
    assert d.task is not None
    assert "An ECS instance runs in the region." in d.reason and "ResourceCoder" in d.reason


def test_the_resource_coder_is_asked_when_configured():
    from consolerl.resources import parse_resources

    class Coder:
        asked = []

        def plan(self, title, text):
            self.asked.append(text)
            return type("Plan", (), {"specs": tuple(parse_resources([
                {"id": "net2", "type": "vpc", "properties": {"name": "n-{episode}"}}]))})()
    proc = dataclasses.replace(fx.oss_set_acl(), prerequisites=("A VPC exists.",))
    coder = Coder()
    task = drafted(proc, coder=coder)
    assert coder.asked == ["A VPC exists."]
    assert {p["id"] for p in task["prerequisites"]} == {"b", "net2"}


def test_braces_in_doc_text_do_not_become_placeholders():
    proc = fx.ram_create_user()
    steps = list(proc.steps)
    steps[4] = fx.step("5", "Click Create. The policy reads {resource}.", fx.M("control", "Create"))
    task = drafted(dataclasses.replace(proc, steps=tuple(steps)))
    fill(task["procedure"], {"user_name": "u", "episode": "e"})     # nothing left unfilled


def test_nested_steps_are_numbered_as_nested():
    proc = fx.ram_create_user()
    steps = list(proc.steps)
    steps.insert(4, fx.step("4.a", "Optionally add a comment."))
    task = drafted(dataclasses.replace(proc, steps=tuple(steps)))
    assert "\n   a. Optionally add a comment.\n" in task["procedure"]


def test_label_helpers():
    assert norm("**Logon Name** (required):") == "logon name"
    assert snake("UserName") == "user_name" and snake("VSwitchId") == "vswitch_id"


def test_the_api_tables_name_actions_the_cloud_has():
    products = all_products()

    def exists(service: str, action: str) -> bool:
        return action in products[service].actions
    for op, contraries in operations.CONTRARY.items():
        service, action = op.split(":")
        assert exists(service, action), op
        assert all(exists(service, c) for c in contraries), op
    for op, rb in operations.READBACK.items():
        service, action = op.split(":")
        assert exists(service, action) and exists(service, rb.action), op
    for rtype, decl in operations.DECLARATIONS.items():
        assert all(t in operations.DECLARATIONS for _, t in decl.refs)


def test_values_only_the_parameter_table_gives_reach_the_steps():
    proc = fx.ram_create_user()
    steps = list(proc.steps)
    steps[3] = fx.step("4", "Configure the following parameters.")
    proc = dataclasses.replace(proc, steps=tuple(steps), parameters=(
        ("Logon Name", "deploy-bot"), ("Display Name", "Deploy Bot")))
    task = drafted(proc)
    line = task["procedure"].splitlines()[3]
    assert line == ("4. Configure the following parameters. (Use `{user_name}` as the Logon "
                    "Name.) (Set Display Name to `Deploy Bot`.)")
    assert task["success"]["required_events"][0]["where"] == {
        "requestParameters.UserName": "{user_name}", "requestParameters.DisplayName": "Deploy Bot"}


def test_a_field_whose_label_differs_is_filled_under_the_consoles_label():
    inv = fx.inventory()
    pages = tuple(dataclasses.replace(p, forms=tuple(dataclasses.replace(f, fields=tuple(
        dataclasses.replace(x, label="Username") if x.name == "UserName" else x
        for x in f.fields)) for f in p.forms)) for p in inv.pages)
    proc = fx.ram_create_user("ci-runner")
    checks = [StepCheck(s.number, "ok") for s in proc.steps]
    checks[3] = StepCheck("4", "label_differs", "Logon Name", "Username", 0.5,
                          "/console/ram/users/create")
    task = drafted(proc, checks, dataclasses.replace(inv, pages=pages), drift="rename")
    # the doc's value, unique per episode, in the rule and in the text the agent reads
    assert task["success"]["required_events"][0]["where"]["requestParameters.UserName"] == \
        "{user_name}"
    assert task["parameters"] == {"user_name": "ci-runner-{episode}"}
    assert "ci-runner" not in task["procedure"]


def test_the_resource_the_doc_finds_by_name_is_provisioned_under_that_name():
    proc = fx.Procedure("Set an ACL", "oss.md", (
        fx.step("1", "Log on to the OSS console.", fx.M("product", "OSS console")),
        fx.step("2", "In the left-side navigation pane, click Buckets.", fx.M("menu", "Buckets")),
        fx.step("3", "Enter tmp-export-01 in the search box and click Search.",
                fx.M("field", "", "tmp-export-01"), fx.M("control", "Search")),
        *(dataclasses.replace(s, number=str(int(s.number) + 1))
          for s in fx.oss_set_acl().steps[2:])))
    task = drafted(proc)
    (bucket,) = task["prerequisites"]
    assert bucket["properties"]["name"] == "tmp-export-01-{episode}"
    assert "3. Enter tmp-export-01-{episode} in the search box" in task["procedure"]
    text = fill(task["procedure"], {"episode": "e1", "b": "tmp-export-01-e1"})
    assert "tmp-export-01-e1 in the search box" in text
