"""How an entry point stops on a signal to its whole process group (Ctrl-C in a terminal,
systemd's default, ``kill -TERM -PGID``): the command runs in a session of its own, the
signal goes to its process group once a line of its output says it is at work, and this
prints the seconds to exit, the exit code and the processes of the session left behind.

    python -m benchmarks.stop --json [--signal TERM|INT] [--after 'GRPO:'] [--wait-s 60]
        -- make serve

``--after``: the output line to wait for; ``--wait-s``: how long after it to send the signal
(episodes in flight). With ``--summary FILE`` the run's summary.json is read for the leases
still held and whether the run said it was interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def session_processes(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:160] or p.name()
    except psutil.Error:
        return str(p.pid)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: python -m benchmarks.stop [options] -- COMMAND ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stop")
    parser.add_argument("--signal", default="TERM", choices=("TERM", "INT"))
    parser.add_argument("--after", default="the jobs API is on")
    parser.add_argument("--wait-s", type=float, default=5.0)
    parser.add_argument("--start-timeout-s", type=float, default=1800.0)
    parser.add_argument("--summary", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    signum = getattr(signal, f"SIG{args.signal}")
    log = Path(tempfile.mkstemp(prefix="stop-", suffix=".log")[1])
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    sid = pgid = proc.pid
    deadline = time.monotonic() + args.start_timeout_s
    while args.after not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            os.killpg(pgid, signal.SIGKILL)
            return 1
        time.sleep(1)
    time.sleep(args.wait_s)
    in_session = len(session_processes(sid))
    t0 = time.monotonic()
    os.killpg(pgid, signum)
    try:
        rc = proc.wait(300)
    except subprocess.TimeoutExpired:
        rc = None
    exit_s = round(time.monotonic() - t0, 1)
    time.sleep(2)
    left = session_processes(sid)
    result = {"command": " ".join(command), "signal": f"SIG{args.signal}",
              "processes_at_signal": in_session, "exit_s": exit_s, "exit_code": rc,
              "left": len(left), "left_processes": [describe(p) for p in left][:10],
              "log_tail": log.read_text(errors="replace").splitlines()[-4:]}
    if args.summary and Path(args.summary).exists():
        summary = json.loads(Path(args.summary).read_text())
        result["leases_held"] = summary.get("leases_held")
        result["rollout_episodes"] = (summary.get("rollout") or {}).get("episodes")
    for p in left:                       # never leave them behind, whatever was measured
        try:
            p.kill()
        except psutil.Error:
            pass
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
