"""Benchmark of the local cloud: ``python -m infra.console_sim.bench --json``.

Starts a server process on a free port with a fresh state dir, then measures

- ``signed_calls_per_s``: ACS3-signed OpenAPI calls answered per second (every call verified,
  nonce-checked, executed and audited), driven by ``--clients`` processes over keep-alive
  connections with a light signer (the same canonicalisation as the SDK, see ``signing``);
  the call mix is GetUser, DescribeSecurityGroupAttribute, AuthorizeSecurityGroup and
  RevokeSecurityGroup (half reads, half writes).
- ``sdk_calls_per_s``: the same through the official SDK from one thread (client-bound).
- ``lookup_p50_ms`` / ``lookup_p95_ms``: LookupEvents latency (MaxResults 50, no filter, an
  EventName filter and a ResourceName filter in turn) with ``--events`` audit events stored for
  the account, all made by real calls.

Prints one JSON object with ``--json``; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from infra.cloud import CloudClient, CloudConfig, Credentials

from .accounts import load_accounts
from .config import DEFAULT_ACCOUNTS_FILE
from .products import rpc_products
from .signing import ACS3, EMPTY_SHA256, acs3_signature, acs3_string_to_sign

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    port = _free_port()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.console_sim.bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=2)
    args = parser.parse_args(argv)
    result = run(args.events, args.seconds, args.clients)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
