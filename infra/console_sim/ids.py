"""Identifiers in the real clouds' formats."""
from __future__ import annotations

import secrets
import string
import uuid

from .catalog import REGIONS

_ALNUM = string.ascii_lowercase + string.digits


def resource_id(prefix: str, region: str) -> str:
    """``sg-bp1a2b...``: prefix, the region's two-letter infix, 18 random lowercase alnum."""
    infix = REGIONS.get(region, ("xx", ()))[0]
    return f"{prefix}-{infix}{''.join(secrets.choice(_ALNUM) for _ in range(18))}"


def request_id() -> str:
    return str(uuid.uuid4()).upper()


def numeric_id(digits: int = 16) -> str:
    return str(secrets.randbelow(9 * 10 ** (digits - 1)) + 10 ** (digits - 1))


def host_id() -> str:
    return "localcloud.aliyuncs.com"
