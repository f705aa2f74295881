"""A policy replica paused for a trainer step holds new requests until resumed, and lifts the
pause itself after max_s should the trainer never resume it."""
from __future__ import annotations

import asyncio

from rollout_service.agent import Generation
from rollout_service.policy import PolicyServer, SamplingParams
from tests.conftest import run_async


class CountingEngine:
    """Stands in for the model: the test is about the server's gate."""

    def __init__(self):
        self.version, self.busy_s, self.calls = 0, 0.0, 0

    def generate(self, prompt_ids, sampling):
        self.calls += 1
        return Generation((5,), (-0.5,), self.version)

    def update_weights(self, version, state_dict):
        return 0.0


def test_pause_holds_requests_until_resumed():
    async def scenario():
        engine = CountingEngine()
        server = PolicyServer(engine=engine, name="policy-0")
        await server.pause(60.0)
        request = asyncio.ensure_future(server.generate([1, 2], SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.3)
        assert not request.done() and engine.calls == 0 and server.in_flight == 1
        await server.resume()
        gen = await asyncio.wait_for(request, 5)
        assert gen.token_ids == (5,) and engine.calls == 1
        paused_s = server.m_paused_s.labels("policy-0")._value.get()
        assert 0.3 <= paused_s < 5
        await server.resume()                      # resuming twice is harmless
    run_async(scenario())


def test_a_pause_lifts_itself_after_max_s():
    async def scenario():
        engine = CountingEngine()
        server = PolicyServer(engine=engine, name="policy-0")
        await server.pause(0.2)
        gen = await asyncio.wait_for(server.generate([1], SamplingParams(max_tokens=1)), 5)
        assert gen.token_ids == (5,)
        # An earlier pause's timer does not lift a later pause.
        await server.pause(0.2)
        await server.resume()
        await server.pause(60.0)
        await asyncio.sleep(0.4)
        assert server.m_paused.labels("policy-0")._value.get() == 1
        await server.resume()
    run_async(scenario())
