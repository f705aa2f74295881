"""Provisioning of task prerequisites (Resource META) and cleanup of everything an episode
made: :mod:`.meta` (declarations), :mod:`.sdk` (the official-SDK backend)."""
