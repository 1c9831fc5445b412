"""The V2 REST frontend (Starlette, under Uvicorn or Hypercorn).

``app.py`` builds the application; the infer routes are answered in front of Starlette
by ``infer.py``. A request is read by ``body.py`` (headers, bounded and decompressed
body, timeout, request id), its engine call awaited by ``reply.py`` (deadline,
disconnect) and its answer written by ``answer.py`` (status, header block and body in
one piece), gzipped by ``gzip.py`` when the client accepts it. ``stream.py`` serves the
Server-Sent-Event streams (their per-event headers: ``stream_headers.py``),
``endpoints.py`` custom endpoints and feedback, ``mlflow_scoring.py`` MLflow's scoring
routes, ``kserve_v1.py`` KServe's V1 protocol, ``cloudevents.py`` MLServer's CloudEvents
headers. ``http1.py`` is the guarded HTTP/1.1 protocol of the REST and metrics ports under
Uvicorn.
"""
