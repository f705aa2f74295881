"""ActionTrail client, rule DSL and verifier, LLM-judge channel, fusion."""
