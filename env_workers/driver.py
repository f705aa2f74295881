"""A scripted agent (no LLM) that performs flows through the action space only: it reads the
observation's typed page (:mod:`consolerl.page`), finds the bid of an element by role and
name, and sends action strings — exactly what a model would do. Used by tests, benchmarks
and later issues."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from consolerl.errors import ConsoleRLError
from consolerl.page import parse
from consolerl.types import EnvError, Observation, StepResult

from .actions import Click, Fill, Select


class StepFn(Protocol):
    async def __call__(self, action_text: str) -> StepResult: ...


class DriverError(ConsoleRLError, RuntimeError):
    """The scripted flow could not go on (the element it needed is not on the page)."""


def find_bid(text: str, role: str, name: str | re.Pattern[str]) -> str | None:
    """The bid of the first control ``role "name"`` of its own line in an observation's
    text (``name``: the label, or a pattern matching at its start)."""
    return parse(text).bid(role, name)


def find_in_row(text: str, row_text: str, label: str) -> str | None:
    """The bid of control ``label`` inside the table row that contains ``row_text``."""
    node = parse(text).in_row(row_text, label)
    return None if node is None else node.bid


@dataclass
class ScriptedDriver:
    """Drives an env worker's ``step``; keeps the last observation and every result."""

    step_fn: StepFn
    observation: Observation
    results: list[StepResult] = field(default_factory=list)

    async def act(self, action_text: str) -> StepResult:
        result = await self.step_fn(action_text)
        self.results.append(result)
        if result.env_error is not None:
            raise DriverError(f"environment failed: {result.env_error.kind}: "
                              f"{result.env_error.message}")
        self.observation = result.observation
        return result

    def bid(self, role: str, name: str | re.Pattern[str]) -> str:
        bid = find_bid(self.observation.text, role, name)
        if bid is None:
            raise DriverError(f'no {role} "{name}" on {self.observation.url}:\n'
                              f"{self.observation.text[:3000]}")
        return bid

    async def click(self, role: str, name: str | re.Pattern[str]) -> StepResult:
        return await self.act(Click(self.bid(role, name)).to_text())

    async def fill(self, name: str, text: str, role: str = "textbox") -> StepResult:
        return await self.act(Fill(self.bid(role, name), text).to_text())

    async def select(self, name: str, option: str) -> StepResult:
        return await self.act(Select(self.bid("combobox", name), option).to_text())

    async def click_in_row(self, row_text: str, label: str) -> StepResult:
        bid = find_in_row(self.observation.text, row_text, label)
        if bid is None:
            raise DriverError(f"no {label!r} in a row with {row_text!r}:\n"
                              f"{self.observation.text[:3000]}")
        return await self.act(Click(bid).to_text())


def expect_observation(value: Observation | EnvError) -> Observation:
    if isinstance(value, EnvError):
        raise DriverError(f"reset failed: {value.kind}: {value.message}")
    return value
