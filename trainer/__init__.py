"""GRPO (verl algorithm functions) and SFT, the update engine, checkpoints, weight publishing."""
