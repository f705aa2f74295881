"""``python -m cluster.export``: oracle trajectories as SFT JSONL, from the command line.

``python -m cluster.export --out PATH.jsonl [--split train|test|all] [--tasks REGEX]
[--episodes-per-task 1] [--workers 2] [--config configs/cpu.yaml] [--history-turns 4
--max-prompt-tokens 3072 --max-observation-chars 6000] [--model default|FOLDER]
[--cloud-endpoint HOST:PORT] [--redis-url URL] [--accounts-file FILE] [--max-steps 40]``

Composition only: the flags and the ``agent`` section of ``--config`` (a rollout config; else
4 history turns / 3,072 prompt tokens / 6,000 page characters, as ``configs/cpu.yaml``; flags
override either, see :class:`rollout_service.agent.AgentConfig`) become an
:class:`~datagen.export.ExportConfig`, and :func:`datagen.export.run_export`
does the work (what is kept, the record format). ``--split test`` is the suite's ``heldout``
split (``--split heldout`` works too). Progress goes to stderr, the JSON summary to stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import yaml

from consolerl.config import build
from consolerl.errors import ConfigError
from consolerl.tasks import TASKS_DIR
from rollout_service.agent import PAGE_VIEWS, RESPONSES, SYSTEM_PROMPTS, AgentConfig
from datagen.export import SPLITS, ExportConfig, run_export


def agent_settings(config_path: str | None, overrides: Mapping[str, int | str | None]
                   ) -> AgentConfig:
    """The prompt settings: the rollout config's ``agent`` section when given (else the CPU
    defaults: 4 history turns, 3,072 prompt tokens, 6,000 page characters), then the flags
    that were set."""
    base = asdict(ExportConfig(out="-").agent)
    if config_path:
        try:
            tree = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"{config_path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_path}: not valid YAML: {exc}") from None
        section = tree.get("agent", {}) if isinstance(tree, dict) else None
        if not isinstance(section, dict):
            raise ConfigError(f"{config_path}: field 'agent' must be a mapping")
        base = asdict(build(AgentConfig, section, f"{config_path}: agent"))
    base.update({k: v for k, v in overrides.items() if v is not None})
    return build(AgentConfig, base, "agent settings")


def parse_args(argv: Sequence[str] | None = None) -> ExportConfig:
    parser = argparse.ArgumentParser(prog="python -m cluster.export",
                                     description="Export oracle trajectories as SFT JSONL.")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--split", default="train", choices=sorted(SPLITS),
                        help="task split (test = heldout)")
    parser.add_argument("--tasks", default="", help="regular expression over task ids")
    parser.add_argument("--episodes-per-task", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="browsers in parallel (1-8)")
    parser.add_argument("--config", default=None,
                        help="rollout config YAML whose 'agent' section sets the prompt")
    parser.add_argument("--history-turns", type=int, default=None)
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    parser.add_argument("--max-observation-chars", type=int, default=None)
    parser.add_argument("--system-prompt", default=None, choices=sorted(SYSTEM_PROMPTS))
    parser.add_argument("--page-view", default=None, choices=PAGE_VIEWS)
    parser.add_argument("--response", default=None, choices=RESPONSES,
                        help="grounded: the completion names the element's label first "
                             "(goes with --system-prompt grounded)")
    parser.add_argument("--model", default="default",
                        help="model folder whose tokenizer the policy uses (default: SmolLM2)")
    parser.add_argument("--suite", default=str(TASKS_DIR))
    parser.add_argument("--cloud-endpoint", default="",
                        help="HOST:PORT of a running cloud (default: start a local one)")
    parser.add_argument("--redis-url", default="",
                        help="Redis of the account leases (default: start a local one)")
    parser.add_argument("--accounts-file", default="",
                        help="accounts YAML (default: the local cloud's accounts)")
    parser.add_argument("--max-steps", type=int, default=40, help="oracle steps per episode")
    args = parser.parse_args(argv)
    try:
        agent = agent_settings(args.config, {
            "history_turns": args.history_turns, "max_prompt_tokens": args.max_prompt_tokens,
            "max_observation_chars": args.max_observation_chars,
            "system_prompt": args.system_prompt, "page_view": args.page_view,
            "response": args.response})
        return ExportConfig(out=args.out, split=args.split, tasks=args.tasks,
                            episodes_per_task=args.episodes_per_task, workers=args.workers,
                            agent=agent, model=args.model, suite=args.suite,
                            cloud_endpoint=args.cloud_endpoint, redis_url=args.redis_url,
                            accounts_file=args.accounts_file, max_steps=args.max_steps)
    except ConfigError as exc:
        parser.error(str(exc))
        raise                                   # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    summary = asyncio.run(run_export(config))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
