"""Hostile pages against the documentation reader: ``python -m benchmarks.hostile_pages --json``.

Each case is a page just under the 2 MiB a page may have, one procedure whose second step
carries a run of one kind of markup or punctuation (nested parentheses, ", and then", code
spans, links, bold, ``<b>`` elements, ``<``, entities, escapes, ...), in Markdown and in HTML,
read and statically checked by the documentation service as ``POST /v1/docs`` does. Prints one
JSON object: ``cases``, ``max_s`` and ``p50_s`` (seconds a page, answer or refusal), and per
case its format, kind, bytes, seconds and outcome (``ok``, or the reader's refusal: a 4xx over
HTTP). The issue's bar: within a second, or a clear refusal.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from consolerl.stats import percentile
from doccheck import DocsInputError, DocsService, PageIn

UNITS = {"parens": "((", "andthen": ", and then", "brackets": "[**x**](", "stars": "**",
         "backticks": "`a` ", "quotes": '"', "gt": " > ", "links": "[a](b) ",
         "html": "<b>x</b>", "under": "_a_ ", "lt": "<", "amp": "&amp;", "bs": "\\*"}
SIZE = 1_990_000


def page(kind: str, junk: str) -> str:
    if kind == "text/markdown":
        return (f"# T\n\n## Do it\n\n1. Log on to the RAM console.\n2. Click **Create User** "
                f"{junk}\n3. Click **OK**.\n")
    return (f"<h1>T</h1><h2>Do it</h2><ol><li>Log on to the RAM console.</li><li>Click "
            f"<b>Create User</b> {junk}</li><li>Click <b>OK</b>.</li></ol>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_pages",
                                     description="Hostile pages against the reader.")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    service = DocsService.default()
    rows = []
    for kind in ("text/markdown", "text/html"):
        for name, unit in UNITS.items():
            text = page(kind, (unit * (SIZE // len(unit) + 1))[:SIZE])
            started = time.perf_counter()
            try:
                service.read([PageIn("p", text, kind)])
                outcome = "ok"
            except DocsInputError as exc:
                outcome = f"refused: {str(exc)[:100]}"
            seconds = time.perf_counter() - started
            rows.append({"format": kind, "kind": name, "bytes": len(text.encode()),
                         "seconds": round(seconds, 3), "outcome": outcome})
            print(f"[hostile] {kind} {name}: {seconds:.2f} s {outcome[:40]}", file=sys.stderr)
    times = [r["seconds"] for r in rows]
    out = {"cases": len(rows), "max_s": max(times), "p50_s": round(percentile(times, 0.5), 3),
           "per_case": rows}
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
