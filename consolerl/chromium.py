"""Where the Chromium that Playwright drives lives: the system's (Debian's ``chromium``), never
a browser downloaded by Playwright. ``CONSOLERL_CHROMIUM`` overrides the search."""
from __future__ import annotations

import os
import shutil

from .errors import ConfigError

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_path() -> str:
    """The Chromium executable; a :class:`ConfigError` naming the fix when there is none."""
    override = os.environ.get("CONSOLERL_CHROMIUM")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise ConfigError(f"CONSOLERL_CHROMIUM={override!r} is not an executable file")
        return override
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError("no Chromium found on PATH (looked for "
                      f"{', '.join(_CANDIDATES)}); run `make setup` (installs Debian's chromium) "
                      "or set CONSOLERL_CHROMIUM to the browser's path")
