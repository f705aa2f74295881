"""UI drift: a console that changed after its documentation was written.

A session's drift profile is a set of kinds, chosen by whoever signs in (``/console/signin?
drift=rename,more_menu``, or ``drift=all``); every kind is off by default. Each kind changes what
the browser sees, never what an action does, so a procedure still succeeds when it follows the
drifted UI.
"""
from __future__ import annotations

from dataclasses import dataclass

from consolerl.errors import ConfigError

KINDS: dict[str, str] = {
    "rename": "labels, buttons and menu entries carry new names (Delete is Release, ...)",
    "more_menu": "row and page actions other than the first are moved into a More menu",
    "extra_confirm": "destructive actions also need the resource ID typed into the dialog",
    "wizard": "one-page create forms become two-step wizards (Next, then the rest)",
    "nav": "the left navigation is regrouped under collapsed sections",
}

# Old label -> drifted label. Chosen to resemble renames real consoles went through.
RENAMES: dict[str, str] = {
    "Delete": "Release",
    "Create Instance": "Launch Instance",
    "Instances": "Instance List",
    "Start": "Power On",
    "Stop": "Shut Down",
    "Restart": "Reboot",
    "Rename": "Modify Name",
    "Create Security Group": "New Security Group",
    "Security Groups": "Security Group Rules Center",
    "Add Rule": "Add Security Group Rule",
    "Manage Rules": "Configure Rules",
    "Create VPC": "New VPC",
    "Create vSwitch": "New vSwitch",
    "vSwitches": "Subnets (vSwitches)",
    "Create User": "Add User",
    "Users": "Identities",
    "Add Permissions": "Grant Permission",
    "Remove": "Revoke",
    "Create Bucket": "New Bucket",
    "Buckets": "Bucket List",
    "Change ACL": "Access Control",
    "Search": "Filter",
    "Next": "Continue",
    "Previous": "Back",
    "Create": "Confirm and Create",
    "OK": "Confirm",
    "Instance Name": "Name",
    "Security Group Name": "Group Name",
    "Logon Name": "Username",
    "Bucket Name": "Bucket",
    "Save": "Apply",
}


def parse(text: str | None) -> frozenset[str]:
    """``"rename,wizard"`` or ``"all"`` (or empty) to a set of kinds; unknown kinds are an error."""
    if not text:
        return frozenset()
    wanted = {part.strip() for part in text.split(",") if part.strip()}
    if "all" in wanted:
        return frozenset(KINDS)
    unknown = sorted(wanted - set(KINDS))
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ConfigError(f"unknown drift kind(s) {', '.join(repr(u[:32]) for u in unknown[:5])}"
                          f"{more}; allowed: {', '.join(KINDS)} or all")
    return frozenset(wanted)


@dataclass(frozen=True)
class Drift:
    kinds: frozenset[str] = frozenset()

    def __contains__(self, kind: str) -> bool:
        return kind in self.kinds

    def label(self, text: str) -> str:
        return RENAMES.get(text, text) if "rename" in self.kinds else text

    def __str__(self) -> str:
        return ",".join(sorted(self.kinds))
