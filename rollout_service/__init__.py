"""Policy serving, the agent loop, the async rollout orchestrator, the experience queue and the HTTP API."""
