"""A model's fingerprint: its settings and the size and modification time of its files.

Shared by the server (which remembers that a model's files crashed their loader and does
not ask for them again until they change: ``pool/template_keeper.py``) and the template (which
sends it with what it preloaded: ``worker/preload.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def fingerprint(document: dict[str, Any]) -> bytes:
    """The model's settings plus the size and mtime of every file in its folder."""
    folder = document.get("folder")
    files = []
    if folder and Path(folder).is_dir():
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                files.append((str(path), stat.st_size, stat.st_mtime_ns))
    return orjson.dumps([document, files])
