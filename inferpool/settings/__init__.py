"""Server and model settings, with every default in one place, and MLServer's settings
read as MLServer reads them.

The modules, lowest first (each imports only those above it in this list):

- ``validators``: parsers of text values (log levels, histogram bounds, tags);
- ``cors``: MLServer's ``cors_settings`` block;
- ``mlserver_common``: the once-per-process settings messages, variables' text as values;
- ``pipeline``: the ``pipeline`` key of a model-settings file;
- ``warmup``: the ``warmup`` key of a model-settings file;
- ``model``: ``ModelSettings`` (one model's ``model-settings.json``) and its parts;
- ``mlserver_model``: MLServer's model-settings contract (keys, ``MLSERVER_MODEL_*``);
- ``mlserver_server``: MLServer's server-settings contract (``settings.json`` keys and
  ``MLSERVER_*`` variables mapped to ours, or refused);
- ``sources``: ``settings.json`` and ``MLSERVER_*`` as pydantic-settings sources;
- ``server_fields``, ``server``: ``ServerSettings``, its fields by concern and its rules;
- ``loading``: reading a server's and a model's settings files.

Every name other modules use is exported here: ``from inferpool.settings import X``.
The package imports nothing of the engine, frontends or runtimes (tests/unit/
test_settings_layering.py), so that any process may read settings.
"""

from inferpool.settings.cors import CORSSettings
from inferpool.settings.loading import SETTINGS_FILE, load_server_settings, read_model_settings
from inferpool.settings.model import (
    MODEL_SETTINGS_FILE,
    AllVersions,
    LatestVersions,
    ModelParameters,
    ModelSettings,
    SpecificVersions,
    VersionPolicy,
)
from inferpool.settings.server import ServerSettings
from inferpool.settings.server_fields import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS,
    MAX_PORT,
    MIB,
    WorkerGroupSettings,
)
from inferpool.settings.warmup import WarmupInput, WarmupSample

__all__ = [
    "BATCH_BUCKETS",
    "LATENCY_BUCKETS",
    "MAX_PORT",
    "MIB",
    "MODEL_SETTINGS_FILE",
    "SETTINGS_FILE",
    "AllVersions",
    "CORSSettings",
    "LatestVersions",
    "ModelParameters",
    "ModelSettings",
    "ServerSettings",
    "SpecificVersions",
    "VersionPolicy",
    "WarmupInput",
    "WarmupSample",
    "WorkerGroupSettings",
    "load_server_settings",
    "read_model_settings",
]
