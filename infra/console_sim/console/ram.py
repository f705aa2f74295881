"""RAM console pages: users (list, create, detail with permissions, grant and revoke a system
policy, delete). RAM is global: the top bar shows no region."""
from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..catalog import SYSTEM_POLICIES
from .core import ConsoleApp, Page, ProductNav
from .ui import Button, Column, Field, FormSpec, Option, Section, Step

NAV = ProductNav("ram", "Resource Access Management", "RAM", (
    ("Users", "/console/ram/users", "Identities"),
), regional=False)
USERS = "/console/ram/users"


def _user_row(u: dict[str, Any]) -> dict[str, Any]:
    return {**u, "_href": f"{USERS}/{u['UserName']}"}


def _user_buttons(row: dict[str, Any], with_manage: bool) -> list[Button]:
    name = row["UserName"]
    buttons = [Button("Manage", href=row["_href"])] if with_manage else []
    return buttons + [
        Button("Add Permissions", href=f"{USERS}/{name}/grant"),
        Button("Delete", post=f"{USERS}/{name}/delete", danger=True, confirm_id=name,
               confirm=f"Delete user {name}? Remove its permissions first.")]


def register(console: ConsoleApp) -> None:
    console.navs.append(NAV)

    @console.route("/ram/users", name="ram_users")
    def users(page: Page) -> Response:
        rows = [_user_row(u) for u in page.read("Ram", "ListUsers", MaxItems=1000)["Users"]["User"]]
        return console.list_page(
            page, product=NAV, active=USERS, title="Users", rows=rows,
            columns=[Column("UserName", "Logon Name", "link", sub="DisplayName"),
                     Column("UserId", "User ID", "mono"), Column("Comments", "Comments"),
                     Column("CreateDate", "Created")],
            actions=lambda r: _user_buttons(r, True),
            toolbar=[Button("Create User", href=f"{USERS}/create", primary=True)],
            search=(("UserName", "Logon name"), ("DisplayName", "Display name"),
                    ("UserId", "User ID")))

    @console.route("/ram/users/create", methods=("GET", "POST"), name="ram_user_create")
    def create_user(page: Page) -> Response:
        spec = FormSpec("Create User", [Step("User Account Information", (
            Field("UserName", "Logon Name", required=True,
                  help="1 to 64 characters: letters, digits, periods (.), underscores (_) and "
                       "hyphens (-). Unique in the account."),
            Field("DisplayName", "Display Name", help="1 to 128 characters."),
            Field("Comments", "Comments", "textarea", help="At most 128 characters."),
        ))], submit="Create", cancel=USERS)
        return console.form(
            page, spec, product=NAV, active=USERS, product_name="Ram", action="CreateUser",
            done=lambda r, _v: (f"{USERS}/{r['User']['UserName']}",
                                f"User {r['User']['UserName']} created."))

    @console.route("/ram/users/{user_name}", name="ram_user")
    def user(page: Page, user_name: str) -> Response:
        u = page.read("Ram", "GetUser", UserName=user_name[:64])["User"]
        name = u["UserName"]
        policies = page.read("Ram", "ListPoliciesForUser", UserName=name)["Policies"]["Policy"]
        sections = [
            Section("User Basic Information", fields=[
                ("Logon Name", name), ("Display Name", u["DisplayName"]), ("User ID", u["UserId"]),
                ("Comments", u.get("Comments", "")), ("Created", u["CreateDate"])]),
            Section("Permissions", columns=[
                Column("PolicyName", "Policy Name", "mono"), Column("PolicyType", "Policy Type"),
                Column("Description", "Description"), Column("AttachDate", "Attached")],
                rows=policies, empty="No permissions",
                actions=[Button("Add Permissions", href=f"{USERS}/{name}/grant", primary=True)],
                row_actions=lambda p: [Button(
                    "Remove", post=f"{USERS}/{name}/policies/{p['PolicyName']}/detach",
                    params=(("PolicyType", p["PolicyType"]),), danger=True,
                    confirm=f"Remove policy {p['PolicyName']} from user {name}?")]),
        ]
        return page.render("detail.html", product=NAV, active=USERS, title=name, status="",
                           list_href=USERS, list_label="Users", sections=sections, tab="",
                           live=False, page_actions=_user_buttons(_user_row(u), False))

    @console.route("/ram/users/{user_name}/grant", methods=("GET", "POST"), name="ram_user_grant")
    def grant(page: Page, user_name: str) -> Response:
        name = page.read("Ram", "GetUser", UserName=user_name[:64])["User"]["UserName"]
        spec = FormSpec("Add Permissions", [Step("Policy", (
            Field("Principal", "Principal", "readonly", api=False, default=name),
            Field("PolicyName", "System Policy", "radio", required=True,
                  options=tuple(Option(p, p, hint=d) for p, d in SYSTEM_POLICIES.items())),
        ))], submit="OK", cancel=f"{USERS}/{name}",
            intro="Grant a system policy to the user.")
        return console.form(
            page, spec, product=NAV, active=USERS, product_name="Ram",
            action="AttachPolicyToUser", fixed={"PolicyType": "System", "UserName": name},
            done=lambda _r, v: (f"{USERS}/{name}",
                                f"Policy {v['PolicyName']} granted to {name}."))

    @console.route("/ram/users/{user_name}/policies/{policy_name}/detach", methods=("POST",),
                   name="ram_user_detach")
    def detach(page: Page, user_name: str, policy_name: str) -> Response:
        name = user_name[:64]
        return console.act(page, "Ram", "DetachPolicyFromUser",
                           {"UserName": name, "PolicyName": policy_name[:128],
                            "PolicyType": page.form.get("PolicyType", "System")[:16]},
                           back=f"{USERS}/{name}",
                           ok=f"Policy {policy_name[:128]} removed from {name}.")

    @console.route("/ram/users/{user_name}/delete", methods=("POST",), name="ram_user_delete")
    def delete(page: Page, user_name: str) -> Response:
        name = user_name[:64]
        return console.act(page, "Ram", "DeleteUser", {"UserName": name}, back=USERS,
                           ok=f"User {name} deleted.", confirm_id=name)
