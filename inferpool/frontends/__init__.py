"""Frontends: REST (Starlette) and gRPC, both thin, both formatting one data plane's
answers (``dataplane.py``) and routing raw inference bytes to the engine."""
