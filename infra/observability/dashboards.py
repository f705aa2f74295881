"""Grafana dashboards for console-rl, written as Python data and rendered to Grafana's JSON
model: ``python -m infra.observability.dashboards`` rewrites ``grafana/dashboards/*.json``
(a test fails when the committed files differ from what this module renders).

Conventions (checked by tests/unit/test_observability_dashboards.py): the datasource is a
template variable (``$datasource``); every console-rl selector is filtered by the ``$run``
variable; rates and increases use ``[$__rate_interval]``; quantiles are
``histogram_quantile(q, sum by (le) (rate(..._bucket[$__rate_interval])))``; every panel has
a unit and a description saying what a bad value looks like; every metric is in the
inventory (metrics.md).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "grafana" / "dashboards"
RUN = 'run=~"$run"'
RATE = "[$__rate_interval]"


# ---- the model ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str                    # what it shows and what a bad value looks like
    unit: str                           # a Grafana unit id: s, percentunit, short, opm, ...
    queries: tuple[Query, ...]
    kind: str = "timeseries"            # timeseries | stat
    width: int = 12
    height: int = 8
    stacked: bool = False


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    query: str                          # a label_values(...) query
    label: str = ""
    all_value: str = ".*"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[Variable, ...] = field(default_factory=tuple)

    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]


RUN_VARIABLE = Variable("run", 'label_values(up{job="consolerl"}, run)', "run / job")


# ---- PromQL helpers (one spelling for every dashboard) ----------------------------------------

def sel(metric: str, *matchers: str) -> str:
    """``metric{run=~"$run", matchers...}``."""
    return f"{metric}{{{', '.join((RUN, *matchers))}}}"


def rate(metric: str, *matchers: str, by: str = "", scale: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({sel(metric, *matchers)}{RATE})){scale}"


def quantile(q: float, metric: str, *matchers: str, by: str = "") -> str:
    labels = f"le, {by}" if by else "le"
    return (f"histogram_quantile({q}, sum by ({labels}) "
            f"(rate({sel(metric + '_bucket', *matchers)}{RATE})))")


def quantiles(metric: str, *matchers: str, by: str = "", qs=(0.5, 0.9, 0.99)
              ) -> tuple[Query, ...]:
    suffix = f" {{{{{by}}}}}" if by else ""
    return tuple(Query(quantile(q, metric, *matchers, by=by), f"p{round(q * 100)}{suffix}")
                 for q in qs)


def mean(metric: str, *matchers: str, by: str = "") -> str:
    """Mean of a histogram's observations over the window (sum / count)."""
    grouping = f" by ({by})" if by else ""
    return (f"sum{grouping} (rate({sel(metric + '_sum', *matchers)}{RATE})) / "
            f"sum{grouping} (rate({sel(metric + '_count', *matchers)}{RATE}))")


def share(metric: str, matcher: str) -> str:
    """The share of a counter's rate that ``matcher`` selects (0 while no series matches
    yet; no data while the counter has no series at all)."""
    return f"({rate(metric, matcher)} or vector(0)) / {rate(metric)}"


def lag() -> str:
    """Trainer version minus each replica's version."""
    return (f"scalar(max({sel('consolerl_trainer_version')})) - "
            f"max by (server) ({sel('consolerl_policy_weight_version')})")


# ---- the dashboards ------------------------------------------------------------------------------

def overview() -> Dashboard:
    return Dashboard("consolerl-overview", "console-rl / Overview",
                     "One screen: is the run making progress, and is anything on fire?", (
        Row("Progress", (
            Panel("Episodes per minute", "Episodes finished per minute, by how they ended. A "
                  "drop to zero while the trainer waits means rollouts are stuck; a large "
                  "env_error share means the environment, not the agent, is failing.", "opm",
                  (Query(rate("consolerl_rollout_episodes_total", by="end", scale=" * 60"),
                         "{{end}}"),), stacked=True),
            Panel("Success rate", "Share of the last step's samples that succeeded (trainer) "
                  "and share of scored episodes the reward judged success. Flat at 0 for many "
                  "steps means nothing to learn from; a sudden drop after a weight update "
                  "means the update hurt.", "percentunit",
                  (Query(f"avg({sel('consolerl_trainer_success_rate')})", "trainer step"),
                   Query(share("consolerl_reward_scores_total", 'verdict="success"'),
                         "reward verdicts"))),
            Panel("Trainer step", "Optimizer steps done and the weight version published. A "
                  "flat line for longer than a step usually takes means the trainer is stalled "
                  "(see the Trainer dashboard: read time = waiting for experience).", "short",
                  (Query(f"max({sel('consolerl_trainer_steps_total')})", "steps"),
                   Query(f"max({sel('consolerl_trainer_version')})", "version")),
                  kind="stat", width=6),
            Panel("Env utilisation", "Share of env workers inside an episode. Near 100% for "
                  "long: the pool is the bottleneck (add workers); low while episodes are "
                  "wanted: workers wait on leases, the policy or the staleness bound.",
                  "percentunit", (Query(f"avg({sel('consolerl_env_worker_in_episode')})",
                                        "utilisation"),), kind="stat", width=6),
        )),
        Row("Health", (
            Panel("Policy version lag", "Trainer version minus the version each policy "
                  "replica serves. Above the staleness bound, samples are dropped or "
                  "admission waits.", "short", (Query(lag(), "{{server}}"),), width=8),
            Panel("Experience stream", "Entries the trainer has been handed but not "
                  "acknowledged (pending) and entries not yet handed to it (backlog). A "
                  "growing backlog means rollouts outpace training.", "short",
                  (Query(f"sum({sel('consolerl_trainer_stream_pending')})", "pending"),
                   Query(f"sum({sel('consolerl_trainer_stream_backlog')})", "backlog")),
                  width=8),
            Panel("Errors per minute", "Episodes lost to env errors, reward errors, and "
                  "components not answering scrapes. Anything above zero for long deserves a "
                  "look.", "opm",
                  (Query(rate("consolerl_rollout_episodes_total", 'end="env_error"',
                              scale=" * 60"), "env errors"),
                   Query(rate("consolerl_reward_errors_total", scale=" * 60"),
                         "reward errors"),
                   Query(f'sum(1 - up{{job="consolerl", {RUN}}})', "targets down")),
                  width=8),
        )),
    ), (RUN_VARIABLE,))


def env_pool() -> Dashboard:
    return Dashboard("consolerl-env-pool", "console-rl / Env pool",
                     "Browser env workers and the account leases they hold.", (
        Row("Workers", (
            Panel("Utilisation", "Per worker: 1 while it holds a lease (an episode runs), and "
                  "the pool's mean. All at 1 for long: saturated; all at 0 while the trainer "
                  "waits: workers are blocked elsewhere.", "percentunit",
                  (Query(f"avg({sel('consolerl_env_worker_in_episode')})", "pool"),
                   Query(f"max by (name) ({sel('consolerl_env_worker_in_episode')})",
                         "{{name}}"))),
            Panel("Episode outcomes", "Episodes ended per minute by end reason, env errors "
                  "included, and resets by outcome. env_error or signin_failed rising means "
                  "the environment is broken, not the agent.", "opm",
                  (Query(rate("consolerl_rollout_episodes_total", by="end", scale=" * 60"),
                         "end {{end}}"),
                   Query(rate("consolerl_env_worker_episodes_total", by="outcome",
                              scale=" * 60"), "reset {{outcome}}")), stacked=True),
            Panel("Step latency", "Time of one action plus its observation. p90 above a "
                  "second slows every episode; look at the local cloud's page latency.", "s",
                  quantiles("consolerl_env_worker_step_duration_seconds")),
            Panel("Steps per second", "Actions taken, by outcome. Many action_error: the "
                  "policy writes malformed actions; env_error: the browser fails.", "ops",
                  (Query(rate("consolerl_env_worker_steps_total", by="outcome"),
                         "{{outcome}}"),), stacked=True),
        )),
        Row("Leases", (
            Panel("Lease wait", "Time an episode waited for an account. Rising: too few "
                  "accounts for the workers, or leases stuck.", "s",
                  quantiles("consolerl_env_pool_acquire_wait_seconds", qs=(0.5, 0.9))),
            Panel("Lease hold time", "How long leases were held, acquire to release. Past "
                  "the episode limit: episodes hang.", "s",
                  quantiles("consolerl_env_pool_lease_hold_seconds", qs=(0.5, 0.9))),
            Panel("Oldest lease", "Age of the oldest lease held now, against twice the "
                  "episode limit (the alert threshold). Above the line: a stuck worker keeps "
                  "an account from everyone else.", "s",
                  (Query(f"max({sel('consolerl_env_worker_lease_held_seconds')})", "oldest"),
                   Query(f"2 * max({sel('consolerl_env_worker_episode_limit_seconds')})",
                         "2 x episode limit"))),
            Panel("Leases", "Leases granted and released per minute, and leases lost "
                  "(expired under a running episode). Any loss means a heartbeat could not "
                  "reach Redis in time.", "opm",
                  (Query(rate("consolerl_env_pool_leases_acquired_total", scale=" * 60"),
                         "acquired"),
                   Query(rate("consolerl_env_pool_leases_released_total", by="outcome",
                              scale=" * 60"), "released {{outcome}}"),
                   Query(rate("consolerl_env_pool_leases_lost_total", scale=" * 60"),
                         "lost"))),
            Panel("Quarantined accounts", "Accounts taken out of the pool after repeated "
                  "sign-in failures. Above zero: check those accounts' passwords.", "short",
                  (Query(f"max({sel('consolerl_env_pool_quarantined_accounts')})",
                         "quarantined"),), kind="stat", width=6),
        )),
        Row("Browsers", (
            Panel("Browser restarts", "Chromium restarts by reason (disconnected, "
                  "context_failed, memory) in each interval. A storm means browsers crash "
                  "or leak memory.", "short",
                  (Query(f"sum by (reason) (increase("
                         f"{sel('consolerl_env_worker_browser_restarts_total')}{RATE}))",
                         "{{reason}}"),), stacked=True),
            Panel("Blocked requests", "Requests, popups, navigations and file choosers the "
                  "sandbox refused, per minute, by kind. A jump: the console page changed or "
                  "the agent tries to leave it.", "opm",
                  (Query(rate("consolerl_env_worker_blocked_requests_total", by="kind",
                              scale=" * 60"), "{{kind}}"),), stacked=True),
        )),
    ), (RUN_VARIABLE,))


def policy_serving() -> Dashboard:
    return Dashboard("consolerl-policy", "console-rl / Policy serving",
                     "The PolicyServer replicas the agents sample from.", (
        Row("Throughput", (
            Panel("Tokens per second", "Sampled and prompt tokens per second, per replica. A "
                  "replica far below the others is slow or idle (check its node).",
                  "short",
                  (Query(rate("consolerl_policy_generated_tokens_total", by="server"),
                         "generated {{server}}"),
                   Query(rate("consolerl_policy_prompt_tokens_total", by="server"),
                         "prompt {{server}}"))),
            Panel("Requests", "Generate requests per second per replica, and requests "
                  "running in the engine or waiting for it. Waiting growing: the policy is "
                  "the bottleneck (add replicas).", "short",
                  (Query(rate("consolerl_policy_requests_total", by="server"),
                         "req/s {{server}}"),
                   Query(f"sum by (name) ({sel('consolerl_policy_requests_running')})",
                         "running {{name}}"),
                   Query(f"sum by (name) ({sel('consolerl_policy_requests_waiting')})",
                         "waiting {{name}}"))),
            Panel("Generate latency", "Time per generate call. p99 far above p50: requests "
                  "queue behind long generations.", "s",
                  quantiles("consolerl_policy_generate_seconds")),
        )),
        Row("Weights", (
            Panel("Weight update time", "Time for a replica to load new weights in place. "
                  "Rising: the publish path (object store, /dev/shm) is slow.", "s",
                  (Query(quantile(0.9, "consolerl_policy_weight_update_seconds", by="server"),
                         "p90 {{server}}"),
                   Query(mean("consolerl_policy_weight_update_seconds", by="server"),
                         "mean {{server}}"))),
            Panel("Version per replica", "The weight version each replica serves. Replicas "
                  "that disagree for long: one missed an update.", "short",
                  (Query(f"max by (server) ({sel('consolerl_policy_weight_version')})",
                         "{{server}}"),)),
        )),
        # vLLM's own metrics (pinned to vllm 0.31), served by each replica's endpoint with
        # its server label; no data where the policy backend is transformers.
        Row("Engine (vLLM)", (
            Panel("KV-cache use", "Share of each replica's KV-cache blocks in use (backend "
                  "vllm). Near 100% for long: vLLM preempts running requests and queues new "
                  "ones; give the replica more KV cache (policy.kv_cache_gib) or fewer "
                  "concurrent episodes.", "percentunit",
                  (Query(f"max by (server) ({sel('vllm:kv_cache_usage_perc')})",
                         "{{server}}"),)),
            Panel("Engine queue", "Requests in vLLM's scheduler per replica: running (in the "
                  "batch) and waiting (for KV cache or a batch slot). Waiting above zero for "
                  "long: the replica is saturated (add replicas or KV cache).", "short",
                  (Query(f"sum by (server) ({sel('vllm:num_requests_running')})",
                         "running {{server}}"),
                   Query(f"sum by (server) ({sel('vllm:num_requests_waiting')})",
                         "waiting {{server}}"))),
            Panel("Preemptions", "Requests vLLM preempted per minute (their KV cache taken "
                  "back and recomputed later) per replica. Anything but rare: the KV cache "
                  "is too small for the load; every preemption repeats a prefill.", "opm",
                  (Query(rate("vllm:num_preemptions_total", by="server", scale=" * 60"),
                         "{{server}}"),)),
            Panel("Time to first token", "From a request's arrival in vLLM to its first "
                  "sampled token (queueing and prefill), per replica. p95 rising while p50 "
                  "holds: requests queue behind others; both rising: prompts grow or the "
                  "replica is slow.", "s",
                  quantiles("vllm:time_to_first_token_seconds", by="server", qs=(0.5, 0.95))),
        )),
    ), (RUN_VARIABLE,))


def freshness() -> Dashboard:
    return Dashboard("consolerl-freshness", "console-rl / Freshness",
                     "How far samples lag the weights being trained (bounded staleness).", (
        Row("Versions", (
            Panel("Version lag per replica", "Trainer version minus each replica's version, "
                  "against the staleness bound. Above the bound: updates do not reach the "
                  "replica.", "short",
                  (Query(lag(), "{{server}}"),
                   Query(f"max({sel('consolerl_rollout_max_staleness')})", "bound"))),
            Panel("Trainer and replica versions", "The version the trainer published, the "
                  "one the orchestrator's admission read, and each replica's.", "short",
                  (Query(f"max({sel('consolerl_trainer_version')})", "trainer"),
                   Query(f"max({sel('consolerl_rollout_trainer_version')})", "admission"),
                   Query(f"max by (server) ({sel('consolerl_policy_weight_version')})",
                         "{{server}}"))),
        )),
        Row("Samples", (
            Panel("Sample staleness", "Trainer version minus the version that sampled each "
                  "trained turn. p90 at the bound for long: rollouts are slow relative to "
                  "training.", "short",
                  quantiles("consolerl_trainer_sample_staleness", qs=(0.5, 0.9, 1.0))),
            Panel("Groups by outcome", "Groups pushed to the stream, dropped (uniform "
                  "rewards: nothing to learn) and abandoned (env errors), per minute. Many "
                  "abandoned: the environment fails.", "opm",
                  (Query(rate("consolerl_rollout_groups_total", by="outcome", scale=" * 60"),
                         "{{outcome}}"),), stacked=True),
            Panel("Admission wait", "Workers waiting for staleness capacity, on average. "
                  "High: the trainer is the bottleneck; rollouts are held back so samples "
                  "stay fresh.", "short",
                  (Query(rate("consolerl_rollout_admission_wait_seconds_total"), "waiting"),)),
            Panel("Groups opened by task estimate", "Groups opened per minute, by the recent "
                  "success estimate of their task when the curriculum picked it (unscored, "
                  "low p < 0.2, mid, high p > 0.8). Mostly low and high after the first pass: "
                  "few tasks are near p = 0.5, so most groups will be uniform.", "opm",
                  (Query(rate("consolerl_curriculum_picks_total", by="estimate",
                              scale=" * 60"), "{{estimate}}"),), stacked=True),
        )),
    ), (RUN_VARIABLE,))


def stream() -> Dashboard:
    s = 'stream=~"$stream"'
    return Dashboard("consolerl-stream", "console-rl / Experience stream",
                     "The Redis stream between rollouts and the trainer (Redis exporter and the "
                     "trainer's consumer).", (
        Row("Stream", (
            Panel("Length", "Entries in the stream (XLEN; the trainer trims acknowledged "
                  "ones). Growing without bound: trimming is not keeping up.", "short",
                  (Query(f"max by (stream) (redis_stream_length{{{s}}})", "{{stream}}"),)),
            Panel("Pending and backlog", "Entries delivered to the consumer group and not "
                  "acknowledged (exporter and trainer view), and entries not yet delivered. "
                  "Backlog rising: rollouts outpace training.", "short",
                  (Query(f"max by (stream, group) "
                         f"(redis_stream_group_messages_pending{{{s}}})",
                         "pending {{group}}"),
                   Query(f"sum({sel('consolerl_trainer_stream_pending')})", "trainer pending"),
                   Query(f"sum({sel('consolerl_trainer_stream_backlog')})", "backlog"))),
            Panel("Consumer idle time", "Seconds since each consumer last read. Far above a "
                  "step's time: the trainer is stuck or gone (its entries wait to be "
                  "redelivered).", "s",
                  (Query(f"max by (group, consumer) "
                         f"(redis_stream_group_consumer_idle_seconds{{{s}}})",
                         "{{group}}/{{consumer}}"),)),
        )),
        Row("Delivery", (
            Panel("Deliveries", "Groups handed to the trainer per minute: new, and "
                  "redelivered (pending from an earlier trainer incarnation, after a crash).",
                  "opm", (Query(rate("consolerl_trainer_stream_delivered_total", by="kind",
                                     scale=" * 60"), "{{kind}}"),
                          Query(rate("consolerl_trainer_stream_acked_total", scale=" * 60"),
                                "acknowledged"))),
            Panel("Dead letters and losses", "Malformed entries moved to the dead-letter "
                  "stream and pending entries trimmed before training, per minute. Anything "
                  "above zero loses experience.", "opm",
                  (Query(rate("consolerl_trainer_stream_dead_lettered_total", scale=" * 60"),
                         "dead-lettered"),
                   Query(rate("consolerl_trainer_stream_lost_total", scale=" * 60"), "lost"),
                   Query(rate("consolerl_trainer_groups_skipped_total", scale=" * 60"),
                         "skipped (already trained)"))),
            Panel("Redis", "1 when the exporter reaches Redis. 0: stream and lease state are "
                  "invisible, and heartbeats may fail next.", "short",
                  (Query("min(redis_up)", "redis_up"),), kind="stat", width=6),
        )),
    ), (RUN_VARIABLE, Variable("stream", "label_values(redis_stream_length, stream)",
                               "stream")))


def reward() -> Dashboard:
    return Dashboard("consolerl-reward", "console-rl / Reward",
                     "Episodes judged from the ActionTrail audit log, and LLM judges.", (
        Row("Scores", (
            Panel("Score latency", "Time to score an episode (mostly waiting for its audit "
                  "events). Rising p90: the audit log is slow or throttling.", "s",
                  quantiles("consolerl_reward_score_seconds")),
            Panel("Verdict mix", "Scored episodes per minute by verdict. A shift to failure "
                  "right after a weight update: the update hurt; to undetermined: the log "
                  "cannot decide.", "opm",
                  (Query(rate("consolerl_reward_scores_total", by="verdict", scale=" * 60"),
                         "{{verdict}}"),), stacked=True),
            Panel("Undetermined rate", "Share of scores that were undetermined, and "
                  "undetermined scores per minute by cause (pending: events late; undecided: "
                  "no channel could decide). Above a quarter: rewards are mostly noise.",
                  "percentunit",
                  (Query(share("consolerl_reward_scores_total", 'verdict="undetermined"'),
                         "share"),
                   Query(rate("consolerl_reward_undetermined_total", by="cause",
                              scale=" * 60"), "per min {{cause}}"))),
            Panel("Decided by", "Scores per minute by the channel that decided (rule, "
                  "evidence, judges, none, env_error). Judges deciding most: the rules and "
                  "the evidence miss this task's outcome.", "opm",
                  (Query(rate("consolerl_reward_scores_total", by="decided_by",
                              scale=" * 60"), "{{decided_by}}"),), stacked=True),
        )),
        Row("ActionTrail and judges", (
            Panel("LookupEvents latency", "Time of one LookupEvents request. p90 above a "
                  "second: the audit API is overloaded.", "s",
                  quantiles("consolerl_reward_trail_query_seconds", qs=(0.5, 0.9))),
            Panel("LookupEvents outcomes", "Requests per second by outcome, and retries "
                  "after throttling. Throttled above zero for long: lower trail.qps.",
                  "reqps",
                  (Query(rate("consolerl_reward_trail_queries_total", by="outcome"),
                         "{{outcome}}"),
                   Query(rate("consolerl_reward_trail_throttled_retries_total"),
                         "throttled retries"))),
            Panel("Waiting for events", "How long scoring waited for an episode's audit "
                  "events, by whether they all arrived (complete) or the settle deadline "
                  "passed (pending).", "s",
                  (Query(quantile(0.9, "consolerl_reward_trail_wait_seconds", by="status"),
                         "p90 {{status}}"),)),
            Panel("Judge agreement", "Share of judged episodes whose valid votes all agreed. "
                  "Low: the judges disagree and their verdicts are unreliable.",
                  "percentunit",
                  (Query(share("consolerl_reward_judge_agreement_total",
                               'agreement="unanimous"'), "unanimous"),
                   Query(share("consolerl_reward_judge_votes_total", 'verdict="invalid"'),
                         "invalid votes"))),
            Panel("Infeasibility claims", "Episodes per minute by what the evidence channel "
                  "found when it checked how they ended: confirmed / refused (the claim is "
                  "backed: a doc defect), contradicted (the console has what the agent said "
                  "is missing: the agent's failure), unsupported, not_reported, unchecked. "
                  "Contradicted rising during training: the policy learned to give up.",
                  "opm",
                  (Query(rate("consolerl_reward_evidence_total", 'kind!="no_claim"', by="kind",
                              scale=" * 60"), "{{kind}}"),), stacked=True),
            Panel("Judge calls", "Judge calls per second by outcome (ok, invalid_reply, "
                  "http_error, transport_error, timeout, overloaded). Anything but ok: the "
                  "judge endpoint is failing, and episodes it should decide stay "
                  "undetermined.", "reqps",
                  (Query(rate("consolerl_reward_judge_calls_total", by="outcome"),
                         "{{outcome}}"),)),
        )),
    ), (RUN_VARIABLE,))


def trainer() -> Dashboard:
    return Dashboard("consolerl-trainer", "console-rl / Trainer",
                     "GRPO steps: where the time goes and whether learning is healthy.", (
        Row("Time", (
            Panel("Step time split", "Mean time per step in each part: read (waiting for "
                  "experience), forward_backward, optimizer, publish (weights to the "
                  "replicas), checkpoint. read dominating: rollouts are the bottleneck.", "s",
                  (Query(mean("consolerl_trainer_phase_seconds", by="phase"), "{{phase}}"),),
                  stacked=True),
            Panel("Step time", "Time of the optimizer step over all trainer workers.", "s",
                  quantiles("consolerl_trainer_step_seconds", qs=(0.5, 0.9))),
            Panel("Tokens per second", "Trained response tokens per second. Falling with a "
                  "constant batch: the trainer slowed down.", "short",
                  (Query(rate("consolerl_trainer_tokens_total"), "tokens/s"),)),
            Panel("Publish and checkpoint", "p90 time to publish weights to every replica and "
                  "to write a checkpoint.", "s",
                  (Query(quantile(0.9, "consolerl_trainer_weight_sync_seconds"), "publish"),
                   Query(quantile(0.9, "consolerl_trainer_checkpoint_seconds"),
                         "checkpoint"))),
        )),
        Row("Learning", (
            Panel("Loss", "Policy loss of the last step. Spikes or NaN: the step diverged.",
                  "short", (Query(f"max({sel('consolerl_trainer_loss')})", "loss"),), width=8),
            Panel("KL and clip fraction", "Approximate KL between sampling and trained "
                  "policy, and the share of clipped tokens. Both rising: updates too large "
                  "(lower the learning rate) or samples too stale.", "short",
                  (Query(f"max({sel('consolerl_trainer_kl')})", "kl"),
                   Query(f"max({sel('consolerl_trainer_clip_fraction')})", "clip fraction")),
                  width=8),
            Panel("Gradient norm", "Gradient norm before clipping. Growing by orders of "
                  "magnitude: training is unstable.", "short",
                  (Query(f"max({sel('consolerl_trainer_grad_norm')})", "grad norm"),),
                  width=8),
            Panel("Reward of trained samples", "Mean reward and success rate of the last "
                  "step's samples. Flat at zero: nothing to learn from.", "short",
                  (Query(f"max({sel('consolerl_trainer_reward_mean')})", "reward mean"),
                   Query(f"max({sel('consolerl_trainer_success_rate')})", "success rate"))),
            Panel("Since last step", "Seconds since the last optimizer step. Past 30 minutes "
                  "the trainer-stalled alert fires.", "s",
                  (Query(f"time() - max({sel('consolerl_trainer_last_step_timestamp_seconds')}"
                         ")", "seconds"),), kind="stat"),
        )),
    ), (RUN_VARIABLE,))


def local_cloud() -> Dashboard:
    return Dashboard("consolerl-local-cloud", "console-rl / Local cloud",
                     "The embedded cloud (console_sim): its OpenAPI, its console, its audit "
                     "log.", (
        Row("OpenAPI", (
            Panel("Calls by action", "OpenAPI calls per second by product and action "
                  "(provisioning, clean-up, ActionTrail lookups).", "reqps",
                  (Query(rate("consolerl_cloud_sim_requests_total", by="product, action"),
                         "{{product}} {{action}}"),), stacked=True),
            Panel("Calls by result code", "OpenAPI calls per second by result (Success or "
                  "the error code). Error codes rising: provisioning or clean-up fails.",
                  "reqps", (Query(rate("consolerl_cloud_sim_requests_total", by="code"),
                                  "{{code}}"),), stacked=True),
            Panel("API latency", "p90 time to answer an OpenAPI request, by product.", "s",
                  (Query(quantile(0.9, "consolerl_cloud_sim_request_duration_seconds",
                                  by="product"), "{{product}}"),)),
            Panel("Auth failures", "Requests refused before an action ran, by error code. "
                  "Above zero: bad keys, clock skew, or a signing bug.", "reqps",
                  (Query(rate("consolerl_cloud_sim_auth_failures_total", by="code"),
                         "{{code}}"),)),
        )),
        Row("Console and audit log", (
            Panel("Console operations", "Changes made from the console per second by product "
                  "and result code: what agents actually did.", "reqps",
                  (Query(rate("consolerl_console_sim_operations_total", by="product, code"),
                         "{{product}} {{code}}"),), stacked=True),
            Panel("Console page latency", "p90 time to answer a console page, by handler. "
                  "Slow pages slow every step.", "s",
                  (Query(quantile(0.9, "consolerl_console_sim_page_duration_seconds",
                                  by="page"), "{{page}}"),)),
            Panel("Audit events", "Audit events appended per second, by service and type.",
                  "reqps", (Query(rate("consolerl_cloud_sim_audit_events_total",
                                       by="service, event_type"),
                                  "{{service}} {{event_type}}"),), stacked=True),
            Panel("Audit-event delivery delay", "From an event's time to the first "
                  "LookupEvents answer that returned it. Rising: the reward waits longer for "
                  "evidence (and more scores end undetermined).", "s",
                  quantiles("consolerl_cloud_sim_audit_delivery_seconds", qs=(0.5, 0.9))),
            Panel("Sign-ins and sessions", "Console sign-ins per minute by outcome, and live "
                  "sessions. Failures rising: accounts are being refused.", "short",
                  (Query(rate("consolerl_console_sim_signins_total", by="outcome",
                              scale=" * 60"), "sign-ins/min {{outcome}}"),
                   Query(f"max({sel('consolerl_console_sim_sessions')})", "sessions"))),
        )),
    ), (RUN_VARIABLE,))


def jobs_api() -> Dashboard:
    return Dashboard("consolerl-jobs-api", "console-rl / Jobs API",
                     "The jobs API other teams call: what it keeps, per team, and the Redis it "
                     "shares with training.", (
        Row("Storage", (
            Panel("Storage per team", "Bytes the jobs API keeps per team until retention "
                  "removes them (api.retention): blobs = screenshots in the blob store, redis "
                  "= finished jobs' results in Redis. Growing without levelling off: "
                  "retention is too long for the load, or the sweep is failing "
                  "(consolerl_jobs_sweep_errors_total).", "bytes",
                  (Query(f"max by (team, kind) ({sel('consolerl_jobs_storage_bytes')})",
                         "{{team}} {{kind}}"),), stacked=True),
            Panel("Redis memory", "Memory Redis uses and its maxmemory (0: no limit), from "
                  "the Redis exporter. At maxmemory Redis refuses writes for training, leases "
                  "and the API alike (ConsoleRLRedisNearMaxmemory fires at 85%).", "bytes",
                  (Query("max(redis_memory_used_bytes)", "used"),
                   Query("max(redis_memory_max_bytes)", "maxmemory"))),
        )),
    ), (RUN_VARIABLE,))


DASHBOARDS = (overview, env_pool, policy_serving, freshness, stream, reward, trainer,
              local_cloud, jobs_api)


# ---- rendering -----------------------------------------------------------------------------------

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    custom: dict[str, Any] = {}
    if panel.kind == "timeseries":
        custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if panel.stacked else 0,
                  "showPoints": "never", "spanNulls": True,
                  "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"}}
    out: dict[str, Any] = {
        "id": pid, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit, "custom": custom}, "overrides": []},
        "options": ({"legend": {"displayMode": "list", "placement": "bottom",
                                "showLegend": True},
                     "tooltip": {"mode": "multi", "sort": "desc"}}
                    if panel.kind == "timeseries" else
                    {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                     "colorMode": "value", "graphMode": "area"}),
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr,
                     "legendFormat": q.legend or "__auto", "range": True}
                    for i, q in enumerate(panel.queries)],
    }
    return out


def _variable_json(var: Variable) -> dict[str, Any]:
    return {"name": var.name, "label": var.label or var.name, "type": "query",
            "datasource": DATASOURCE, "query": {"query": var.query, "refId": var.name},
            "definition": var.query, "refresh": 2, "includeAll": True, "multi": True,
            "allValue": var.all_value, "current": {"text": "All", "value": "$__all"},
            "sort": 1}


def render(dashboard: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in dashboard.rows:
        panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, line_h = pid + 1, y + 1, 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_h = 0, y + line_h, 0
            panels.append(_panel_json(panel, pid, x, y))
            pid, x, line_h = pid + 1, x + panel.width, max(line_h, panel.height)
        y += line_h
    templating = [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                   "query": "prometheus", "current": {}, "hide": 0, "refresh": 1,
                   "regex": ""}]
    templating += [_variable_json(v) for v in dashboard.variables]
    return {
        "uid": dashboard.uid, "title": dashboard.title, "description": dashboard.description,
        "tags": ["console-rl"], "timezone": "browser", "editable": True,
        "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "templating": {"list": templating},
        "annotations": {"list": []},
        "links": [{"title": "console-rl", "type": "dashboards", "tags": ["console-rl"],
                   "asDropdown": True, "includeVars": True, "keepTime": True}],
        "panels": panels,
    }


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{d.uid}.json": json.dumps(render(d), indent=2, sort_keys=True) + "\n"
            for d in (make() for make in DASHBOARDS)}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    files = rendered()
    for stale in set(p.name for p in OUT.glob("*.json")) - set(files):
        (OUT / stale).unlink()
    for name, text in files.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(files)} dashboards to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
