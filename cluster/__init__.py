"""Ray bootstrap, the composition root, `ray job submit` entry points, KubeRay manifests."""
