"""MLServer's settings contract: what each key of its ``settings.json`` and
``model-settings.json`` and each ``MLSERVER_*`` variable means to inferpool.

- ``common``: the once-per-process settings messages, a variable's text as a value;
- ``cors``: MLServer's ``cors_settings`` block (a field of ``ServerSettings``);
- ``model_settings``: the model keys and ``MLSERVER_MODEL_*`` (read, or refused with a reason);
- ``server_settings``: the server keys and ``MLSERVER_*`` mapped to inferpool's, or refused.

It sits below ``inferpool.settings``, which reads the files through it, and imports
nothing of inferpool, so that every process (environment interpreters included) may load
it without loading MLServer's Python API beside it.
"""
