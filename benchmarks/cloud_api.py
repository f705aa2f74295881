"""Benchmark of the local cloud: ``python -m benchmarks.cloud_api --json``.

Starts a server process on a free port with a fresh state dir, then measures

- ``signed_calls_per_s``: ACS3-signed OpenAPI calls answered per second (every call verified,
  nonce-checked, executed and audited), driven by ``--clients`` processes over keep-alive
  connections with a light signer (the same canonicalisation as the SDK, see
  ``infra.console_sim.signing``);
  the call mix is GetUser, DescribeSecurityGroupAttribute, AuthorizeSecurityGroup and
  RevokeSecurityGroup (half reads, half writes).
- ``sdk_calls_per_s``: the same through the official SDK from one thread (client-bound).
- ``lookup_p50_ms`` / ``lookup_p95_ms``: LookupEvents latency (MaxResults 50, no filter, an
  EventName filter and a ResourceName filter in turn) with ``--events`` audit events stored for
  the account, all made by real calls.

``python -m benchmarks.cloud_console --json`` (or ``--console`` here, the same run) measures
the console web UI instead, in real headless Chromium (the system's, see
``consolerl.chromium``) driven by Playwright, signed in as account 0:

- ``list_page_p50_ms`` / ``list_page_p95_ms``: the ECS instance list with 100 rows per page
  (``/console/ecs/instances?size=100``) over 200 Running instances made through the API. One
  sample is the wall time of ``page.goto(url, wait_until="load")``: request, server render,
  transfer, parse, stylesheet and script, up to the load event (plus Playwright's round trip,
  well under a millisecond locally). Every sample checks that 100 rows are shown.
  ``list_page_default_size_*``: the same list at the console's default 20 rows per page.
  ``navigation_floor_p50_ms``: the same measurement of ``/healthz`` (a tiny JSON document):
  what any navigation costs in this browser on this machine, before the console does anything.
- ``form_submit_p50_ms`` / ``form_submit_p95_ms``: the RAM "Create User" form. The form is
  loaded untimed; one sample is the wall time from the click on "Create" to the load event of
  the user's page the browser is redirected to (POST, CreateUser through the API action,
  303, GET of the detail page). At the end ListUsers must show exactly one user per submit.

``--console-samples`` samples of each after 3 warm-ups.

Prints one JSON object with ``--json``; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from consolerl.accounts import load_accounts
from infra.cloud import CloudClient, CloudConfig, Credentials
from infra.console_sim.config import DEFAULT_ACCOUNTS_FILE
from infra.console_sim.products import rpc_products
from infra.console_sim.signing import ACS3, EMPTY_SHA256, acs3_signature, acs3_string_to_sign
from infra.local_cloud import LocalCloud, free_port

VERSIONS = {p.name: p.version for p in rpc_products().values()}


class LightClient:
    """A minimal ACS3 signer over one keep-alive connection (benchmark driver only)."""

    def __init__(self, port: int, key: str, secret: str):
        self.port, self.key, self.secret = port, key, secret
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, product: str, action: str, params: dict[str, str]) -> tuple[int, dict]:
        headers = {"host": f"127.0.0.1:{self.port}", "x-acs-action": action,
                   "x-acs-version": VERSIONS[product],
                   "x-acs-date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "x-acs-signature-nonce": uuid.uuid4().hex, "x-acs-content-sha256": EMPTY_SHA256}
        signed = sorted(headers)
        signature = acs3_signature(self.secret, acs3_string_to_sign(
            "POST", "/", params, headers, signed, EMPTY_SHA256))
        headers["authorization"] = (f"{ACS3} Credential={self.key},SignedHeaders="
                                    f"{';'.join(signed)},Signature={signature}")
        query = "&".join(f"{k}={quote(v, safe='~')}" for k, v in params.items())
        self.conn.request("POST", f"/?{query}", headers=headers)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _worker(port: int, key: str, secret: str, sg_id: str, user: str, seconds: float,
            index: int, out: mp.Queue) -> None:
    client = LightClient(port, key, secret)
    calls = errors = 0
    deadline = time.perf_counter() + seconds
    port_no = 1000 + index * 1000
    while time.perf_counter() < deadline:
        port_no += 1
        rule = {"RegionId": "cn-hangzhou", "SecurityGroupId": sg_id, "IpProtocol": "TCP",
                "PortRange": f"{port_no}/{port_no}", "SourceCidrIp": "10.0.0.0/8"}
        for product, action, params in (
                ("Ram", "GetUser", {"UserName": user}),
                ("Ecs", "AuthorizeSecurityGroup", rule),
                ("Ecs", "DescribeSecurityGroupAttribute", {"RegionId": "cn-hangzhou",
                                                          "SecurityGroupId": sg_id}),
                ("Ecs", "RevokeSecurityGroup", rule)):
            status, _ = client.call(product, action, params)
            calls += 1
            errors += status != 200
    out.put((calls, errors))


def run(events: int, seconds: float, clients: int) -> dict:
    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    state = Path(tempfile.mkdtemp(prefix="cloud-bench-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "infra.console_sim", "--port", str(port),
                               "--state-dir", str(state), "--lookup-qps", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                LightClient(port, accounts[0].access_key_id, accounts[0].access_key_secret).call(
                    "Ram", "ListUsers", {})
                break
            except OSError:
                time.sleep(0.1)
        a = accounts[0]
        setup = LightClient(port, a.access_key_id, a.access_key_secret)
        setup.call("Ram", "CreateUser", {"UserName": "bench-user"})
        _, body = setup.call("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou"})
        sg_id = body["SecurityGroupId"]

        _progress(f"throughput: {clients} client processes for {seconds:g}s")
        queue: mp.Queue = mp.Queue()
        procs = [mp.Process(target=_worker, args=(port, a.access_key_id, a.access_key_secret,
                                                  sg_id, "bench-user", seconds, i, queue))
                 for i in range(clients)]
        started = time.perf_counter()
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        elapsed = time.perf_counter() - started
        for p in procs:
            p.join()
        total = sum(r[0] for r in results)
        errors = sum(r[1] for r in results)

        _progress("official SDK client, one thread")
        sdk = CloudClient(CloudConfig(endpoint=f"127.0.0.1:{port}"),
                          Credentials(a.access_key_id, a.access_key_secret))
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min(seconds, 3.0):
            sdk.rpc("Ram", "GetUser", {"UserName": "bench-user"})
            n += 1
        sdk_rate = n / (time.perf_counter() - t0)

        # Seed the audit log of a second account with real calls.
        b = accounts[1]
        seeder = LightClient(port, b.access_key_id, b.access_key_secret)
        _, body = seeder.call("Ecs", "CreateSecurityGroup", {"RegionId": "cn-hangzhou"})
        seed_sg = body["SecurityGroupId"]
        for i in range(events - 1):
            if i % 2000 == 0:
                _progress(f"seeding audit events: {i}/{events}")
            if i % 3 == 0:
                seeder.call("Ram", "CreateUser", {"UserName": f"seed-{i}"})
            else:
                seeder.call("Ecs", "DescribeSecurityGroupAttribute",
                            {"RegionId": "cn-hangzhou", "SecurityGroupId": seed_sg})
        _progress("LookupEvents latency")
        queries = [{}, {"LookupAttribute.1.Key": "EventName", "LookupAttribute.1.Value": "CreateUser"},
                   {"LookupAttribute.1.Key": "ResourceName", "LookupAttribute.1.Value": seed_sg}]
        latencies = []
        for i in range(300):
            params = {"MaxResults": "50", **queries[i % 3]}
            t = time.perf_counter()
            status, body = seeder.call("Actiontrail", "LookupEvents", params)
            latencies.append((time.perf_counter() - t) * 1000)
            assert status == 200 and len(body["Events"]) == 50, body
        latencies.sort()
        db = sqlite3.connect(state / "cloud.db")
        stored = db.execute("SELECT COUNT(*) FROM events WHERE account_id=?",
                            (b.account_id,)).fetchone()[0]
        db.close()
        return {
            "signed_calls_per_s": round(total / elapsed, 1),
            "signed_calls": total,
            "signed_call_errors": errors,
            "clients": clients,
            "sdk_calls_per_s": round(sdk_rate, 1),
            "lookup_p50_ms": round(statistics.median(latencies), 2),
            "lookup_p95_ms": round(latencies[int(len(latencies) * 0.95)], 2),
            "lookup_events_stored": stored,
            "lookup_max_results": 50,
        }
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(state, ignore_errors=True)


# ---- console web UI --------------------------------------------------------------------------
CONSOLE_SUMMARY = ("Benchmark of the local cloud's console web UI in headless Chromium: "
                   "``python -m benchmarks.cloud_console --json``.")
CONSOLE_REGION = "cn-hangzhou"
CONSOLE_INSTANCES = 200
CONSOLE_PAGE_SIZE = 100
CONSOLE_WARMUPS = 3


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return round(statistics.median(ordered), 2), round(p95, 2)


def _wait_for(what: str, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _instance_statuses(client: CloudClient) -> list[str]:
    statuses: list[str] = []
    page = 1
    while True:
        body = client.rpc("Ecs", "DescribeInstances", {"RegionId": CONSOLE_REGION,
                                                        "PageSize": "100", "PageNumber": str(page)})
        batch = body["Instances"]["Instance"]
        statuses += [i["Status"] for i in batch]
        if not batch or len(statuses) >= body["TotalCount"]:
            return statuses
        page += 1


def _seed_instances(client: CloudClient) -> int:
    """200 instances in one vSwitch, all Running; returns how many DescribeInstances shows."""
    vpc_id = client.rpc("Vpc", "CreateVpc", {"RegionId": CONSOLE_REGION,
                                             "CidrBlock": "192.168.0.0/16"})["VpcId"]
    _wait_for("the VPC", lambda: client.rpc("Vpc", "DescribeVpcs", {
        "RegionId": CONSOLE_REGION, "VpcId": vpc_id})["Vpcs"]["Vpc"][0]["Status"] == "Available")
    vsw_id = client.rpc("Vpc", "CreateVSwitch", {"RegionId": CONSOLE_REGION, "VpcId": vpc_id,
                                                 "ZoneId": "cn-hangzhou-h",
                                                 "CidrBlock": "192.168.0.0/20"})["VSwitchId"]
    _wait_for("the vSwitch", lambda: client.rpc("Vpc", "DescribeVSwitches", {
        "RegionId": CONSOLE_REGION, "VSwitchId": vsw_id})["VSwitches"]["VSwitch"][0]["Status"]
        == "Available")
    sg_id = client.rpc("Ecs", "CreateSecurityGroup", {"RegionId": CONSOLE_REGION,
                                                      "VpcId": vpc_id})["SecurityGroupId"]
    for batch in range(CONSOLE_INSTANCES // 100):
        _progress(f"seeding instances: {batch * 100}/{CONSOLE_INSTANCES}")
        client.rpc("Ecs", "RunInstances", {
            "RegionId": CONSOLE_REGION, "InstanceType": "ecs.g7.large",
            "ImageId": "ubuntu_22_04_x64_20G_alibase_20240710.vhd", "VSwitchId": vsw_id,
            "SecurityGroupId": sg_id, "Amount": "100"})
    _progress("waiting until all instances are Running")
    statuses: list[str] = []

    def all_running() -> bool:
        statuses[:] = _instance_statuses(client)
        return len(statuses) == CONSOLE_INSTANCES and all(s == "Running" for s in statuses)
    _wait_for("the instances to be Running", all_running)
    return len(statuses)


def _time_loads(page, url: str, rows: int | None, samples: int) -> list[float]:
    """Wall times of ``page.goto(url)`` to the load event, after warm-ups; each load must
    answer 200 and show ``rows`` table rows (None: not a console page)."""
    shown = page.locator("#live tbody tr")
    times: list[float] = []
    for i in range(CONSOLE_WARMUPS + samples):
        t = time.perf_counter()
        response = page.goto(url, wait_until="load")
        elapsed = (time.perf_counter() - t) * 1000
        if response is None or response.status != 200 or (
                rows is not None and shown.count() != rows):
            raise RuntimeError(f"{url}: status {response and response.status}, "
                               f"{shown.count()} rows (expected {rows})")
        if i >= CONSOLE_WARMUPS:
            times.append(elapsed)
    return times


def run_console(samples: int) -> dict:
    from playwright.sync_api import sync_playwright

    from consolerl.chromium import chromium_path

    accounts = load_accounts(DEFAULT_ACCOUNTS_FILE)
    a = accounts[0]
    executable = chromium_path()
    state = Path(tempfile.mkdtemp(prefix="cloud-bench-console-"))
    server = LocalCloud(state, ("--lookup-qps", "0", "--transition", "0.2",
                                "--network-ready", "0.1"))
    try:
        base = server.start().url
        client = CloudClient(CloudConfig(endpoint=server.endpoint),
                             Credentials(a.access_key_id, a.access_key_secret))
        resources = _seed_instances(client)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=executable)
            try:
                version = browser.version
                page = browser.new_context().new_page()
                _progress(f"Chromium {version}: signing in as {a.login_name}")
                page.goto(f"{base}/console/signin")
                page.get_by_label("Account name").fill(a.login_name)
                page.get_by_label("Password").fill(a.password)
                with page.expect_navigation(url=f"{base}/console/", wait_until="load"):
                    page.get_by_role("button", name="Sign In").click()

                _progress(f"list pages: {CONSOLE_WARMUPS} warm-ups, {samples} samples each")
                list_ms = _time_loads(page, f"{base}/console/ecs/instances?size="
                                      f"{CONSOLE_PAGE_SIZE}", CONSOLE_PAGE_SIZE, samples)
                default_ms = _time_loads(page, f"{base}/console/ecs/instances", 20, samples)
                floor_ms = _time_loads(page, f"{base}/healthz", None, samples)

                form_url = f"{base}/console/ram/users/create"
                submit_ms: list[float] = []
                _progress(f"form submit: {CONSOLE_WARMUPS} warm-ups, {samples} samples")
                for i in range(CONSOLE_WARMUPS + samples):
                    name = f"bench-user-{i + 1:04d}"
                    page.goto(form_url, wait_until="load")
                    page.get_by_label("Logon Name").fill(name)
                    button = page.get_by_role("button", name="Create")
                    t = time.perf_counter()
                    with page.expect_navigation(wait_until="load") as navigation:
                        button.click()
                    elapsed = (time.perf_counter() - t) * 1000
                    response = navigation.value
                    if (response is None or response.status != 200
                            or page.url != f"{base}/console/ram/users/{name}"):
                        raise RuntimeError(f"form submit of {name}: landed on {page.url} "
                                           f"(status {response and response.status})")
                    if i >= CONSOLE_WARMUPS:
                        submit_ms.append(elapsed)
            finally:
                browser.close()

        users = client.rpc("Ram", "ListUsers", {"MaxItems": "1000"})["Users"]["User"]
        created = sum(u["UserName"].startswith("bench-user-") for u in users)
        if created != CONSOLE_WARMUPS + samples or len(users) != created:
            raise RuntimeError(f"expected {CONSOLE_WARMUPS + samples} users, ListUsers shows "
                               f"{len(users)} ({created} made by the benchmark)")
        list_p50, list_p95 = _percentiles(list_ms)
        default_p50, default_p95 = _percentiles(default_ms)
        submit_p50, submit_p95 = _percentiles(submit_ms)
        return {
            "list_page_p50_ms": list_p50,
            "list_page_p95_ms": list_p95,
            "list_page_samples": len(list_ms),
            "list_page_rows": CONSOLE_PAGE_SIZE,
            "list_page_resources": resources,
            "list_page_default_size_p50_ms": default_p50,
            "list_page_default_size_p95_ms": default_p95,
            "navigation_floor_p50_ms": _percentiles(floor_ms)[0],
            "form_submit_p50_ms": submit_p50,
            "form_submit_p95_ms": submit_p95,
            "form_submit_samples": len(submit_ms),
            "users_created": created,
            "warmups": CONSOLE_WARMUPS,
            "chromium_version": version,
        }
    finally:
        server.stop()
        shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str] | None = None, *, console: bool = False) -> int:
    """The command line of ``benchmarks.cloud_api`` and, with ``console``, of
    ``benchmarks.cloud_console`` (the console run alone: ``--json`` and ``--console-samples``)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{'cloud_console' if console else 'cloud_api'}",
        description=CONSOLE_SUMMARY if console else __doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if not console:
        parser.add_argument("--events", type=int, default=10_000)
        parser.add_argument("--seconds", type=float, default=8.0)
        parser.add_argument("--clients", type=int, default=2)
        parser.add_argument("--console", action="store_true",
                            help="measure the console web UI in headless Chromium instead "
                            "(the same as python -m benchmarks.cloud_console)")
    parser.add_argument("--console-samples", type=int, default=30, metavar="N",
                        help="samples of each console measurement (default: 30)")
    args = parser.parse_args(argv)
    if args.console_samples < 1:
        parser.error(f"--console-samples must be at least 1, got {args.console_samples}")
    if console or args.console:
        result = run_console(args.console_samples)
    else:
        result = run(args.events, args.seconds, args.clients)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
