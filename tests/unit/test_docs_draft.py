"""Drafting a task from a procedure (rollout_service.docs.draft) against a hand-made inventory
of the local console: the operation, the success rule, generated values, prerequisites, and a
reason when there is no task."""
from __future__ import annotations

import dataclasses
import re


from consolerl.resources import fill
from consolerl.tasks import parse_task
from infra.console_sim.products import all_products
from rollout_service.docs import operations
from rollout_service.docs.draft import Draft, draft_task, norm, snake
from rollout_service.docs.model import Form, FormField, PageEntry, StepCheck
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


def test_a_defective_procedure_is_still_drafted_and_says_so():
    proc = fx.ram_create_user()
    checks = [StepCheck(s.number, "ok") for s in proc.steps]
    checks[2] = StepCheck("3", "missing", "Create User", detail="no such button")
    d = draft_task(proc, checks, fx.inventory(), task_id="draft-defect")
    assert d.task is not None and d.task["expected"] == "success"
    assert "static defects at step(s) 3" in d.reason


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
