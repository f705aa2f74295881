"""The bottom layer: what crosses process and service boundaries, importing nothing else of the
project. The exception hierarchy (:mod:`.errors`), accounts (:mod:`.accounts`), tasks and the
suite loader (:mod:`.tasks`, with Resource META declarations in :mod:`.resources` and UI drift
kinds in :mod:`.drift`), what env workers answer (:mod:`.types`), trajectories and GRPO groups
with their stream encoding (:mod:`.experience`), ActionTrail audit events (:mod:`.audit`), and
rewards (:mod:`.rewards`). Keep it small.

Layers, each importing only from those before it: ``consolerl`` → ``infra`` → ``env_workers`` |
``reward_service`` → ``rollout_service`` → ``trainer`` → ``cluster``."""
