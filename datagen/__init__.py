"""Data generation: the oracle (a plan per task family), the state-aware teacher, SRC
(teacher-guided corrections) and the SFT export, all acting through the rollout service's one
episode runner. See README.md."""
