"""GRPO (verl algorithm functions) and SFT, the update engine, checkpoints, the experience
stream consumer and weight publishing. Nothing here starts a browser; the job that composes it
with the rollouts is :mod:`cluster.job`."""
