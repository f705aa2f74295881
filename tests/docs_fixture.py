"""A hand-made inventory of the local console (the pages, controls and forms of
infra/console_sim/console/*.py with their real labels, field names and API actions) and
procedures built by hand as the extractor would read them, and a fake OpenAI-compatible
chat endpoint with canned replies: fixtures for the drafting tests
until a crawled inventory is committed."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from infra.llm import OpenAIChatClient

from doccheck.model import (Control, DocStep, Form, FormField, Inventory, Mention,
                            PageEntry, Procedure, StepCheck)

ACL_LABELS = ("Private", "Public Read", "Public Read/Write")
ACL_VALUES = ("private", "public-read", "public-read-write")


def _nav(pattern: str, title: str, product: str, menu: tuple[str, ...],
         controls: tuple[Control, ...] = (), **kw) -> PageEntry:
    return PageEntry(pattern, title, product, menu, controls, **kw)


def inventory(drift: str = "") -> Inventory:
    pages = (
        # ---- RAM
        _nav("/console/ram/users", "Users", "ram", ("RAM", "Identities", "Users"), (
            Control("button", "Create User", "page:/console/ram/users/create", where="toolbar"),
            Control("link", "Manage", "page:/console/ram/users/{}", where="row"),
            Control("link", "Add Permissions", "page:/console/ram/users/{}/grant", where="row"),
            Control("button", "Delete", "dialog:Delete user", where="row", danger=True),
            Control("button", "OK", "post:/console/ram/users/{}/delete",
                    action="Ram:DeleteUser", where="dialog:Delete user"),
        ), columns=("Logon Name", "User ID", "Comments", "Created")),
        PageEntry("/console/ram/users/create", "Create User", "ram", forms=(Form(
            "Create User", (
                FormField("UserName", "Logon Name", required=True, max_length=64),
                FormField("DisplayName", "Display Name", max_length=128),
                FormField("Comments", "Comments", "textarea", max_length=128)),
            submit="Create", action="Ram:CreateUser", post="/console/ram/users/create",
            cancel="Cancel"),)),
        PageEntry("/console/ram/users/{}", "User", "ram", controls=(
            Control("button", "Add Permissions", "page:/console/ram/users/{}/grant"),)),
        PageEntry("/console/ram/users/{}/grant", "Add Permissions", "ram", forms=(Form(
            "Add Permissions", (
                FormField("Principal", "Principal", "readonly"),
                FormField("PolicyName", "System Policy", "radio", required=True,
                          options=("AdministratorAccess", "ReadOnlyAccess",
                                   "AliyunECSFullAccess"),
                          values=("AdministratorAccess", "ReadOnlyAccess",
                                  "AliyunECSFullAccess"))),
            submit="OK", action="Ram:AttachPolicyToUser",
            post="/console/ram/users/{}/grant"),)),
        # ---- VPC
        _nav("/console/vpc/vpcs", "VPCs", "vpc", ("VPC", "Networks", "VPCs"), (
            Control("button", "Create VPC", "page:/console/vpc/vpcs/create", where="toolbar"),
            Control("link", "Manage", "page:/console/vpc/vpcs/{}", where="row"),
            Control("link", "Create vSwitch", "page:/console/vpc/vswitches/create", where="row"),
        )),
        PageEntry("/console/vpc/vpcs/create", "Create VPC", "vpc", forms=(Form(
            "Create VPC", (
                FormField("VpcName", "VPC Name", max_length=128),
                FormField("CidrBlock", "IPv4 CIDR Block", required=True),
                FormField("Description", "Description", "textarea", max_length=256)),
            submit="Create", action="Vpc:CreateVpc", post="/console/vpc/vpcs/create"),)),
        PageEntry("/console/vpc/vpcs/{}", "VPC", "vpc", controls=(
            Control("button", "Create vSwitch", "page:/console/vpc/vswitches/create"),)),
        PageEntry("/console/vpc/vswitches/create", "Create vSwitch", "vpc", forms=(Form(
            "Create vSwitch", (
                FormField("VpcId", "VPC", "select", required=True),
                FormField("VSwitchName", "vSwitch Name", max_length=128),
                FormField("ZoneId", "Zone", "select", required=True,
                          options=("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j"),
                          values=("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j")),
                FormField("CidrBlock", "IPv4 CIDR Block", required=True),
                FormField("Description", "Description", "textarea")),
            submit="Create", action="Vpc:CreateVSwitch",
            post="/console/vpc/vswitches/create"),)),
        # ---- ECS
        _nav("/console/ecs/instances", "Instances", "ecs",
             ("ECS", "Instances & Images", "Instances"), (
                 Control("button", "Create Instance", "page:/console/ecs/instances/create"),
                 Control("link", "Manage", "page:/console/ecs/instances/{}", where="row"),
                 Control("button", "Start", "dialog:Start", where="row"),
                 Control("button", "Stop", "dialog:Stop instance", where="row"),
                 Control("button", "OK", "post:/console/ecs/instances/{}/stop",
                         action="Ecs:StopInstance", where="dialog:Stop instance"),
             )),
        _nav("/console/ecs/security-groups", "Security Groups", "ecs",
             ("ECS", "Network & Security", "Security Groups"), (
                 Control("button", "Create Security Group",
                         "page:/console/ecs/security-groups/create", where="toolbar"),
                 Control("link", "Manage Rules", "page:/console/ecs/security-groups/{}",
                         where="row"),
             )),
        PageEntry("/console/ecs/security-groups/{}", "Security Group", "ecs", controls=(
            Control("tab", "Inbound", "page:/console/ecs/security-groups/{}"),
            Control("tab", "Outbound", "page:/console/ecs/security-groups/{}"),
            Control("button", "Add Rule", "page:/console/ecs/security-groups/{}/rules/create",
                    where="section:Inbound"),
        ), tabs=("Inbound", "Outbound")),
        PageEntry("/console/ecs/security-groups/{}/rules/create", "Add Inbound Rule", "ecs",
                  forms=(Form("Add Inbound Rule", (
                      FormField("Policy", "Action", "radio", True, ("Allow", "Deny"),
                                values=("accept", "drop")),
                      FormField("Priority", "Priority", "number", minimum=1, maximum=100),
                      FormField("IpProtocol", "Protocol", "select", True,
                                ("Custom TCP", "Custom UDP", "All ICMP (IPv4)", "GRE", "All"),
                                values=("TCP", "UDP", "ICMP", "GRE", "ALL")),
                      FormField("PortRange", "Port Range"),
                      FormField("SourceCidrIp", "Authorization Object", required=True),
                      FormField("Description", "Description", "textarea")),
                      submit="Save", action="Ecs:AuthorizeSecurityGroup",
                      post="/console/ecs/security-groups/{}/rules/create"),)),
        # ---- OSS
        _nav("/console/oss/buckets", "Buckets", "oss", ("OSS", "Storage", "Buckets"), (
            Control("button", "Create Bucket", "page:/console/oss/buckets/create"),
            Control("link", "Manage", "page:/console/oss/buckets/{}", where="row"),
            Control("link", "Change ACL", "page:/console/oss/buckets/{}/acl", where="row"),
        )),
        PageEntry("/console/oss/buckets/create", "Create Bucket", "oss", forms=(Form(
            "Create Bucket", (
                FormField("BucketName", "Bucket Name", required=True, max_length=63),
                FormField("Region", "Region", "readonly"),
                FormField("StorageClass", "Storage Class", "radio",
                          options=("Standard", "IA", "Archive", "Cold Archive"),
                          values=("Standard", "IA", "Archive", "ColdArchive")),
                FormField("Acl", "ACL", "radio", options=ACL_LABELS, values=ACL_VALUES)),
            submit="OK", action="Oss:PutBucket", post="/console/oss/buckets/create"),)),
        PageEntry("/console/oss/buckets/{}/acl", "ACL", "oss", forms=(Form(
            "ACL", (FormField("Acl", "Bucket ACL", "radio", True, ACL_LABELS,
                              values=ACL_VALUES),),
            submit="Save", action="Oss:PutBucketAcl", post="/console/oss/buckets/{}/acl"),)),
    )
    return Inventory("local-fixture", drift, "2025-01-01T00:00:00Z", "fixture", pages,
                     (("ecs", "ECS"), ("vpc", "VPC"), ("ram", "RAM"), ("oss", "OSS")))


def step(number: str, text: str, *mentions: Mention) -> DocStep:
    return DocStep(number, text, tuple(mentions))


def M(kind: str, text: str, value: str = "", field: str = "") -> Mention:
    return Mention(kind, text, value, field)


def ram_create_user(name: str = "deploy-bot") -> Procedure:
    return Procedure("Create a RAM user", "ram.md", (
        step("1", "Log on to the RAM console.", M("product", "RAM console")),
        step("2", "In the left-side navigation pane, choose Identities > Users.",
             M("menu", "Identities > Users")),
        step("3", "On the Users page, click Create User.", M("page", "Users"),
             M("control", "Create User")),
        step("4", f"Set Logon Name to `{name}` and Display Name to `Deploy Bot`.",
             M("field", "Logon Name", name), M("field", "Display Name", "Deploy Bot")),
        step("5", "Click Create.", M("control", "Create")),
    ), product="ram")


def vpc_create(cidr: str = "10.0.0.0/8") -> Procedure:
    return Procedure("Create a VPC", "vpc.md", (
        step("1", "Log on to the VPC console.", M("product", "VPC console")),
        step("2", "In the left-side navigation pane, click VPCs.", M("menu", "VPCs")),
        step("3", "Click Create VPC.", M("control", "Create VPC")),
        step("4", "Enter a name for the VPC.", M("field", "VPC Name")),
        step("5", f"Set IPv4 CIDR Block to `{cidr}`.", M("field", "IPv4 CIDR Block", cidr)),
        step("6", "Click Create.", M("control", "Create")),
    ), product="vpc")


def ecs_add_rule() -> Procedure:
    return Procedure("Add an inbound rule to a security group", "ecs.md", (
        step("1", "Log on to the ECS console.", M("product", "ECS console")),
        step("2", "In the left-side navigation pane, choose Network & Security > Security "
                  "Groups.", M("menu", "Network & Security > Security Groups")),
        step("3", "Find the security group and click Manage Rules in the Actions column.",
             M("control", "Manage Rules")),
        step("4", "On the Inbound tab, click Add Rule.", M("control", "Inbound"),
             M("control", "Add Rule")),
        step("5", "Select Allow, select Custom TCP from the Protocol list, set Port Range to "
                  "`22/22` and Authorization Object to `10.0.0.0/8`.",
             M("option", "Allow", field="Action"), M("option", "Custom TCP", field="Protocol"),
             M("field", "Port Range", "22/22"), M("field", "Authorization Object", "10.0.0.0/8")),
        step("6", "Click Save.", M("control", "Save")),
    ), product="ecs", prerequisites=("A security group exists in a VPC.",))


def oss_set_acl() -> Procedure:
    return Procedure("Change the ACL of a bucket", "oss.md", (
        step("1", "Log on to the OSS console.", M("product", "OSS console")),
        step("2", "In the left-side navigation pane, click Buckets.", M("menu", "Buckets")),
        step("3", "Find the bucket and click Change ACL.", M("control", "Change ACL")),
        step("4", "Select Public Read from the ACL list.",
             M("option", "Public Read", field="ACL")),
        step("5", "Click Save.", M("control", "Save")),
    ), product="oss")


def ecs_stop_instance() -> Procedure:
    return Procedure("Stop an instance", "ecs.md", (
        step("1", "In the left-side navigation pane, choose Instances & Images > Instances.",
             M("menu", "Instances & Images > Instances")),
        step("2", "Find the instance and click Stop in the Actions column.",
             M("control", "Stop")),
        step("3", "In the message that appears, click OK.", M("control", "OK")),
    ), product="ecs")


def no_operation() -> Procedure:
    return Procedure("View your RAM users", "ram.md", (
        step("1", "Log on to the RAM console.", M("product", "RAM console")),
        step("2", "In the left-side navigation pane, choose Identities > Users.",
             M("menu", "Identities > Users")),
        step("3", "Read the Logon Name column.", M("field", "Logon Name")),
    ), product="ram")


def ok_checks(proc: Procedure, pages: dict[str, str]) -> tuple[StepCheck, ...]:
    """A static check that found every step ``ok``, landing on ``pages[number]``."""
    here = ""
    out = []
    for s in proc.steps:
        here = pages.get(s.number, here)
        out.append(StepCheck(s.number, "ok", page=here))
    return tuple(out)


class FakeChat:
    """A loopback HTTP server answering /v1/chat/completions with the next canned reply."""

    def __init__(self, replies: list[str]):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):   # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if not outer.replies:
                    self.send_response(503)
                    self.end_headers()
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant",
                                                            "content": outer.replies.pop(0)}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.client = OpenAIChatClient(f"http://127.0.0.1:{self.server.server_port}", "fake",
                                       api_key_env=None, timeout_s=5)

    def close(self) -> None:
        self.client.close()
        self.server.shutdown()
        self.server.server_close()


# ---- a procedure in prose only a model can structure, and a canned draft of it
PROSE = Procedure("Give a teammate console access", "ram.md", (
    DocStep("1", "Teammates who need the console get their own identity: in RAM, under the "
                 "users list, add one whose logon name is up to you.", structured=False),
    DocStep("2", "Confirm, and share the logon name with them.", structured=False),
), product="ram")

GOOD = {
    "product": "ram", "start_page": "/console/ram/users",
    "parameters": {"user_name": "mate-{episode}"},
    "success": {"required_events": [{"id": "op", "event": "CreateUser", "service": "Ram",
                                     "where": {"requestParameters.UserName": "{user_name}"}}],
                "forbidden_events": [{"event": "DeleteUser", "service": "Ram", "where": {
                    "requestParameters.UserName": "{user_name}"}}]},
    "hints": {"1": "(Use `{user_name}` as the logon name.)"},
    "oracle": None,
}


def fenced(data: dict) -> str:
    return f"Here is the draft.\n```json\n{json.dumps(data)}\n```\n"
