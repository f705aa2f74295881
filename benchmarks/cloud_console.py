"""Benchmark of the local cloud's console web UI: ``python -m benchmarks.cloud_console --json``.

The console half of :mod:`benchmarks.cloud_api`, run by its code (the same as ``python -m
benchmarks.cloud_api --console --json``; the measurements are described there): real
headless Chromium driven by Playwright loads the ECS instance list over 200 Running instances
(``list_page_*``, ``navigation_floor_p50_ms``) and submits the RAM "Create User" form
(``form_submit_*``). ``--console-samples N`` samples of each after 3 warm-ups (default: 30).

Prints one JSON object with ``--json``; progress goes to stderr.
"""
from __future__ import annotations

import sys

from benchmarks.cloud_api import main as cloud_api_main


def main(argv: list[str] | None = None) -> int:
    return cloud_api_main(argv, console=True)


if __name__ == "__main__":
    sys.exit(main())
