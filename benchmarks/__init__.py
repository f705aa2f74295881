"""Benchmarks and experiments, each run as ``python -m benchmarks.<name> --json``.

Every module here prints one JSON object (progress goes to stderr) and starts what it measures
itself: a local cloud, redis-server, browsers, on free ports with temporary state. ``make
bench`` runs them all (``reward_validate`` also on its own: ``make validate``). The services
never import this package; a benchmark imports the services, never the other way round.
"""
