"""The V2 data plane, protocol-neutral: every answer both frontends give, built once.

``DataPlane`` answers health, server and model metadata, model readiness, the repository
index, statistics and the admin load/unload over one ``EngineClient``, as plain Python
values shaped like the V2 REST documents (the protocol's JSON form), or by raising the
error tree (``inferpool.errors``). The frontends only format: ``rest/`` writes the
documents out as JSON with their HTTP status, ``grpc/service.py`` copies their fields into
the generated protobuf messages. So the two protocols cannot drift apart again.

Inference passes straight through (``infer`` is the client's own method): the request
stays raw bytes and the worker's reply bytes go out as they are.
"""

from __future__ import annotations

from typing import Any

import inferpool
from inferpool.engine.client import EngineClient
from inferpool.engine.states import ModelState

SERVER_NAME = "inferpool"
# The V2 extensions served on both protocols (binary tensors: Triton's REST extension).
# "custom_endpoints": runtimes' own routes (REST and inferpool.CustomService/Call);
# "feedback": Seldon Core's reward signal (/feedback and inferpool.FeedbackService);
# "explain": per-feature attributions (/explain, and CustomService/Call to "explain").
EXTENSIONS = [
    "model_repository", "statistics", "binary_tensor_data", "custom_endpoints", "feedback",
    "explain", "trace", "logging", "system_shared_memory",
]  # fmt: skip


class DataPlane:
    """The V2 answers over one engine client."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        # The hot path: bound once, so a request pays no extra call here.
        self.infer = client.infer

    # -- health ---------------------------------------------------------------------------
    def live(self) -> dict[str, Any]:
        """``{"live": bool}``, with the reason as ``error`` when the process is wedged."""
        reason = self.client.live_reason()
        if reason is None:
            return {"live": True}
        return {"live": False, "error": reason}

    def ready(self) -> dict[str, Any]:
        """``{"ready": bool}``, with the reason as ``error`` when not ready (strict)."""
        reason = self.client.not_ready_reason()
        if reason is None:
            return {"ready": True}
        return {"ready": False, "error": reason}

    def model_ready(self, name: str, version: str | None) -> dict[str, Any]:
        """``{"name", "ready"}`` and ``error`` when not READY; ModelNotFound if unknown."""
        self.client.pipelines.sync()  # a pipeline is ready when its children are
        status = self.client.table.find(name, version)
        if status.state is ModelState.READY:
            return {"name": status.name, "ready": True}
        return {"name": status.name, "ready": False, "error": status.describe()}

    # -- metadata -------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": inferpool.__version__, "extensions": EXTENSIONS}

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        """The model's V2 metadata (name, versions, platform, inputs, outputs, and
        parameters when it has some) plus its ``state`` and, if any, ``reason``.

        ``versions`` lists every version of the model listed, whichever one answers (the
        one named, else the latest READY). A model that never loaded has no metadata of
        its own: it is described by name and version only, so the reason it failed can be
        read here too.
        """
        table = self.client.table
        self.client.pipelines.sync()
        status = table.find(name, version)
        document = dict(status.metadata)
        document.setdefault("name", status.name)
        versions = sorted(s.version for s in table.versions(status.name) if s.version)
        if versions or not document.get("versions"):
            document["versions"] = versions
        document.setdefault("platform", "")
        document.setdefault("inputs", [])
        document.setdefault("outputs", [])
        document["state"] = status.state.value
        if status.reason:
            document["reason"] = status.reason
        return document

    # -- the repository extension ---------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model asked for (``name``, ``state``, ``reason``, ``version`` if any);
        with ``ready_only``, only the READY ones (the extension's ``ready`` flag)."""
        self.client.pipelines.sync()
        return [
            status.index_entry()
            for status in self.client.table.all()
            if not ready_only or status.state is ModelState.READY
        ]

    async def load(self, name: str, authorization: str | None) -> None:
        """Load (or reload) a model: Unauthorized/Forbidden first, as the admin policy says."""
        self.client.admin.require(authorization)
        await self.client.load_model(name)

    async def unload(self, name: str, authorization: str | None) -> None:
        self.client.admin.require(authorization)
        await self.client.unload_model(name)

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every model, or the one named."""
        return self.client.statistics(name, version)
