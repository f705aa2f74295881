"""The egress guard refuses every connection and names what each one was."""
from __future__ import annotations

import asyncio

import pytest

from env_workers.egress import EgressGuard
from tests.conftest import run_async as run

WS = (b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:9\r\nUpgrade: websocket\r\n"
      b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n")


@pytest.mark.parametrize("head,tunnel,kind,target", [
    (b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n", WS, "websocket",
     "ws://127.0.0.1:9/ws"),
    (b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00", "tls",
     "evil.example:443"),
    (b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n", b"", "tunnel", "evil.example:443"),
    (b"CONNECT 10.0.0.1:25 HTTP/1.1\r\n\r\n", b"EHLO x\r\n", "tunnel", "10.0.0.1:25"),
    (b"GET http://evil.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n", b"", "http",
     "http://evil.example/x"),
    (b"GET http://evil.example/ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", b"", "websocket",
     "http://evil.example/ws"),
    (b"CONNECT accounts.google.com:443 HTTP/1.1\r\n\r\n", b"\x16\x03\x01", "browser",
     "accounts.google.com:443"),
])
def test_each_attempt_is_refused_and_classified(head, tunnel, kind, target):
    async def flow():
        seen: list[tuple[str, str]] = []
        guard = await EgressGuard(lambda k, t: seen.append((k, t)), peek_s=0.3).start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", guard.port)
            writer.write(head)
            await writer.drain()
            answer = await reader.readuntil(b"\r\n\r\n")
            if tunnel:
                writer.write(tunnel)
                await writer.drain()
            rest = await asyncio.wait_for(reader.read(), 3)   # closed, nothing forwarded
            writer.close()
            for _ in range(50):
                if seen:
                    break
                await asyncio.sleep(0.02)
            return answer, rest, seen
        finally:
            await guard.close()
    answer, rest, seen = run(flow())
    assert seen == [(kind, target)]
    assert rest == b""
    assert answer.startswith(b"HTTP/1.1 200" if head.startswith(b"CONNECT") and kind != "browser"
                             else b"HTTP/1.1 403")


def test_the_switches_leave_only_the_console_origin_direct():
    guard = EgressGuard(lambda k, t: None)
    guard.port = 4321
    args = guard.chromium_args("http://127.0.0.1:8080")
    assert "--proxy-server=http://127.0.0.1:4321" in args
    assert "--proxy-bypass-list=<-loopback>;http://127.0.0.1:8080" in args
    assert "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1" in args
    assert "--force-webrtc-ip-handling-policy=disable_non_proxied_udp" in args
    https = guard.chromium_args("https://console.example.com")
    assert "--proxy-bypass-list=<-loopback>;https://console.example.com:443" in https
