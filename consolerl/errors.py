"""One exception hierarchy for console-rl.

Every project error derives from :class:`ConsoleRLError` and also from the stdlib type that
fits it, so callers can catch either. Errors are picklable (they cross Ray boundaries): each
subclass keeps its constructor arguments in ``self.args`` order via ``__reduce__``.
"""
from __future__ import annotations


class ConsoleRLError(Exception):
    """Base class of every console-rl error."""


class ConfigError(ConsoleRLError, ValueError):
    """A configuration or input file is invalid; the message names the file and field."""


class CloudAPIError(ConsoleRLError, RuntimeError):
    """A cloud API call failed with an Alibaba Cloud error code.

    ``code`` is the cloud's error code (``InvalidVpcID.NotFound``), ``status`` the HTTP status,
    ``request_id`` the cloud's request id when there was one.
    """

    def __init__(self, code: str, message: str, status: int = 0, request_id: str = "",
                 action: str = ""):
        super().__init__(f"{action + ': ' if action else ''}{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.request_id = request_id
        self.action = action

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.status, self.request_id, self.action))


class EpisodeCancelled(ConsoleRLError, RuntimeError):
    """Raised by an episode's observer to stop the episode between two steps (an API job was
    cancelled or expired): the runner closes the browser, destroys what the episode made and
    releases the account, and marks the outcome ``cancelled``."""
