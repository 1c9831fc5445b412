"""Inference pipelines: models whose settings list steps that call other models.

- ``graph.py``: a pipeline's settings checked against the loaded models, as a plan;
- ``runner.py``: one request through a plan (chain, router, aggregator);
- ``combine.py``: the aggregators' combinations and the routers' choice (numpy only);
- ``wire.py``: a step's request and its child's reply in the gRPC wire form;
- ``manager.py``: the pipelines an engine client serves (load, readiness, infer).
"""
