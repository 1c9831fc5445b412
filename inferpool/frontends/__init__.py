"""Frontends: REST (Starlette) and gRPC, both thin, both routing raw bytes to the engine."""
