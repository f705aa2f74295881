"""Numbers in outside input are ASCII digits only. Other scripts' digits and superscripts pass
``str.isdigit`` and ``\\d``; some then crash ``int()`` (a 500 where a 400 was due), others are
silently read as numbers. One test per parser that takes numbers from outside."""
from __future__ import annotations

import pytest

from consolerl.text import ascii_digits
from infra.console_sim.console.core import _int
from infra.console_sim.errors import CloudError
from infra.console_sim.params import Params
from infra.console_sim.timeutil import parse_iso
from reward_service.rules import dotted

FOREIGN = ["٣", "²", "３", "१२"]          # Arabic-Indic, superscript, fullwidth, Devanagari


def test_ascii_digits():
    assert ascii_digits("0123456789")
    assert not any(ascii_digits(x) for x in ["", "-1", "1.0", " 1", *FOREIGN])


@pytest.mark.parametrize("value", FOREIGN + ["1²"])
def test_openapi_integers_refuse_foreign_digits(value):
    with pytest.raises(CloudError) as info:
        Params({"MaxResults": value}).int("MaxResults")
    assert info.value.code == "InvalidParameter" and "MaxResults" in info.value.message


@pytest.mark.parametrize("index", FOREIGN)
def test_list_indexes_refuse_foreign_digits(index):
    assert Params({f"Tag.{index}": "x", "Tag.1": "y"}).list("Tag") == ["y"]
    assert Params({f"Attr.{index}.Key": "x"}).structs("Attr", ["Key"]) == []


@pytest.mark.parametrize("value", FOREIGN)
def test_console_numbers_fall_back_to_the_default(value):
    assert _int(value, 7) == 7


def test_times_refuse_foreign_digits():
    assert parse_iso("2026-11-24T06:00:00Z") is not None
    assert parse_iso("٢٠٢٦-11-24T06:00:00Z") is None


def test_rule_paths_read_foreign_digits_as_keys():
    data = {"Items": ["a", "b"]}
    assert dotted(data, "Items.1") == "b"
    assert dotted(data, "Items.²") is None


def test_reward_api_account_ids_are_ascii():
    from pydantic import ValidationError

    from reward_service.service import ScoreRequest
    with pytest.raises(ValidationError) as info:
        ScoreRequest.model_validate({"task_id": "ram-create-user-0", "account_id": "١٠٠٠٠٠٠٠٠١",
                                     "started_at": 1.7e9, "ended_at": 1.7e9 + 1})
    assert [e["loc"] for e in info.value.errors()] == [("account_id",)]
