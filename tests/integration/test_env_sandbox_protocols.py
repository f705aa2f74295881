"""The env worker's sandbox holds for every protocol a page can open, not only for the HTTP
requests DevTools interception sees: a WebSocket to another port of the same host, WebRTC's
UDP (STUN) and WebTransport (QUIC) never leave the browser, and the refusals are counted by
kind. The console's own origin keeps working (the episode's pages load and act)."""
from __future__ import annotations

import asyncio
import socket

import pytest

from consolerl.types import EpisodeSpec
from env_workers.driver import expect_observation
from env_workers.worker import EnvWorker, WorkerConfig
from tests.conftest import run_async as run


class _Listeners:
    """A TCP socket and two UDP sockets (one for STUN, one for QUIC) on free 127.0.0.1 ports
    that record whatever reaches them."""

    def __init__(self) -> None:
        self.tcp_hits: list[bytes] = []
        self.udp_hits: list[bytes] = []
        self.quic_hits: list[bytes] = []
        self._server: asyncio.base_events.Server | None = None
        self._udp: list[asyncio.DatagramTransport] = []
        self.tcp_port = self.udp_port = self.quic_port = 0

    async def __aenter__(self) -> "_Listeners":
        async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                self.tcp_hits.append(await asyncio.wait_for(reader.read(4096), 2) or b"<open>")
            except TimeoutError:
                self.tcp_hits.append(b"<open>")
            writer.close()
        self._server = await asyncio.start_server(on_tcp, "127.0.0.1", 0)
        self.tcp_port = self._server.sockets[0].getsockname()[1]
        self.udp_port = await self._udp_listener(self.udp_hits)
        self.quic_port = await self._udp_listener(self.quic_hits)
        return self

    async def _udp_listener(self, hits: list[bytes]) -> int:
        class Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr) -> None:
                hits.append(data)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            Udp, local_addr=("127.0.0.1", 0), family=socket.AF_INET)
        self._udp.append(transport)
        return transport.get_extra_info("sockname")[1]

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for transport in self._udp:
            transport.close()


HOSTILE = """async ([tcp, udp, quic]) => {
    const out = {};
    await new Promise(done => {
        const ws = new WebSocket('ws://127.0.0.1:' + tcp + '/ws');
        ws.onopen = () => { out.websocket = 'open'; done(); };
        ws.onerror = () => { out.websocket = 'error'; done(); };
        setTimeout(done, 3000);
    });
    try {
        const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.1:' + udp}]});
        pc.createDataChannel('x');
        await pc.setLocalDescription(await pc.createOffer());
        await new Promise(done => { pc.onicegatheringstatechange = () => {
            if (pc.iceGatheringState === 'complete') done(); }; setTimeout(done, 3000); });
        out.webrtc = pc.iceGatheringState;
        pc.close();
    } catch (e) { out.webrtc = 'threw ' + e; }
    try {
        const wt = new WebTransport('https://127.0.0.1:' + quic + '/wt');
        out.webtransport = await Promise.race([wt.ready.then(() => 'ready'),
            new Promise(r => setTimeout(() => r('pending'), 3000))]);
    } catch (e) { out.webtransport = 'refused'; }
    return out; }"""


def test_no_protocol_leaves_the_sandbox(cloud, accounts):
    async def flow():
        worker = EnvWorker(WorkerConfig(console_url=cloud.url))
        try:
            async with _Listeners() as outside:
                expect_observation(await worker.reset(EpisodeSpec("/console/ram/users"),
                                                      accounts[4]))
                page = worker._episode.page   # the test plays a hostile page script
                before = {kind: worker.metrics.blocked.labels(kind)._value.get()
                          for kind in ("websocket", "tunnel")}
                outcomes = await page.evaluate(HOSTILE, [outside.tcp_port, outside.udp_port,
                                                         outside.quic_port])
                await asyncio.sleep(1.0)
                leaks = {"websocket": outside.tcp_hits[:1], "stun": outside.udp_hits[:1],
                         "quic": outside.quic_hits[:1]}
                assert leaks == {"websocket": [], "stun": [], "quic": []}, (outcomes, leaks)
                assert outcomes["websocket"] == "error", outcomes
                assert outcomes["webtransport"] == "refused", outcomes
                # Counted by kind, and listed with the episode's other refusals.
                websocket = worker.metrics.blocked.labels("websocket")._value.get()
                assert websocket == before["websocket"] + 1
                assert any(line.startswith("websocket: ") and f":{outside.tcp_port}" in line
                           for line in worker.blocked()), worker.blocked()
                # The console itself still works after the hostile script.
                result = await worker.step(f'goto("{cloud.url}/console/oss/buckets")')
                assert not result.observation.last_action_error
                # The browser's own calls home are not charged to the episode.
                assert all(not line.startswith("browser: ") for line in worker.blocked())
                assert "/console/oss/buckets" in result.observation.url
        finally:
            await worker.shutdown()
    run(flow())
