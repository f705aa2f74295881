"""The jobs API's retention config (jobsapi.retention.RetentionConfig): the
defaults (30 days of results, 7 of screenshots), per-team overrides with the rest left to the
defaults and screenshots never kept longer than results, refusals that name the field, and
the section as it loads from YAML and overrides (api.retention, api.blobs)."""
from __future__ import annotations

import pytest

from cluster.config import JobConfig
from consolerl.config import load_config
from consolerl.errors import ConfigError
from jobsapi.blobs import BlobConfig
from jobsapi.retention import DAY_S, RetentionConfig, TeamRetention


def test_defaults_and_overrides():
    config = RetentionConfig(teams={"docs": TeamRetention(screenshots_s=3600),
                                    "soak": TeamRetention(results_s=60)})
    assert config.for_team("eval") == TeamRetention(30 * DAY_S, 7 * DAY_S)
    assert config.for_team("docs") == TeamRetention(30 * DAY_S, 3600)
    # A team's results shorter than the default screenshots: those are capped.
    assert config.for_team("soak") == TeamRetention(60, 60)


@pytest.mark.parametrize("fields, named", [
    ({"results_s": 0}, "RetentionConfig.results_s"),
    ({"screenshots_s": -1}, "RetentionConfig.screenshots_s"),
    ({"usage_keep_s": float("inf")}, "RetentionConfig.usage_keep_s"),
    ({"sweep_every_s": True}, "RetentionConfig.sweep_every_s"),
    ({"sweep_batch": 0}, "RetentionConfig.sweep_batch"),
    ({"teams": {"a:b": TeamRetention()}}, "RetentionConfig.teams: 'a:b' is not an id"),
    ({"teams": {"docs": TeamRetention(results_s=0)}}, "RetentionConfig.teams.docs.results_s"),
])
def test_refusals_name_the_field(fields, named):
    with pytest.raises(ConfigError, match=named):
        RetentionConfig(**fields)


def test_the_api_section_loads_retention_and_blobs_from_overrides():
    config = load_config(JobConfig, None, [
        "api.retention.results_s=120", "api.retention.screenshots_s=30",
        "api.retention.teams.docs.results_s=600", "api.retention.sweep_every_s=0.5",
        "api.blobs.kind=oss", "api.blobs.endpoint=http://127.0.0.1:18080",
        "api.blobs.bucket=consolerl-blobs", "api.blobs.prefix=api"])
    retention = config.api.retention
    assert retention.for_team("docs") == TeamRetention(600, 30)
    assert retention.for_team("other") == TeamRetention(120, 30)
    assert retention.sweep_every_s == 0.5
    assert config.api.blobs == BlobConfig(kind="oss", endpoint="http://127.0.0.1:18080",
                                          bucket="consolerl-blobs", prefix="api")
    with pytest.raises(ConfigError, match="api.retention: RetentionConfig.teams.docs.results_s"):
        load_config(JobConfig, None, ["api.retention.teams.docs.results_s=-5"])
    with pytest.raises(ConfigError, match="unknown field.*secret"):
        load_config(JobConfig, None, ["api.blobs.secret=abc"])     # secrets are not config
