"""The browser's only way out: a local proxy that refuses every connection and says what it was.

DevTools interception (the worker's ``Fetch`` filter) sees HTTP requests only. A page script
can open other kinds of connection it never pauses: a WebSocket handshake, a preconnect, and
whatever protocol comes next. So Chromium is launched with this proxy as its fixed proxy for
everything except the console's own origin (``--proxy-bypass-list``; the implicit loopback
bypass removed), its non-proxied UDP switched off (WebRTC), and hostname resolution mapped
to nothing except the console's host (no DNS from a page). What reaches the proxy therefore
left the console's origin by a path the ``Fetch`` filter did not stop; the proxy forwards
nothing, classifies the attempt and reports it:

- ``websocket``: a WebSocket handshake (``ws://`` in a CONNECT tunnel, or an ``Upgrade``);
- ``tls``: a TLS hello in a tunnel (``wss://``, an ``https://`` connection outside ``Fetch``);
- ``tunnel``: a CONNECT that sent nothing we know (a preconnect, another protocol);
- ``http``: a plain proxied HTTP request (one the ``Fetch`` filter did not pause);
- ``browser``: a tunnel to the browser vendor's own services (form autofill queries, account
  checks): Chromium's calls home, not the page's. Refused like the rest, but reported apart
  so that they are not charged to the episode (a page that hides its attempts there gains
  nothing: they are refused all the same).

The tunnel is acknowledged (``200``) only so that its first bytes can be read and classified;
nothing is ever forwarded, and the connection is closed after at most ``peek_s``.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

log = logging.getLogger("env_workers.egress")

KINDS = ("websocket", "tls", "tunnel", "http", "browser")
# Where Chromium itself connects (never the console; a page's wss:// there is refused too).
BROWSER_SERVICES = (".google.com", ".googleapis.com", ".gstatic.com", ".gvt1.com",
                    ".googleusercontent.com", ".doubleclick.net")
MAX_HEAD = 16 * 1024


class EgressGuard:
    """A refusing HTTP proxy on ``127.0.0.1`` (a free port), reporting each attempt through
    ``on_blocked(kind, target)``."""

    def __init__(self, on_blocked: Callable[[str, str], None], peek_s: float = 1.0) -> None:
        self._on_blocked = on_blocked
        self._peek_s = peek_s
        self._server: asyncio.base_events.Server | None = None
        self._open: set[asyncio.Task] = set()
        self.port = 0

    async def start(self) -> "EgressGuard":
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._open):
                task.cancel()
            self._server = None

    def chromium_args(self, console_url: str) -> list[str]:
        """Switches that make this proxy the only way out except the console's origin."""
        parts = urlsplit(console_url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        bypass = f"{parts.scheme}://{host}:{port}"
        resolve = f"MAP * ~NOTFOUND , EXCLUDE {host}"
        return [f"--proxy-server=http://127.0.0.1:{self.port}",
                f"--proxy-bypass-list=<-loopback>;{bypass}",
                f"--host-resolver-rules={resolve}",
                "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
                "--webrtc-ip-handling-policy=disable_non_proxied_udp"]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._open.add(task)
        try:
            kind, target = await self._classify(reader, writer)
            self._on_blocked(kind, target)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            if task is not None:
                self._open.discard(task)
            writer.close()

    async def _classify(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> tuple[str, str]:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._peek_s)
        if len(head) > MAX_HEAD:
            return "http", "(an oversized request head)"
        line, _, rest = head.decode("latin-1").partition("\r\n")
        method, _, remainder = line.partition(" ")
        target = remainder.rpartition(" ")[0] or remainder
        if method.upper() != "CONNECT":
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
            upgrade = "upgrade: websocket" in rest.lower()
            return ("websocket" if upgrade else "http"), target
        host = target.rsplit(":", 1)[0].lower()
        if host.endswith(BROWSER_SERVICES) or host.lstrip(".") in (
                suffix.lstrip(".") for suffix in BROWSER_SERVICES):
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return "browser", target
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        try:
            first = await asyncio.wait_for(reader.read(4096), self._peek_s)
        except TimeoutError:
            return "tunnel", target
        if first[:1] == b"\x16":
            return "tls", target
        text = first.decode("latin-1")
        if "upgrade: websocket" in text.lower():
            path = text.split(" ", 2)[1] if text.count(" ") >= 2 else "/"
            return "websocket", f"ws://{target}{path}"
        return "tunnel", target

