"""Rollout and documentation-verification jobs for other teams, over HTTP.

- :mod:`.schema`: the API's request and response models, the job and episode state machines;
- :mod:`.store`: jobs, results, events, artifacts and usage in Redis (all survives an API
  restart and, with AOF, a Redis restart);
- :mod:`.auth`: opaque per-team bearer tokens stored as hashes, scopes, quotas;
- :mod:`.scheduler`: runs the jobs' episodes on env workers through the one episode runner,
  with priority, fair share between teams and a share of the pool beside training;
- :mod:`.report`: the documentation-verification report (JSON and HTML);
- :mod:`.app`: the FastAPI application (``/v1``), served by :mod:`cluster.serve`; its routes,
  one router per concern, in :mod:`.routers`;
- :mod:`.client`: a Python client and the ``console-rl`` command line for other teams.
"""
