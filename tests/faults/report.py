"""``python -m tests.faults.report``: the table of the fault cases run so far (the latest
result of each fault and seed, from ``var/faults/results.jsonl``)."""
from __future__ import annotations

import json
import sys

from tests.faults.harness import FAULTS, RESULTS


def table(rows: list[dict]) -> str:
    latest: dict[tuple[str, int], dict] = {}
    for row in rows:
        latest[(row["fault"], row["seed"])] = row
    lines = [f"{'fault':<16}{'injections':>11}{'survived':>10}{'violations':>12}"
             f"{'resumed':>9}{'wall s':>9}  points (s after the first lease; step)"]
    total_wall = 0.0
    for fault in FAULTS:
        cases = [r for (f, _), r in sorted(latest.items()) if f == fault]
        if not cases:
            continue
        injected = sum(r["injected"] for r in cases)
        survived = sum(r["survived"] for r in cases)
        violations = sum(len(r["violations"]) for r in cases)
        resumed = sum(r["resumed"] for r in cases)
        wall = sum(r["wall_s"] for r in cases)
        total_wall += wall
        points = ", ".join(f"{r['injection']['after_first_lease_s']:g}; {r['injection']['step']}"
                           for r in cases if r["injected"])
        lines.append(f"{fault:<16}{injected:>11}{survived:>10}{violations:>12}{resumed:>9}"
                     f"{wall:>9.0f}  {points}")
    lines.append(f"total wall time {total_wall / 60:.1f} min")
    for (fault, seed), r in sorted(latest.items()):
        for v in r["violations"]:
            lines.append(f"  {fault} seed {seed}: {v}")
        if not r["injected"]:
            lines.append(f"  {fault} seed {seed}: not injected ({r['injection']['detail']})")
    return "\n".join(lines)


def main() -> int:
    try:
        rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    except OSError:
        print(f"no results yet in {RESULTS}", file=sys.stderr)
        return 1
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
