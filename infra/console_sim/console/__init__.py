"""The local cloud's console web UI (``/console/...``): sign-in, ECS, VPC, RAM and OSS pages
whose every change goes through the same service layer as the OpenAPI and is audited as a
console operation; optional UI drift per session. See :mod:`.shell` for the entry point."""
