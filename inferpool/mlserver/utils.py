"""``mlserver.utils.get_model_uri``: where a custom runtime finds its artefact."""

from __future__ import annotations

import os
import urllib.parse

from inferpool.mlserver.errors import InvalidModelURI
from inferpool.mlserver.settings import ModelSettings


async def get_model_uri(settings: ModelSettings, wellknown_filenames: list[str] = []) -> str:  # noqa: B006 - MLServer's signature
    """The model's ``parameters.uri`` as an absolute path (relative to its settings file);
    in a folder, the first of ``wellknown_filenames`` found there, else the folder. A URI
    with another scheme than ``file`` is returned as it is."""
    uri = settings.parameters.uri if settings.parameters is not None else None
    if not uri:
        raise InvalidModelURI(settings.name)
    parts = urllib.parse.urlparse(uri, scheme="file")
    if parts.scheme != "file":
        return uri
    path = to_absolute_path(settings, parts.path)
    if os.path.isfile(path):
        return path
    if os.path.isdir(path):
        for filename in wellknown_filenames:
            candidate = os.path.join(path, filename)
            if os.path.isfile(candidate):
                return candidate
        return path
    raise InvalidModelURI(settings.name, path)


def to_absolute_path(model_settings: ModelSettings, uri: str) -> str:
    """``uri`` relative to the folder of the model's settings file, if it has one."""
    source = model_settings._source
    if source is None:
        return uri
    return os.path.normpath(os.path.join(os.path.dirname(source), uri))
