"""The jobs API's routes, one ``APIRouter`` per concern, all under ``/v1`` except operations:

- :mod:`.jobs`: submit, list, get and cancel jobs;
- :mod:`.events`: a job's events as Server-Sent Events;
- :mod:`.results`: rollouts, the report (JSON and HTML) and artifacts;
- :mod:`.docs`: pages of documentation checked against the console, and run;
- :mod:`.catalog`: the task catalog and validation, the team's quota, the models;
- :mod:`.ops`: ``/healthz``, ``/readyz``, ``/metrics``.

What they share (the store, the token book, the catalog, the metrics, the settings) is one
:class:`~.context.ApiContext` per app, reached through FastAPI dependencies (:mod:`.context`).
"""
