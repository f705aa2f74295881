"""The oracle agent: a scripted policy that completes a task through the env worker's action
space (reading bids from observations, sending action strings), following the session's UI
drift, and reporting tasks whose documented procedure is wrong as infeasible once it has seen
the page that lacks what the procedure names (or the console's refusal of the documented
values). It is the upper bound in evaluation and the teacher for SFT trajectories.

Each task names its oracle ``family`` and ``args`` (``{placeholders}`` filled per episode);
a family is a plan (a list of :class:`Op`, data) that :func:`execute` runs op after op over
:class:`OracleDriver`, and that the state-aware teacher reads against any page.
"""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

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


# ---- plans -----------------------------------------------------------------------------------
# A family is a plan: a list of :class:`Op` built from the task's filled args. The oracle runs a
# plan op after op (:func:`execute`); the state-aware teacher (:mod:`datagen.teacher`)
# reads the same plan against whatever page a student reached and picks the op to do next. Verbs
# (labels are the documentation's; the driver follows the session's drift):
#   press LABEL          click a button or link (through a More menu when the drift hid it)
#   row ROW|ACTION       click an action in the table row that contains ROW
#   link NAME            click a link, or the name link of a table row
#   field LABEL|VALUE    fill a textbox (going to the next wizard step when it is not shown yet)
#   select LABEL|OPTION  choose an option of a select (ditto)
#   pick LABEL|NEEDLE|M  choose the select's option that contains NEEDLE; M "reveal": go to the
#                        wizard step that shows the select, "" : only when this page shows it
#   choose OPTION        pick a radio option (ditto for wizards)
#   reveal ROLE|NAME     go to the next wizard step until that control shows
#   tab WORD             open the tab whose name contains WORD (when there is one)
#   last_link LABEL      click the last link of that label (a page with one per tab)
#   submit LABEL         click the form's submit button (ditto for wizards)
#   confirm ID           finish a confirmation dialog (typing ID when the drift asks for it)
#   absent NAMES         (wrong documentation) none of the '|'-separated names is on the page
#   offered FIELD|OPTION (wrong documentation) FIELD is a select or radio group without OPTION
#   refused CODE         (wrong documentation) the page shows the console's error CODE


@dataclass(frozen=True)
class Op:
    verb: str
    args: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.verb}:{'|'.join(self.args)}"


def op(verb: str, *args: str) -> Op:
    return Op(verb, tuple(args))


# Ops that set a value on a form (done when the page shows the value), ops that only check the
# page, and the rest: actions (a click that changes the page or the cloud).
VALUE_VERBS = frozenset({"field", "select", "pick", "choose", "reveal", "tab"})
CHECK_VERBS = frozenset({"absent", "offered", "refused"})

Plan = list[Op]
PlanFn = Callable[[Mapping[str, str]], Plan]
PLANS: dict[str, PlanFn] = {}
Family = Callable[["OracleDriver", Mapping[str, str]], Awaitable[None]]
FAMILIES: dict[str, Family] = {}


def family(name: str) -> Callable[[PlanFn], PlanFn]:
    """Register a plan; ``FAMILIES[name]`` runs it on a driver, op after op."""
    def register(fn: PlanFn) -> PlanFn:
        PLANS[name] = fn

        async def run(d: OracleDriver, a: Mapping[str, str]) -> None:
            for o in fn(a):
                await execute(d, o)
        FAMILIES[name] = run
        return fn
    return register


def _opt(cond: object, *ops: Op) -> Plan:
    return list(ops) if cond else []


# ---- RAM ------------------------------------------------------------------------------------
@family("ram_create_user")
def _ram_create_user(a: Mapping[str, str]) -> Plan:
    return [op("press", "Create User"), op("field", "Logon Name", a["user_name"]),
            *_opt(a.get("display_name"), op("field", "Display Name", a.get("display_name", ""))),
            op("submit", "Create")]


@family("ram_grant_policy")
def _ram_grant(a: Mapping[str, str]) -> Plan:
    return [op("row", a["user_name"], "Add Permissions"), op("choose", a["policy"]),
            op("submit", "OK")]


@family("ram_onboard_user")
def _ram_onboard(a: Mapping[str, str]) -> Plan:
    return [*_ram_create_user(a),           # lands on the new user's page
            op("press", "Add Permissions"), op("choose", a["policy"]), op("submit", "OK")]


@family("ram_revoke_policy")
def _ram_revoke(a: Mapping[str, str]) -> Plan:
    return [op("row", a["user_name"], "Manage"), op("row", a["policy"], "Remove"),
            op("confirm", a["policy"])]


@family("ram_delete_user")
def _ram_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["user_name"], "Delete"), op("confirm", a["user_name"])]


# ---- OSS ------------------------------------------------------------------------------------
@family("oss_create_bucket")
def _oss_create(a: Mapping[str, str]) -> Plan:
    return [op("press", "Create Bucket"), op("field", "Bucket Name", a["bucket"]),
            *_opt(a.get("storage_class"), op("choose", a.get("storage_class", ""))),
            *_opt(a.get("acl"), op("choose", a.get("acl", ""))),
            op("submit", "OK")]


@family("oss_set_acl")
def _oss_acl(a: Mapping[str, str]) -> Plan:
    return [op("row", a["bucket"], "Change ACL"), op("choose", a["acl"]), op("submit", "Save")]


@family("oss_delete_bucket")
def _oss_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["bucket"], "Delete"), op("confirm", a["bucket"])]


# ---- VPC ------------------------------------------------------------------------------------
@family("vpc_create_vpc")
def _vpc_create(a: Mapping[str, str]) -> Plan:
    return [op("press", "Create VPC"), op("field", "VPC Name", a["name"]),
            op("field", "IPv4 CIDR Block", a["cidr"]), op("submit", "Create")]


@family("vpc_create_vswitch")
def _vsw_create(a: Mapping[str, str]) -> Plan:
    return [op("row", a["vpc"], "Create vSwitch"), op("field", "vSwitch Name", a["name"]),
            op("select", "Zone", a["zone"]), op("field", "IPv4 CIDR Block", a["cidr"]),
            op("submit", "Create")]


@family("vpc_delete_vswitch")
def _vsw_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["vswitch"], "Delete"), op("confirm", a["vswitch"])]


@family("vpc_delete_vpc")
def _vpc_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["vpc"], "Delete"), op("confirm", a["vpc"])]


# ---- ECS ------------------------------------------------------------------------------------
@family("ecs_create_sg")
def _sg_create(a: Mapping[str, str]) -> Plan:
    return [op("press", "Create Security Group"), op("field", "Security Group Name", a["name"]),
            op("pick", "Network (VPC)", a["vpc"], ""),
            *_opt(a.get("group_type") == "enterprise", op("choose", "Advanced Security Group")),
            op("submit", "Create")]


@family("ecs_create_sg_with_rule")
def _sg_create_with_rule(a: Mapping[str, str]) -> Plan:
    return [*_sg_create(a), *_rule_form(a)]  # lands on the new group's page (Inbound rules)


@family("ecs_add_rule")
def _rule_add(a: Mapping[str, str]) -> Plan:
    return [op("row", a["sg"], "Manage Rules"), *_rule_form(a)]


def _rule_form(a: Mapping[str, str]) -> Plan:
    if a.get("direction") == "egress":
        opening = [op("tab", "Outbound"), op("last_link", "Add Rule")]
    else:
        opening = [op("press", "Add Rule")]
    return [*opening, *_opt(a.get("policy") == "drop", op("choose", "Deny")),
            op("select", "Protocol", a.get("protocol_label", "Custom TCP")),
            *_opt(a.get("port"), op("field", "Port Range", a.get("port", ""))),
            op("field", "Authorization Object", a["cidr"]), op("submit", "Save")]


@family("ecs_delete_rule")
def _rule_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["sg"], "Manage Rules"), op("row", a["port"], "Delete"),
            op("confirm", "")]


@family("ecs_delete_sg")
def _sg_delete(a: Mapping[str, str]) -> Plan:
    return [op("row", a["sg"], "Delete"), op("confirm", a["sg"])]


@family("ecs_instance_op")
def _instance_op(a: Mapping[str, str]) -> Plan:
    return [op("row", a["instance"], a["op"]),
            *_opt(a["op"] != "Start", op("confirm", a["instance"]))]


@family("ecs_rename_instance")
def _instance_rename(a: Mapping[str, str]) -> Plan:
    return [op("row", a["instance"], "Manage"), op("press", "Rename"),
            op("field", "Instance Name", a["new_name"]), op("submit", "Save")]


@family("ecs_create_instance")
def _instance_create(a: Mapping[str, str]) -> Plan:
    return [op("press", "Create Instance"), op("choose", a["instance_type"]),
            op("choose", a["image"]), op("pick", "VPC", a["vpc"], "reveal"),
            op("pick", "vSwitch", a["vswitch"], "reveal"),
            op("pick", "Security Group", a["sg"], "reveal"),
            op("field", "Instance Name", a["name"]), op("submit", "Create Instance")]


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
#           ('|'-separated), in the plan verbs above: link, row, press, field, select, choose,
#           submit, confirm, reveal. Labels are the documentation's; the driver follows the
#           session's drift.
#   absent  (missing, field) '|'-separated names the procedure writes that the page reached
#           must not show (case-insensitive).
#   option, field (option) the documented choice and the select or radio group it should be in.
#   code    (refused) the error code the console must show after the last step.
# run_oracle then reports the task's infeasible_reason (which names the missing thing as the
# procedure writes it, or quotes the code).
WALK_VERBS = frozenset({"link", "row", "press", "field", "select", "choose", "submit",
                        "confirm", "reveal"})


def _walk(steps: str) -> Plan:
    plan = []
    for step in (s.strip() for s in steps.split(";")):
        if not step:
            continue
        verb, _, rest = step.partition(":")
        if verb not in WALK_VERBS:
            raise DriverError(f"unknown wrong-doc oracle step {step!r}")
        plan.append(Op(verb, tuple(o.strip() for o in rest.split("|"))))
    return plan


@family("wrongdoc_missing")
@family("wrongdoc_field")
def _wrongdoc_missing(a: Mapping[str, str]) -> Plan:
    """A button, tab, menu entry or form field the console does not have."""
    return [*_walk(a.get("steps", "")), op("absent", a["absent"])]


@family("wrongdoc_option")
def _wrongdoc_option(a: Mapping[str, str]) -> Plan:
    """A choice the form's select or radio group does not offer: open the form, read its
    options."""
    return [*_walk(a.get("steps", "")), op("offered", a["field"], a["option"])]


@family("wrongdoc_refused")
def _wrongdoc_refused(a: Mapping[str, str]) -> Plan:
    """A step the console refuses: the documented values are sent, the page shows the
    error."""
    return [*_walk(a.get("steps", "")), op("refused", a["code"])]


def _shown(observation: Observation, name: str) -> bool:
    text = f"{observation.text}\n{observation.last_action_error}".lower()
    return name.lower() in text


def check_failure(o: Op, d: "OracleDriver") -> str:
    """Why the page contradicts the check op ``o`` ("" when it holds)."""
    obs = d.observation
    if o.verb == "absent":
        shown = [n for n in (n.strip() for n in o.args[0].split("|")) if n and _shown(obs, n)]
        return (f"{', '.join(map(repr, shown))} is on {obs.url}: the documentation is not "
                "wrong there") if shown else ""
    if o.verb == "offered":
        field_, option = d.t(o.args[0]), o.args[1]
        if find_bid(obs.text, "combobox", field_) is None and \
                not re.search(r'\] radio "', obs.text):
            return f"no {field_!r} select or radio group on {obs.url}"
        if d.has("radio", option) or _shown(obs, option):
            return f"{option!r} is offered on {obs.url}"
        return ""
    if o.verb == "refused":
        return "" if _shown(obs, o.args[0]) else (
            f"the console did not answer {o.args[0]} on {obs.url}:\n{obs.text[:2000]}")
    raise ValueError(f"not a check op: {o}")


async def execute(d: "OracleDriver", o: Op) -> None:
    """Do one op of a plan on the page the driver is on (the oracle's sequential run)."""
    v, a = o.verb, o.args
    if v == "press":
        await d.press(a[0])
    elif v == "row":
        await d.row(a[0], a[1])
    elif v == "link":                   # a link on the page, or a table row's name link
        if d.has("link", a[0]):
            await d.click("link", a[0])
        else:
            await d.click_in_row(a[0], a[0])
    elif v == "field":
        await d.field(a[0], a[1])
    elif v == "select":
        await d.field(a[0], a[1], role="combobox")
    elif v == "choose":
        await d.choose(a[0])
    elif v == "submit":
        await d.submit(a[0])
    elif v == "confirm":
        await d.confirm(a[0])
    elif v == "reveal":
        for _ in range(6):
            if d.has(a[0], a[1]):
                break
            await d.click("button", d.t("Next"))
        else:
            raise DriverError(f"no {a[0]} {a[1]!r} on {d.observation.url}")
    elif v == "pick":
        label = d.t(a[0])
        bid = find_bid(d.observation.text, "combobox", label)
        if a[2] == "reveal":
            for _ in range(6):
                if bid is not None:
                    break
                await d.click("button", d.t("Next"))
                bid = find_bid(d.observation.text, "combobox", label)
        if bid is not None:
            option = _option_containing(d.observation.text, label, a[1])
            await d.act(f'select({bid}, "{option}")')
        elif a[2] == "reveal":
            raise DriverError(f"no select {label!r} on {d.observation.url}")
    elif v == "tab":
        m = re.search(rf'\[(\d+)\] tab "[^"]*{re.escape(a[0])}', d.observation.text)
        if m:
            await d.act(f"click({m[1]})")
    elif v == "last_link":
        bids = re.findall(rf'\[(\d+)\] link "{re.escape(d.t(a[0]))}"', d.observation.text)
        if not bids:
            raise DriverError(f"no link {d.t(a[0])!r} on {d.observation.url}")
        await d.act(f"click({bids[-1]})")
    elif v in CHECK_VERBS:
        why = check_failure(o, d)
        if why:
            raise DriverError(why)
    else:
        raise DriverError(f"unknown plan op {o}")


def plan_of(task: Task, values: Mapping[str, str]) -> Plan:
    """The filled plan of ``task`` (empty for a wrong-doc task without a family: it reports
    from the start page)."""
    if task.expected == "infeasible" and not task.oracle_family:
        return []
    build = PLANS.get(task.oracle_family)
    if build is None:
        raise DriverError(f"task {task.id}: no oracle family {task.oracle_family!r}; known: "
                          f"{', '.join(sorted(PLANS))}")
    return build({k: fill(v, values) for k, v in task.oracle_args})


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
    for o in plan_of(task, values):
        await execute(driver, o)
    if task.expected == "infeasible":
        return await _report(driver, task)
    return await driver.act('stop("done")')


async def _report(driver: OracleDriver, task: Task) -> StepResult:
    reason = task.infeasible_reason.replace('"', "'").replace("\\", "/")[:500]
    return await driver.act(f'report_infeasible("{reason}")')
