"""``inferpool build`` and ``inferpool dockerfile``: a container image from a model folder,
on top of inferpool's own image (docs/deploy/build.md)."""
