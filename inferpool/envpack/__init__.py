"""``inferpool env pack``: a model's requirements made into an environment tarball that a
model names with ``parameters.environment_tarball`` (docs/environments.md)."""
