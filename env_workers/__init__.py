"""Playwright browser workers as Ray actors, observations, the action space, the account pool."""
