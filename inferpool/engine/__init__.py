"""The engine: model lifecycle, dispatch to where models run, and the inference path."""
