"""``python -m infra.console_sim``: serve the local cloud."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from consolerl.errors import ConfigError

from consolerl.accounts import load_accounts
from .config import DEFAULT_ACCOUNTS_FILE, SimConfig


def parse_args(argv: list[str] | None = None) -> SimConfig:
    parser = argparse.ArgumentParser(
        prog="python -m infra.console_sim",
        description="Serve the local cloud: Alibaba Cloud OpenAPI (ECS, VPC, RAM, ActionTrail) "
                    "and OSS bucket REST API, with state in SQLite.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument("--state-dir", type=Path, default=Path("var/console_sim"),
                        help="directory for the SQLite state (kept across restarts)")
    parser.add_argument("--accounts", type=Path, default=DEFAULT_ACCOUNTS_FILE,
                        help=f"accounts YAML (default: {DEFAULT_ACCOUNTS_FILE})")
    parser.add_argument("--delivery-delay", type=float, default=0.0, metavar="SECONDS",
                        help="hold audit events back from LookupEvents this long (real: minutes)")
    parser.add_argument("--lookup-qps", type=float, default=2.0,
                        help="LookupEvents queries per second per account (0: unlimited)")
    parser.add_argument("--transition", type=float, default=2.0, metavar="SECONDS",
                        help="duration of instance status transitions")
    parser.add_argument("--network-ready", type=float, default=0.5, metavar="SECONDS",
                        help="how long a new VPC or vSwitch stays Pending")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be 1-65535, got {args.port}")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return SimConfig(host=args.host, port=args.port, state_dir=args.state_dir,
                     accounts_file=args.accounts, delivery_delay_s=args.delivery_delay,
                     lookup_qps=args.lookup_qps, transition_s=args.transition,
                     network_ready_s=args.network_ready)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        accounts = load_accounts(config.accounts_file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import build_app
    app = build_app(config, accounts)
    print(f"local cloud on http://{config.host}:{config.port} ({len(accounts)} accounts, "
          f"state in {config.state_dir})", flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                access_log=False, loop="uvloop", http="httptools",
                date_header=False)             # the app dates responses by the cloud's clock
    return 0


if __name__ == "__main__":
    sys.exit(main())
