"""Server and model settings, with every default in one place, and MLServer's settings
read as MLServer reads them.

MLServer's side of the files (which keys and ``MLSERVER_*`` variables mean what, the
``cors_settings`` block) is ``inferpool.mlserver.contract``, below this package: it
imports nothing of it. The modules, lowest first (each imports only those above it in
this list):

- ``validators``: parsers of text values (log levels, histogram bounds, tags);
- ``pipeline``: the ``pipeline`` key of a model-settings file;
- ``warmup``: the ``warmup`` key of a model-settings file;
- ``model``: ``ModelSettings`` (one model's ``model-settings.json``) and its parts;
- ``sources``: ``settings.json`` and ``MLSERVER_*`` as pydantic-settings sources;
- ``server_fields``, ``server``: ``ServerSettings``, its fields by concern and its rules;
- ``loading``: reading a server's and a model's settings files (single-model mode too).

Every name other modules use is exported here: ``from inferpool.settings import X``.
The package imports nothing of the engine, frontends or runtimes (tests/unit/
test_settings_layering.py), so that any process may read settings.
"""

from inferpool.mlserver.contract.cors import CORSSettings
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
