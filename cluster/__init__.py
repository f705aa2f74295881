"""The composition root, and the only code that sees the job's root config
(:class:`cluster.config.JobConfig`): Ray bootstrap and local services (:mod:`.runtime`), the
builders that start each component from its own section (:mod:`.builders`), and the entry
points: the training job (:mod:`.job`), evaluation (:mod:`.evaluate`) and SFT data export
(:mod:`.export`). KubeRay manifests and the runtime env live in ``cluster/deploy/``."""
