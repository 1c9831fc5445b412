"""The V2 gRPC frontend (``inference.GRPCInferenceService``).

``service.py`` implements the RPCs once, as formatting of the data plane's answers into
the generated messages; two servers carry it: ``h2.py`` (inferpool's own HTTP/2, the
default) and ``aio.py`` (grpc.aio, ``--grpc-implementation grpcio``). Both also serve
``grpc.health.v1.Health`` (``health.py``) for Kubernetes' gRPC probes. ``h2_call.py``
holds what gRPC adds to one HTTP/2 stream (framing, trailers, ``grpc-timeout``, the status
of a call an exception ended); ``observer.py`` what both servers report about a finished
call (its access log line, ModelInfer's span).
"""
