"""Runtimes of libraries outside [test] (ONNX Runtime, CatBoost...): tox -e runtimes."""
