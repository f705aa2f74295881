"""The local cloud (console_sim), the cloud client, provisioning, observability, deploy."""
