"""Policy serving, the agent loop, the one episode runner (:mod:`.episode`) and the oracle, the
async rollout orchestrator, the experience stream producer and the OpenAI-compatible API."""
