"""Resource META declarations: validation with errors naming file and field, ordering."""
from __future__ import annotations

import pickle

import pytest

from consolerl.errors import ConfigError
from consolerl.resources import creation_levels, fill, parse_resources

CHAIN = [
    {"id": "net", "type": "vpc", "properties": {"name": "net-{episode}"}},
    {"id": "sw", "type": "vswitch", "properties": {"vpc": "${net}", "zone": "cn-hangzhou-h",
                                                   "cidr_block": "192.168.1.0/24"}},
    {"id": "sg", "type": "security_group", "properties": {"vpc": "${net}"}},
    {"id": "ssh", "type": "security_group_rule", "properties": {"security_group": "${sg}"}},
    {"id": "vm", "type": "instance", "properties": {"vswitch": "${sw}",
                                                    "security_group": "${sg}"}},
    {"id": "dev", "type": "ram_user", "properties": {"name": "dev-{episode}",
                                                     "policies": ["ReadOnlyAccess"]}},
]


def test_a_chain_parses_with_defaults_and_orders_by_reference():
    specs = parse_resources(CHAIN, "tasks/x.yaml")
    by_id = {s.id: s for s in specs}
    assert by_id["net"].properties["cidr_block"] == "192.168.0.0/16"
    assert by_id["vm"].properties["status"] == "Running"
    assert by_id["dev"].properties["policies"] == ("ReadOnlyAccess",)
    assert by_id["vm"].refs() == {"vswitch": "sw", "security_group": "sg"}
    levels = [sorted(s.id for s in level) for level in creation_levels(specs)]
    assert levels == [["dev", "net"], ["sg", "sw"], ["ssh", "vm"]]
    assert pickle.loads(pickle.dumps(specs)) == specs


@pytest.mark.parametrize("bad,message", [
    ("not a list", "must be a list"),
    ([{"id": "x", "type": "database"}], "prerequisites[0].type: unknown type 'database'"),
    ([{"id": "X", "type": "vpc"}], "prerequisites[0].id"),
    ([{"id": "v", "type": "vpc", "extra": 1}], "unknown key"),
    ([{"id": "v", "type": "vpc", "properties": {"colour": "red"}}], "unknown ['colour']"),
    ([{"id": "s", "type": "vswitch", "properties": {"zone": "z", "cidr_block": "c"}}],
     "properties.vpc: required"),
    ([{"id": "s", "type": "vswitch", "properties": {"vpc": "${nope}", "zone": "z",
                                                    "cidr_block": "c"}}], "not declared"),
    ([{"id": "u", "type": "ram_user", "properties": {"name": "u-{episode}"}},
      {"id": "s", "type": "security_group", "properties": {"vpc": "${u}"}}],
     "must refer to a vpc"),
    ([{"id": "u", "type": "ram_user", "properties": {"name": "fixed-name"}}],
     "must contain {episode}"),
    ([{"id": "r", "type": "security_group_rule", "properties": {"security_group": "${g}",
                                                                "direction": "sideways"}},
      {"id": "g", "type": "security_group", "properties": {"vpc": "${n}"}},
      {"id": "n", "type": "vpc"}], "'sideways' is not one of ingress, egress"),
    ([{"id": "v", "type": "vpc"}, {"id": "v", "type": "vpc"}], "duplicate id"),
])
def test_bad_declarations_name_the_field(bad, message):
    with pytest.raises(ConfigError, match="tasks/bad.yaml") as err:
        parse_resources(bad, "tasks/bad.yaml")
    assert message in str(err.value)


def test_fill_placeholders_but_not_references():
    assert fill("web-{episode}", {"episode": "ab12cd"}) == "web-ab12cd"
    assert fill("${net}", {"episode": "ab12cd"}) == "${net}"
    with pytest.raises(ConfigError, match="placeholder {who}"):
        fill("{who}", {"episode": "x"})
