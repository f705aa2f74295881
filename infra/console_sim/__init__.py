"""The local cloud: an Alibaba Cloud OpenAPI endpoint (ECS, VPC, RAM, ActionTrail, OSS) that
the official SDKs talk to unchanged, with per-account state and an audit log in SQLite.

Run it with ``python -m infra.console_sim --port 18080 --state-dir var/cloud``.
"""
