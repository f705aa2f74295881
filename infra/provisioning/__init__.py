"""Provisioning of task prerequisites and cleanup of everything an episode made:
:mod:`.sdk` (the official-SDK backend), :mod:`.terraform`, :mod:`.warm_pool` and
:mod:`.resource_coder`. The declarations they act on are :mod:`consolerl.resources`."""
