"""The metrics inventory: every metric the code defines, read from the source (not from a
running process), plus the external metrics the dashboards and rules use (Prometheus's ``up``,
the Redis exporter's), pinned to the installed versions.

``python -m infra.observability.inventory`` rewrites ``infra/observability/metrics.md``; a
test fails when that file differs from what the code defines, or when a dashboard or a rule
names a metric that is not here.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("consolerl", "infra", "env_workers", "reward_service", "rollout_service",
            "doccheck", "datagen", "trainer", "jobsapi", "cluster")
MARKDOWN = Path(__file__).resolve().parent / "metrics.md"
TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram",
         "Summary": "summary", "Info": "info", "Enum": "stateset"}
# Series a type adds to its name (prometheus_client's exposition).
SUFFIXES = {"counter": ("", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
            "stateset": ("",)}


@dataclass(frozen=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...]
    help: str
    source: str                      # file (relative) or the exporter

    @property
    def unit(self) -> str:
        for suffix, unit in (("_timestamp_seconds", "unix time"), ("_seconds", "seconds"),
                             ("_seconds_total", "seconds"), ("_bytes", "bytes")):
            if self.name.endswith(suffix):
                return unit
        if self.name.endswith(("_rate", "_fraction", "_ratio", "_perc")):   # vLLM: _perc
            return "ratio"
        if self.name.endswith("_total") or self.type in ("counter",):
            return "events"
        return "count" if self.type == "gauge" else "-"

    def series(self) -> tuple[str, ...]:
        base = self.name[:-len("_total")] if self.type == "counter" and \
            self.name.endswith("_total") else self.name
        names = [self.name]
        for suffix in SUFFIXES.get(self.type, ("",)):
            names.append(base + suffix)
        return tuple(dict.fromkeys(names))


# vLLM's own metrics as vllm(-cpu) 0.31 names them (vllm/v1/metrics/loggers.py), served by
# each PolicyServer's endpoint with ``server`` added (rollout_service/engine_metrics.py).
VLLM_LABELS = ("model_name", "engine", "server")
VLLM = "vllm 0.31 via the PolicyServer"

# Metrics of other programs that the dashboards and rules use. Names as the installed
# versions expose them: Prometheus 2.42 (``up``, set per target), prometheus-redis-exporter
# 1.45 with --check-streams, vLLM 0.31.
EXTERNAL = (
    Metric("up", "gauge", ("job", "instance", "component", "name", "run", "node"),
           "1 when Prometheus's last scrape of the target succeeded, else 0.", "prometheus"),
    Metric("redis_up", "gauge", (), "1 when the exporter reached Redis.", "redis-exporter"),
    Metric("redis_memory_used_bytes", "gauge", (),
           "Memory Redis has allocated (INFO memory used_memory).", "redis-exporter"),
    Metric("redis_memory_max_bytes", "gauge", (),
           "Redis's maxmemory setting (0: no limit).", "redis-exporter"),
    Metric("redis_stream_length", "gauge", ("db", "stream"),
           "Entries in the stream (XLEN).", "redis-exporter"),
    Metric("redis_stream_groups", "gauge", ("db", "stream"),
           "Consumer groups of the stream.", "redis-exporter"),
    Metric("redis_stream_group_messages_pending", "gauge", ("db", "stream", "group"),
           "Entries delivered to the group and not acknowledged.", "redis-exporter"),
    Metric("redis_stream_group_consumers", "gauge", ("db", "stream", "group"),
           "Consumers in the group.", "redis-exporter"),
    Metric("redis_stream_group_consumer_idle_seconds", "gauge",
           ("db", "stream", "group", "consumer"),
           "Seconds since the consumer last read.", "redis-exporter"),
    Metric("redis_stream_group_consumer_messages_pending", "gauge",
           ("db", "stream", "group", "consumer"),
           "Entries delivered to the consumer and not acknowledged.", "redis-exporter"),
    Metric("vllm:kv_cache_usage_perc", "gauge", VLLM_LABELS,
           "KV-cache usage. 1 means 100 percent usage.", VLLM),
    Metric("vllm:num_requests_running", "gauge", VLLM_LABELS,
           "Number of requests in model execution batches.", VLLM),
    Metric("vllm:num_requests_waiting", "gauge", VLLM_LABELS,
           "Number of requests waiting to be processed.", VLLM),
    Metric("vllm:num_preemptions_total", "counter", VLLM_LABELS,
           "Cumulative number of preemption from the engine.", VLLM),
    Metric("vllm:time_to_first_token_seconds", "histogram", VLLM_LABELS,
           "Histogram of time to first token in seconds.", VLLM),
)


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _labels(call: ast.Call) -> tuple[str, ...]:
    node = call.args[2] if len(call.args) > 2 else next(
        (k.value for k in call.keywords if k.arg == "labelnames"), None)
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(s for s in (_string(e) for e in node.elts) if s is not None)
    return ()


def scan(root: Path = ROOT) -> list[Metric]:
    """Every ``consolerl_*`` metric the packages define (sorted by name)."""
    found: dict[str, Metric] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                kind = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else "")
                name = _string(node.args[0])
                if kind not in TYPES or not name or not name.startswith("consolerl_"):
                    continue
                help_text = _string(node.args[1]) if len(node.args) > 1 else None
                metric = Metric(name, TYPES[kind], _labels(node),
                                " ".join((help_text or "").split()),
                                str(path.relative_to(root)))
                if name in found and found[name].type != metric.type:
                    raise ValueError(f"{name} is defined as {found[name].type} and "
                                     f"{metric.type}")
                found.setdefault(name, metric)
    return sorted(found.values(), key=lambda m: m.name)


def inventory(root: Path = ROOT) -> list[Metric]:
    return scan(root) + list(EXTERNAL)


def series_names(metrics: list[Metric]) -> set[str]:
    """Every series name the metrics expose (a histogram's ``_bucket`` / ``_sum`` / ...)."""
    return {s for m in metrics for s in m.series()}


def render(metrics: list[Metric]) -> str:
    lines = ["# Metrics inventory", "",
             "Generated by `python -m infra.observability.inventory` from the code; do not "
             "edit. A test fails when it drifts from the code, or when a dashboard or a rule "
             "names a metric that is not listed here.", "",
             "Every console-rl target also carries the labels `component`, `name`, `run`, "
             "`node` and `node_ip` (set by discovery, see README.md).", "",
             "A policy replica with the vLLM backend also serves vLLM's own `vllm:*` metrics "
             "(all that its engine registers, with the label `server` added); those the "
             "dashboards and rules use are listed.", "",
             "| metric | type | labels | unit | meaning | defined in |",
             "|---|---|---|---|---|---|"]
    for m in metrics:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        meaning = m.help.replace("|", "\\|")
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {m.unit} | {meaning} | "
                     f"{m.source} |")
    return "\n".join(lines) + "\n"


_NAME = re.compile(r"^\| `([^`]+)` \| (\w+) \|")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names a PromQL expression reads: identifiers that are
    not functions, keywords, label names or values, durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                        # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                      # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ",
                  text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def documented(path: Path = MARKDOWN) -> dict[str, str]:
    """Metric name -> type, as ``metrics.md`` lists them."""
    out = {}
    for line in path.read_text().splitlines():
        match = _NAME.match(line)
        if match:
            out[match.group(1)] = match.group(2)
    return out


def main() -> int:
    text = render(inventory())
    if "--check" in sys.argv[1:]:
        if MARKDOWN.read_text() != text:
            print(f"{MARKDOWN} is out of date: python -m infra.observability.inventory",
                  file=sys.stderr)
            return 1
        return 0
    MARKDOWN.write_text(text)
    print(f"wrote {MARKDOWN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
