"""Errors the local cloud answers with, in Alibaba Cloud's codes and HTTP statuses."""
from __future__ import annotations

from consolerl.errors import ConsoleRLError


class CloudError(ConsoleRLError, ValueError):
    """An error answered to the caller as ``{RequestId, HostId, Code, Message, Recommend}``."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.status))


def missing(name: str) -> CloudError:
    return CloudError("MissingParameter",
                      f'The input parameter "{name}" that is mandatory for processing this '
                      "request is not supplied.", 400)


def invalid(name: str, why: str, code: str = "InvalidParameter") -> CloudError:
    return CloudError(code, f'The specified parameter "{name}" is not valid: {why}', 400)


def not_found(code: str, what: str, ident: str) -> CloudError:
    return CloudError(code, f"The specified {what} \"{ident}\" does not exist.", 404)
