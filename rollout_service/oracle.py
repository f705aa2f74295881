"""The oracle agent: a scripted policy that completes a task through the env worker's action
space (reading bids from observations, sending action strings), following the session's UI
drift, and reporting tasks whose documented procedure is wrong as infeasible once it has seen
the page that lacks what the procedure names (or the console's refusal of the documented
values). It is the upper bound in evaluation and the teacher for SFT trajectories.

Each task names its oracle ``family`` and ``args`` (``{placeholders}`` filled per episode);
a family is a short async script over :class:`OracleDriver`.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping

from consolerl.types import Observation, StepResult
from env_workers.driver import DriverError, ScriptedDriver, StepFn, find_bid, find_in_row
from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift

from consolerl.resources import fill
from consolerl.tasks import Task


class OracleDriver(ScriptedDriver):
    """A scripted driver that knows the drifted UI: renamed labels, More menus, typed
    confirmations and two-step forms."""

    def __init__(self, step_fn: StepFn, observation: Observation, drift: Drift):
        super().__init__(step_fn, observation)
        self.drift = drift

    def t(self, label: str) -> str:
        return self.drift.label(label)

    def has(self, role: str, name: str) -> bool:
        return find_bid(self.observation.text, role, name) is not None

    async def press(self, name: str) -> StepResult:
        """Click a button or link by its (drift-renamed) label, opening a More menu if the
        action hides there."""
        label = self.t(name)
        for role in ("button", "link", "menuitem"):
            if self.has(role, label):
                return await self.click(role, label)
        if "more_menu" in self.drift and self.has("button", "More"):
            await self.click("button", "More")
            if self.has("menuitem", label):
                return await self.click("menuitem", label)
        raise DriverError(f"no button or link {label!r} on {self.observation.url}")

    async def row(self, row_text: str, name: str) -> StepResult:
        """Click a row's action (via its More menu when the drift put it there)."""
        label = self.t(name)
        bid = find_in_row(self.observation.text, row_text, label)
        if bid is None and "more_menu" in self.drift:
            more = find_in_row(self.observation.text, row_text, "More")
            if more is not None:
                await self.act(f"click({more})")
                # The opened menu is part of the row: its items show inline there.
                bid = find_in_row(self.observation.text, row_text, label)
        if bid is None:
            raise DriverError(f"no {label!r} in the row of {row_text!r}")
        return await self.act(f"click({bid})")

    async def field(self, name: str, value: str, role: str = "textbox") -> StepResult:
        """Fill a form field, going to the next wizard step when it is not shown yet."""
        label = self.t(name)
        for _ in range(6):
            if self.has(role, label):
                if role == "combobox":
                    return await self.select(label, value)
                return await self.fill(label, value, role=role)
            if not self.has("button", self.t("Next")):
                break
            await self.click("button", self.t("Next"))
        raise DriverError(f"no field {label!r} on {self.observation.url}")

    async def choose(self, option: str) -> StepResult:
        """Pick a radio option, going to the next wizard step when needed."""
        for _ in range(6):
            if self.has("radio", option):
                return await self.click("radio", option)
            if not self.has("button", self.t("Next")):
                break
            await self.click("button", self.t("Next"))
        raise DriverError(f"no option {option!r} on {self.observation.url}")

    async def submit(self, name: str) -> StepResult:
        label = self.t(name)
        for _ in range(6):
            if self.has("button", label):
                return await self.click("button", label)
            if not self.has("button", self.t("Next")):
                break
            await self.click("button", self.t("Next"))
        raise DriverError(f"no submit button {label!r} on {self.observation.url}")

    async def confirm(self, resource_id: str) -> StepResult:
        """Finish the confirmation dialog (typing the id when the drift asks for it)."""
        m = re.search(r'\[(\d+)\] textbox "To confirm, type[^"]*"', self.observation.text)
        if m:
            await self.act(f'fill({m[1]}, "{resource_id}")')
        return await self.click("button", self.t("OK"))


Family = Callable[[OracleDriver, Mapping[str, str]], Awaitable[None]]
FAMILIES: dict[str, Family] = {}


def family(name: str) -> Callable[[Family], Family]:
    def register(fn: Family) -> Family:
        FAMILIES[name] = fn
        return fn
    return register


# ---- RAM ------------------------------------------------------------------------------------
@family("ram_create_user")
async def _ram_create_user(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.press("Create User")
    await d.field("Logon Name", a["user_name"])
    if a.get("display_name"):
        await d.field("Display Name", a["display_name"])
    await d.submit("Create")


@family("ram_grant_policy")
async def _ram_grant(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["user_name"], "Add Permissions")
    await d.choose(a["policy"])
    await d.submit("OK")


@family("ram_onboard_user")
async def _ram_onboard(d: OracleDriver, a: Mapping[str, str]) -> None:
    await _ram_create_user(d, a)            # lands on the new user's page
    await d.press("Add Permissions")
    await d.choose(a["policy"])
    await d.submit("OK")


@family("ram_revoke_policy")
async def _ram_revoke(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["user_name"], "Manage")
    await d.row(a["policy"], "Remove")
    await d.confirm(a["policy"])


@family("ram_delete_user")
async def _ram_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["user_name"], "Delete")
    await d.confirm(a["user_name"])


# ---- OSS ------------------------------------------------------------------------------------
@family("oss_create_bucket")
async def _oss_create(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.press("Create Bucket")
    await d.field("Bucket Name", a["bucket"])
    if a.get("storage_class"):
        await d.choose(a["storage_class"])
    if a.get("acl"):
        await d.choose(a["acl"])
    await d.submit("OK")


@family("oss_set_acl")
async def _oss_acl(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["bucket"], "Change ACL")
    await d.choose(a["acl"])
    await d.submit("Save")


@family("oss_delete_bucket")
async def _oss_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["bucket"], "Delete")
    await d.confirm(a["bucket"])


# ---- VPC ------------------------------------------------------------------------------------
@family("vpc_create_vpc")
async def _vpc_create(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.press("Create VPC")
    await d.field("VPC Name", a["name"])
    await d.field("IPv4 CIDR Block", a["cidr"])
    await d.submit("Create")


@family("vpc_create_vswitch")
async def _vsw_create(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["vpc"], "Create vSwitch")
    await d.field("vSwitch Name", a["name"])
    await d.field("Zone", a["zone"], role="combobox")
    await d.field("IPv4 CIDR Block", a["cidr"])
    await d.submit("Create")


@family("vpc_delete_vswitch")
async def _vsw_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["vswitch"], "Delete")
    await d.confirm(a["vswitch"])


@family("vpc_delete_vpc")
async def _vpc_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["vpc"], "Delete")
    await d.confirm(a["vpc"])


# ---- ECS ------------------------------------------------------------------------------------
@family("ecs_create_sg")
async def _sg_create(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.press("Create Security Group")
    await d.field("Security Group Name", a["name"])
    vpc_bid = find_bid(d.observation.text, "combobox", "Network (VPC)")
    if vpc_bid is not None:
        option = _option_containing(d.observation.text, "Network (VPC)", a["vpc"])
        await d.act(f'select({vpc_bid}, "{option}")')
    if a.get("group_type") == "enterprise":
        await d.choose("Advanced Security Group")
    await d.submit("Create")


@family("ecs_create_sg_with_rule")
async def _sg_create_with_rule(d: OracleDriver, a: Mapping[str, str]) -> None:
    await _sg_create(d, a)                  # lands on the new group's page (Inbound rules)
    await _rule_form(d, a)


@family("ecs_add_rule")
async def _rule_add(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["sg"], "Manage Rules")
    await _rule_form(d, a)


async def _rule_form(d: OracleDriver, a: Mapping[str, str]) -> None:
    if a.get("direction") == "egress":
        m = re.search(r'\[(\d+)\] tab "[^"]*Outbound', d.observation.text)
        if m:
            await d.act(f"click({m[1]})")
        bids = re.findall(rf'\[(\d+)\] link "{re.escape(d.t("Add Rule"))}"', d.observation.text)
        await d.act(f"click({bids[-1]})")
    else:
        await d.press("Add Rule")
    if a.get("policy") == "drop":
        await d.choose("Deny")
    await d.field("Protocol", a.get("protocol_label", "Custom TCP"), role="combobox")
    if a.get("port"):
        await d.field("Port Range", a["port"])
    await d.field("Authorization Object", a["cidr"])
    await d.submit("Save")


@family("ecs_delete_rule")
async def _rule_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["sg"], "Manage Rules")
    await d.row(a["port"], "Delete")
    await d.confirm("")


@family("ecs_delete_sg")
async def _sg_delete(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["sg"], "Delete")
    await d.confirm(a["sg"])


@family("ecs_instance_op")
async def _instance_op(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["instance"], a["op"])
    if a["op"] != "Start":
        await d.confirm(a["instance"])


@family("ecs_rename_instance")
async def _instance_rename(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.row(a["instance"], "Manage")
    await d.press("Rename")
    await d.field("Instance Name", a["new_name"])
    await d.submit("Save")


@family("ecs_create_instance")
async def _instance_create(d: OracleDriver, a: Mapping[str, str]) -> None:
    await d.press("Create Instance")
    await d.choose(a["instance_type"])
    await d.choose(a["image"])
    for label, value in (("VPC", a["vpc"]), ("vSwitch", a["vswitch"]),
                         ("Security Group", a["sg"])):
        for _ in range(6):
            bid = find_bid(d.observation.text, "combobox", d.t(label))
            if bid is not None:
                break
            await d.click("button", d.t("Next"))
        option = _option_containing(d.observation.text, d.t(label), value)
        await d.act(f'select({bid}, "{option}")')
    await d.field("Instance Name", a["name"])
    await d.submit("Create Instance")


def _option_containing(text: str, combobox: str, needle: str) -> str:
    m = re.search(rf'\] combobox "{re.escape(combobox)}"[^:]*: (.*)$', text, re.M)
    if m:
        for option in m[1].split(" | "):
            if needle in option:
                return option.rstrip("*")
    raise DriverError(f"no option with {needle!r} in {combobox!r}")


# ---- wrong documentation --------------------------------------------------------------------
# A wrong-documentation task's oracle follows the documented steps as far as the console
# allows, so that it has seen the page where the documented thing should be (or the console's
# error for a refused step), checks that the page really lacks it, and only then reports. Its
# args (data in the task's YAML):
#   steps   documented steps as far as the console allows, ';'-separated, each verb:operands
#           ('|'-separated): link:NAME (click a link or a row's name), row:ROW TEXT|ACTION, press:LABEL,
#           field:LABEL|VALUE, select:LABEL|OPTION, choose:OPTION (a radio), submit:LABEL,
#           confirm:ID (finish a confirmation dialog), reveal:ROLE|NAME (go to the next wizard
#           step until that control shows). Labels are the documentation's; the driver
#           follows the session's drift.
#   absent  (missing, field) '|'-separated names the procedure writes that the page reached
#           must not show (case-insensitive).
#   option, field (option) the documented choice and the select or radio group it should be in.
#   code    (refused) the error code the console must show after the last step.
# run_oracle then reports the task's infeasible_reason (which names the missing thing as the
# procedure writes it, or quotes the code).

async def _walk(d: OracleDriver, steps: str) -> None:
    for step in (s.strip() for s in steps.split(";")):
        if not step:
            continue
        verb, _, rest = step.partition(":")
        ops = [o.strip() for o in rest.split("|")]
        if verb == "link":                # a link on the page, or a table row's name link
            if d.has("link", ops[0]):
                await d.click("link", ops[0])
            else:
                await d.click_in_row(ops[0], ops[0])
        elif verb == "row":
            await d.row(ops[0], ops[1])
        elif verb == "press":
            await d.press(ops[0])
        elif verb == "field":
            await d.field(ops[0], ops[1])
        elif verb == "select":
            await d.field(ops[0], ops[1], role="combobox")
        elif verb == "choose":
            await d.choose(ops[0])
        elif verb == "submit":
            await d.submit(ops[0])
        elif verb == "confirm":
            await d.confirm(ops[0])
        elif verb == "reveal":
            for _ in range(6):
                if d.has(ops[0], ops[1]):
                    break
                await d.click("button", d.t("Next"))
            else:
                raise DriverError(f"no {ops[0]} {ops[1]!r} on {d.observation.url}")
        else:
            raise DriverError(f"unknown wrong-doc oracle step {step!r}")


def _shown(d: OracleDriver, name: str) -> bool:
    text = f"{d.observation.text}\n{d.observation.last_action_error}".lower()
    return name.lower() in text


@family("wrongdoc_missing")
@family("wrongdoc_field")
async def _wrongdoc_missing(d: OracleDriver, a: Mapping[str, str]) -> None:
    """A button, tab, menu entry or form field the console does not have."""
    await _walk(d, a.get("steps", ""))
    names = [n.strip() for n in a["absent"].split("|") if n.strip()]
    shown = [n for n in names if _shown(d, n)]
    if shown:
        raise DriverError(f"{', '.join(map(repr, shown))} is on {d.observation.url}: the "
                          "documentation is not wrong there")


@family("wrongdoc_option")
async def _wrongdoc_option(d: OracleDriver, a: Mapping[str, str]) -> None:
    """A choice the form's select or radio group does not offer: open the form, read its
    options."""
    await _walk(d, a.get("steps", ""))
    text = d.observation.text
    field = d.t(a["field"])
    has_select = find_bid(text, "combobox", field) is not None
    if not has_select and not re.search(r'\] radio "', text):
        raise DriverError(f"no {field!r} select or radio group on {d.observation.url}")
    if d.has("radio", a["option"]) or _shown(d, a["option"]):
        raise DriverError(f"{a['option']!r} is offered on {d.observation.url}")


@family("wrongdoc_refused")
async def _wrongdoc_refused(d: OracleDriver, a: Mapping[str, str]) -> None:
    """A step the console refuses: the documented values are sent, the page shows the
    error."""
    await _walk(d, a.get("steps", ""))
    if not _shown(d, a["code"]):
        raise DriverError(f"the console did not answer {a['code']} on {d.observation.url}:\n"
                          f"{d.observation.text[:2000]}")


# ---- running it -----------------------------------------------------------------------------
# The most steps an oracle episode takes: its scripts need what their flow needs (a wizard
# with a More menu and a typed confirmation runs to about 20), whatever a job's sampling says.
ORACLE_MAX_STEPS = 40


def why_no_oracle(task: Task) -> str:
    """Why the oracle cannot do ``task`` ("" when it can): a task it has no script for."""
    if task.expected == "infeasible" and not task.oracle_family:
        return ""                       # it reports the known defect from the start page
    if not task.oracle_family:
        return f"task {task.id} has no oracle family"
    if task.oracle_family not in FAMILIES:
        return f"task {task.id}: no oracle family {task.oracle_family!r}"
    return ""


async def run_oracle(task: Task, values: Mapping[str, str], step_fn: StepFn,
                     observation: Observation) -> StepResult:
    """Solve ``task`` from ``observation``; ends the episode with stop() or
    report_infeasible(). Raises :class:`DriverError` when the scripted flow cannot go on."""
    driver = OracleDriver(step_fn, observation, Drift(parse_drift(task.drift)))
    if task.expected == "infeasible" and not task.oracle_family:
        return await _report(driver, task)      # nothing to follow: report from the start page
    script = FAMILIES.get(task.oracle_family)
    if script is None:
        raise DriverError(f"task {task.id}: no oracle family {task.oracle_family!r}; known: "
                          f"{', '.join(sorted(FAMILIES))}")
    args = {k: fill(v, values) for k, v in task.oracle_args}
    await script(driver, args)
    if task.expected == "infeasible":
        return await _report(driver, task)
    return await driver.act('stop("done")')


async def _report(driver: OracleDriver, task: Task) -> StepResult:
    reason = task.infeasible_reason.replace('"', "'").replace("\\", "/")[:500]
    return await driver.act(f'report_infeasible("{reason}")')
