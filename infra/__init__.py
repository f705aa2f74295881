"""The cloud side: the local cloud (``console_sim``), the cloud client (``cloud``), provisioning
backends for task prerequisites (``provisioning``), the one LLM chat client (``llm``), and
launchers for a local Redis and cloud."""
