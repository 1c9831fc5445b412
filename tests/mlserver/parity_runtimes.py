"""MLServer custom runtimes for what MLServer does around ``predict``: ``unload()``, adaptive
batching, response headers. Written once as source text, as
MLServer's docs write them (``from mlserver import MLModel``); the repository holding them.

``tests/mlserver/test_parity_installed.py`` serves them unchanged (MLServer installed);
``tests/compat/test_mlmodel_parity.py`` after rewriting their imports to
``inferpool.mlserver`` (``runtimes.as_inferpool``).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.mlserver.runtimes import as_inferpool

# unload() as MLServer's docs write it (async), as a plain method, and one that fails: each
# writes a file in its folder (its settings' uri), so that the test sees it was called.
UNLOADERS = """
from pathlib import Path

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class AsyncUnload(MLModel):
    async def load(self) -> bool:
        self.marker = Path(await get_model_uri(self.settings)) / "unloaded.txt"
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("y", x)])

    async def unload(self) -> bool:
        self.marker.write_text(f"{self.name} unloaded")
        return True


class SyncUnload(AsyncUnload):
    def unload(self) -> bool:
        self.marker.write_text(f"{self.name} unloaded")
        return True


class FailingUnload(AsyncUnload):
    async def unload(self) -> bool:
        self.marker.write_text(f"{self.name} tried")
        raise RuntimeError("the connection pool would not close")
"""

# Records the rows of every request its predict sees (a line each, in its folder's
# batches.log) and answers 2x.
DOUBLER = """
import asyncio
from pathlib import Path

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class Doubler(MLModel):
    async def load(self) -> bool:
        self.log = Path(await get_model_uri(self.settings)) / "batches.log"
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        with self.log.open("a") as log:
            log.write(f"{len(x)}\\n")
        await asyncio.sleep(0.05)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("y", x * 2)]
        )
"""

# Sets response headers as MLServer's docs show (parameters.headers of the response).
TAGGER = """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse, Parameters


class Tagger(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name,
            outputs=[NumpyCodec.encode_output("y", x)],
            parameters=Parameters(
                content_type="np",
                headers={"X-Model-Tag": "blue", "x-rows": str(len(x))},
            ),
        )
"""

# model name → (module, source, class, settings beyond name and implementation)
MODELS: dict[str, tuple[str, str, str, dict]] = {
    "async-unload": ("unloaders", UNLOADERS, "AsyncUnload", {"uri": "."}),
    "sync-unload": ("unloaders", UNLOADERS, "SyncUnload", {"uri": "."}),
    "failing-unload": ("unloaders", UNLOADERS, "FailingUnload", {"uri": "."}),
    "doubler": ("doubler", DOUBLER, "Doubler", {"uri": "."}),
    "doubler-unbatched": ("doubler", DOUBLER, "Doubler", {"uri": "."}),
    "tagger": ("tagger", TAGGER, "Tagger", {}),
}
# MLServer's adaptive batching: both settings. The unbatched one sets only the size,
# which MLServer ignores (it needs max_batch_time > 0 too).
BATCHING = {
    "doubler": {"max_batch_size": 4, "max_batch_time": 1.0},
    "doubler-unbatched": {"max_batch_size": 4},
}


def write_repository(root: Path, rewrite: bool) -> Path:
    """Each model in its folder, with MLServer's model-settings.json."""
    for name, (module, source, class_name, parameters) in MODELS.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / f"{module}.py").write_text(as_inferpool(source) if rewrite else source)
        settings: dict = {"name": name, "implementation": f"{module}.{class_name}"}
        settings |= BATCHING.get(name, {})
        if parameters:
            settings["parameters"] = parameters
        (folder / "model-settings.json").write_text(json.dumps(settings))
    return root
