"""The local redis-server helper for integration tests (see :mod:`infra.redis_local`)."""
from __future__ import annotations

from infra.redis_local import RedisServer

__all__ = ["RedisServer"]
