"""Commands run beside the project, from the repository root (``python -m tools.<name>``):
outside the layers, so they may import any package, and no package imports them."""
