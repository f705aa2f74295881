"""The oracle agent: a scripted policy that completes a task through the env worker's action
space (reading bids from observations, sending action strings), following the session's UI
drift, and reporting tasks whose documented procedure is wrong as infeasible once it has seen
the page that lacks what the procedure names (or the console's refusal of the documented
values). It is the upper bound in evaluation and the teacher for SFT trajectories.

Each task names its oracle ``family`` and ``args`` (``{placeholders}`` filled per episode);
a family is a plan (a list of :class:`~datagen.plan.Op`, data) that :class:`OracleDriver` runs
op after op, and that the state-aware teacher reads against any page; both read an op on a page
with :func:`datagen.plan.resolve`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping

from consolerl.drift import Drift
from consolerl.drift import parse as parse_drift
from consolerl.resources import fill
from consolerl.tasks import Task
from consolerl.types import Observation, StepResult
from doccheck import REPLAY_CONDITIONAL
from env_workers.driver import DriverError, ScriptedDriver, StepFn, find_bid

from .plan import CHECK_VERBS, Op, Plan, check_failure, op, resolve


class OracleDriver(ScriptedDriver):
    """A scripted driver that knows the drifted UI (renamed labels, More menus, typed
    confirmations and two-step forms) and does plan ops (:meth:`execute`)."""

    def __init__(self, step_fn: StepFn, observation: Observation, drift: Drift):
        super().__init__(step_fn, observation)
        self.drift = drift

    def t(self, label: str) -> str:
        return self.drift.label(label)

    def has(self, role: str, name: str) -> bool:
        return find_bid(self.observation.text, role, name) is not None

    async def execute(self, o: Op, strict: bool = False) -> None:
        """Do op ``o`` from the page the driver is on, reading it with
        :func:`~datagen.plan.resolve` on each page reached: what prepares it (once), then the
        op's own action; on a page without its control, up to :data:`MAX_WIZARD_STEPS`
        wizard steps or the drift's More menu (once). A ``reveal`` is done once its control
        shows; a ``tab`` or a ``pick`` without "reveal" whose control is not on the page is
        skipped; a check op raises when the page contradicts it. Raises :class:`DriverError`
        when the op cannot be done. ``strict``: a tab not on the page is not skipped either
        (a replay does what the doc says, where the doc says it)."""
        if o.verb in CHECK_VERBS:
            why = check_failure(o, self.observation, self.drift)
            if why:
                raise DriverError(why)
            return
        prepared, routes = False, 0
        limit = 1 if o.verb == "press" else MAX_WIZARD_STEPS
        while True:
            r = resolve(o, self.observation, self.drift)
            if o.verb == "reveal" and r.present:
                return
            if r.prepare is not None and not prepared:
                prepared = True
                await self.act(r.prepare)
                continue
            if r.action is not None:
                await self.act(r.action)
                return
            if not r.present and (o.verb == "tab" and not strict
                                  or o.verb == "pick" and o.args[2] != "reveal"):
                return
            if r.present or r.route is None or routes >= limit:
                raise DriverError(r.missing)
            routes += 1
            await self.act(r.route)


# The most wizard steps (Next) the oracle takes towards one op's control.
MAX_WIZARD_STEPS = 6


# ---- plans -----------------------------------------------------------------------------------
# A family is a plan: a list of :class:`~datagen.plan.Op` (its verbs: :mod:`datagen.plan`) built
# from the task's filled args. The oracle runs a plan op after op (:meth:`OracleDriver.execute`);
# the state-aware teacher (:mod:`datagen.teacher`) reads the same plan against whatever page a
# student reached and picks the op to do next.
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
                await d.execute(o)
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


# ---- wrong documentation --------------------------------------------------------------------
# A wrong-documentation task's oracle follows the documented steps as far as the console
# allows, so that it has seen the page where the documented thing should be (or the console's
# error for a refused step), checks that the page really lacks it, and only then reports. Its
# args (data in the task's YAML):
#   steps   documented steps as far as the console allows, ';'-separated, each verb:operands
#           ('|'-separated), in the plan verbs (datagen.plan): link, row, press, field, select,
#           choose, submit, confirm, reveal. Labels are the documentation's; the driver follows the
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


# ---- the documentation replay ----------------------------------------------------------------
# A drafted task's replay (doccheck.replay): the procedure's steps as the static check resolved
# them, in the console's own labels, as JSON [[step, verb, *args], ...] (args: {placeholders}
# filled per episode). Its driver reads no drift renames (the labels are the console's already)
# and names the step an op it cannot do belongs to. A step number ending in
# doccheck.REPLAY_CONDITIONAL is a step of a conditional or optional part of the procedure ("If
# the instance is running, stop it first:"): when one of its ops cannot be done, the rest of
# that step is skipped.
REPLAY_VERBS = frozenset({"press", "row", "link", "last_link", "field", "select", "pick",
                          "choose", "reveal", "tab", "submit", "confirm"})


def replay_ops(plan: str, values: Mapping[str, str] | None = None) -> list[tuple[str, Op]]:
    """(step number, op) of a replay plan, its args' placeholders filled from ``values`` (when
    given); :class:`DriverError` naming what is malformed."""
    try:
        rows = json.loads(plan)
    except ValueError as exc:
        raise DriverError(f"replay plan is not JSON: {exc}") from None
    if not isinstance(rows, list):
        raise DriverError("replay plan must be a list of [step, verb, *args]")
    out = []
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) >= 2 and all(isinstance(x, str) for x in row)):
            raise DriverError(f"replay plan op {i}: expected [step, verb, *args] of strings")
        if row[1] not in REPLAY_VERBS:
            raise DriverError(f"replay plan op {i}: unknown verb {row[1]!r}; one of "
                              f"{', '.join(sorted(REPLAY_VERBS))}")
        args = tuple(row[2:]) if values is None else tuple(fill(x, values) for x in row[2:])
        out.append((row[0], Op(row[1], args)))
    return out


@family("replay")
def _replay(a: Mapping[str, str]) -> Plan:
    return [o for _, o in replay_ops(a.get("plan", "[]"))]


async def run_replay(d: OracleDriver, task: Task, values: Mapping[str, str]) -> None:
    """Carry out ``task``'s replay plan on ``d`` (see above)."""
    d.drift = Drift(d.drift.kinds - {"rename"})
    skipped = ""
    for step, o in replay_ops(dict(task.oracle_args).get("plan", "[]"), values):
        if step == skipped:
            continue
        try:
            await d.execute(o, strict=True)
        except DriverError as exc:
            if step.endswith(REPLAY_CONDITIONAL):
                skipped = step          # its condition does not hold here
                continue
            raise DriverError(f"step {step}: {exc}") from None


# A refusal that asks for a value (a required field left empty) is the replay's gap, not the
# documented values': the doc named a field the reader could not read.
_ASKS_FOR_A_VALUE = re.compile(r"MissingParameter|\bis (?:required|mandatory)\b|"
                               r"must not be empty|cannot be empty", re.IGNORECASE)


def refused_on(observation: Observation) -> str:
    """The console's error on the page (its alerts, "" when none): what a refused write
    shows (``InvalidBucketName The specified bucket is not valid.``)."""
    said: list[str] = []
    inside = None                   # the depth of the alert whose lines are being read
    for n in observation.page.lines():
        if inside is not None and n.depth <= inside:
            inside = None
        if n.role == "alert":
            said.append(n.label)
            inside = n.depth
        elif inside is not None:
            said.append(n.label)
    said = [" ".join(x.split()) for x in said if x.strip()]
    return " ".join(dict.fromkeys(said))[:300]


def plan_of(task: Task, values: Mapping[str, str]) -> Plan:
    """The filled plan of ``task`` (empty for a wrong-doc task without a family: it reports
    from the start page)."""
    if task.expected == "infeasible" and not task.oracle_family:
        return []
    if task.oracle_family == "replay":      # placeholders filled in the parsed plan
        return [o for _, o in replay_ops(dict(task.oracle_args).get("plan", "[]"), values)]
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
    if task.oracle_family == "replay":
        await run_replay(driver, task, values)
        refusal = refused_on(driver.observation)
        if refusal and _ASKS_FOR_A_VALUE.search(refusal):
            raise DriverError(f"the console asks for a value the replay did not give: "
                              f"{refusal}")
        if refusal:
            # The documented values, sent as written, refused: the replay says so, quoting
            # the console, and the evidence channel checks it against the audit log.
            reason = ("the console refused the documented values: " + refusal).replace(
                '"', "'").replace("\\", "/")[:500]
            return await driver.act(f'report_infeasible("{reason}")')
    else:
        for o in plan_of(task, values):
            await driver.execute(o)
    if task.expected == "infeasible":
        return await _report(driver, task)
    return await driver.act('stop("done")')


async def _report(driver: OracleDriver, task: Task) -> StepResult:
    reason = task.infeasible_reason.replace('"', "'").replace("\\", "/")[:500]
    return await driver.act(f'report_infeasible("{reason}")')
