"""Inference pipelines: models whose settings list steps that call other models.

- ``graph.py``: a pipeline's settings checked against the loaded models, as a plan;
- ``runner.py``: one request through a plan (chain, router, aggregator);
- ``combine.py``: the aggregators' combinations and the routers' choice (numpy only);
- ``manager.py``: the pipelines an engine client serves (load, readiness, infer).
"""
