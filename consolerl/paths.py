"""How a URL path is read by the most lenient server, and which paths are console pages.

One rule for everyone who judges a console path: the env worker's sandbox (every request the
browser makes), task validation (an inline task's ``start_page``) and the jobs API's
``POST /v1/tasks/validate``, so that validation says what the worker will say.
"""
from __future__ import annotations

from urllib.parse import unquote


def server_path(path: str) -> str | None:
    """``path`` as the most lenient server (or a proxy before it) may read it: percent-decoded
    until stable, backslashes as slashes, empty segments dropped (``//`` as ``/``), dot
    segments removed (RFC 3986 section 5.2.4), so ``/console/%2e%2e/metrics``,
    ``/console/..%2fmetrics`` and ``/console\\..\\metrics`` are all ``/metrics``. None when
    the path still decodes further after several rounds."""
    for _ in range(4):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    else:
        return None
    segments = path.replace("\\", "/").split("/")
    kept: list[str] = []
    for segment in segments[1:]:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in (".", ""):
            kept.append(segment)
    if segments[-1] in (".", "..", ""):
        kept.append("")   # "/a/b/.." is "/a/", a directory
    return "/" + "/".join(kept)


def is_console_path(path: str) -> bool:
    """True when ``path`` (no query) is a console page as a server reads it: under
    ``/console/`` after :func:`server_path`, or ``/console`` itself, or the favicon."""
    read = server_path(path)
    return read is not None and (read.startswith("/console/")
                                 or read in ("/console", "/favicon.ico"))
