"""The V2 gRPC frontend (``inference.GRPCInferenceService``).

``service.py`` implements the RPCs once, as formatting of the data plane's answers into
the generated messages; two servers carry it: ``h2.py`` (inferpool's own HTTP/2, the
default) and ``aio.py`` (grpc.aio, ``--grpc-implementation grpcio``). Both also serve
``grpc.health.v1.Health`` (``health.py``) for Kubernetes' gRPC probes.
"""
