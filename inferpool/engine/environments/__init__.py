"""Environments a model or worker group names: the tarball unpacked once into a cache, the
interpreter it runs, and what that interpreter can do (its capabilities)."""
