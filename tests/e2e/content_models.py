"""Builds model repositories of the echo runtime (tests/e2e/echo_model.py) for e2e tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

ECHO_SOURCE = Path(__file__).with_name("echo_model.py")


def write_echo_model(
    root: Path,
    name: str,
    outputs: list[dict] | None = None,
    inputs: list[dict] | None = None,
    **extra: Any,
) -> Path:
    """A model folder running ``echo_model.EchoRuntime`` with ``parameters.extra``."""
    folder = root / name
    folder.mkdir(parents=True)
    shutil.copy(ECHO_SOURCE, folder / "echo_model.py")
    settings: dict[str, Any] = {
        "name": name,
        "implementation": "echo_model.EchoRuntime",
        "parameters": {"extra": extra},
    }
    if outputs is not None:
        settings["outputs"] = outputs
    if inputs is not None:
        settings["inputs"] = inputs
    (folder / "model-settings.json").write_text(json.dumps(settings))
    return folder
