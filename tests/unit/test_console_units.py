"""Console pieces that need no server: drift profiles, error-to-field mapping, redirects."""
from __future__ import annotations

import pytest

from consolerl.errors import ConfigError
from consolerl import drift
from infra.console_sim.console.core import _safe_next, field_for
from infra.console_sim.console.ui import Field
from infra.console_sim.errors import CloudError, invalid, missing


def test_drift_parse():
    assert drift.parse("") == frozenset()
    assert drift.parse(None) == frozenset()
    assert drift.parse("rename, wizard") == {"rename", "wizard"}
    assert drift.parse("all") == frozenset(drift.KINDS)
    assert len(drift.KINDS) >= 4
    with pytest.raises(ConfigError, match="teleport.*allowed: rename"):
        drift.parse("rename,teleport")


def test_drift_labels_change_only_with_rename():
    assert drift.Drift().label("Delete") == "Delete"
    assert drift.Drift(frozenset({"rename"})).label("Delete") == "Release"
    assert drift.Drift(frozenset({"rename"})).label("Unmapped label") == "Unmapped label"
    assert str(drift.Drift(frozenset({"wizard", "rename"}))) == "rename,wizard"


FIELDS = [Field("VpcId", "VPC"), Field("VpcName", "VPC Name"), Field("UserName", "Logon Name"),
          Field("BucketName", "Bucket"), Field("Region", "Region", api=False)]


@pytest.mark.parametrize("err,expected", [
    (missing("VpcName"), "VpcName"),
    (invalid("VpcId", "bad"), "VpcId"),
    (CloudError("InvalidParameter.UserName.Length", "too long"), "UserName"),
    (CloudError("InvalidBucketName", "The specified bucket is not valid"), "BucketName"),
    (CloudError("EntityAlreadyExists.User", "The user already exists: x."), "UserName"),
    (CloudError("InvalidRegionId.NotFound", "The Region is wrong"), None),   # not an API field
    (CloudError("DependencyViolation", "still in use"), None),
])
def test_field_for_maps_api_errors_to_fields(err, expected):
    assert field_for(err, FIELDS) == expected


@pytest.mark.parametrize("target,ok", [
    ("/console/", True), ("/console/ecs/instances?page=2&q=a", True),
    ("https://evil.example/", False), ("//evil.example/console/", False),
    ("/console//evil", False), ("/metrics", False), ("/console/x\nSet-Cookie:", False),
    # Dot segments, plain or encoded, and encoded separators: browsers resolve %2e%2e as ..,
    # servers and proxies decode %2f and %5c; each of these lands outside /console/.
    ("/console/../metrics", False), ("/console/ecs/../../metrics", False),
    ("/console/..", False), ("/console/.", False), ("/console/./ecs", False),
    ("/console/%2e%2e/metrics", False), ("/console/%2E%2e/", False), ("/console/.%2e/x", False),
    ("/console/..%2fmetrics", False), ("/console/..%2Fmetrics", False),
    ("/console/%5c..%5cmetrics", False), ("/console\\..\\metrics", False),
    ("/console/%252e%252e/metrics", False), ("/console/x%00", False), ("/console/x%0d%0a", False),
    ("/console/x\t", False), ("/console/ x", False), ("javascript:alert(1)//console/", False),
    ("/console/" + "a" * 2040, False),
    # Dots inside names and anything in the query stay fine.
    ("/console/ram/users/alice.smith", True), ("/console/ram/users/a..b", True),
    ("/console/ecs/instances?q=10.0.0.1&by=..", True), ("/console/x?next=%2Fconsole%2F", True),
])
def test_safe_next(target, ok):
    assert _safe_next(target) is ok
