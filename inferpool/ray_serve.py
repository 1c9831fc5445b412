"""Ray Serve: each Serve replica is one inferpool engine with its own workers (``inferpool[ray]``).

``InferpoolDeployment`` is a Serve deployment around the embedded ``Engine``. A replica's
constructor starts the engine on Serve's event loop (its worker processes, then every model
of the repository), so Serve routes nothing to a replica before its models are READY; a
model that fails makes the constructor raise, and Serve reports the deployment
DEPLOY_FAILED with the reason. The replica then serves:

- the V2 REST routes of ``inferpool serve`` (``frontends.rest.app.build_app`` over the same
  engine client) through Serve's HTTP proxy, under the application's ``route_prefix``;
- a handle API for Ray programs: ``infer`` (returns the ``InferenceResult`` the embedded
  engine returns), ``model_metadata``, ``ready`` and ``models``.

Serve's health check calls the engine's liveness; replica shutdown closes the engine and
stops its workers. ``build_app`` is the application builder for ``serve run
inferpool.ray_serve:build_app repository=/models ...`` and for Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve import Application, Deployment
from starlette.types import ASGIApp

from inferpool.engine.client import EngineClient
from inferpool.engine.embedded import Engine
from inferpool.engine.embedded_io import InferenceResult
from inferpool.frontends.dataplane import DataPlane
from inferpool.frontends.rest.app import build_app as build_rest_app
from inferpool.settings import ServerSettings

# Builder arguments that configure the Serve deployment, not the engine.
DEPLOYMENT_OPTIONS = ("num_replicas", "max_ongoing_requests", "max_queued_requests")
# The engine queues and batches requests itself: Serve's default of 5 requests in flight
# per replica would hold the rest in the proxy and leave adaptive batching nothing to batch.
MAX_ONGOING_REQUESTS = 128


class InferpoolReplica:
    """One Serve replica: an inferpool engine on ``repository`` (``InferpoolDeployment``).

    ``settings`` are ``ServerSettings`` fields (``workers``, ``max_queue``,
    ``exit_on_error``...). ``workers`` defaults to the CPUs Ray assigned to the replica
    (``ray_actor_options={"num_cpus": N}``; Serve's default is 1); 0 runs the models in
    the replica's own process. The repository is fixed at start-up
    (``model_control_mode="none"``): a load through one replica would change that replica
    only, so a new model version is rolled out by redeploying.
    """

    # Serve awaits an async constructor (mypy wants __init__ to return None, not a coroutine).
    async def __init__(self, repository: str | Path, **settings: Any) -> None:  # type: ignore[misc]
        if "workers" not in settings:
            settings["workers"] = _assigned_cpus()
        settings.setdefault("model_control_mode", "none")
        self.engine = Engine(repository, **settings)
        await self.engine.start()
        self._plane = DataPlane(self._client())

    def _client(self) -> EngineClient:
        client = self.engine.client
        if client is None:
            raise RuntimeError("the engine is closed")
        return client

    def __serve_build_asgi_app__(self) -> ASGIApp:
        """Called by Serve after the constructor: the V2 REST routes over this engine."""
        return build_rest_app(self._client())

    # -- the handle API -------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        inputs: Any,
        outputs: Sequence[str] | None = None,
        *,
        version: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferenceResult:
        """``Engine.infer``: numpy arrays, DataFrames, mappings or V2 requests in, an
        ``InferenceResult`` out; errors raise the classes of ``inferpool.errors``."""
        return await self.engine.infer(
            model, inputs, outputs, version=version, parameters=parameters
        )

    def model_metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        """The model's V2 metadata document, as ``GET /v2/models/{model}`` answers it."""
        return self._plane.model_metadata(model, version)

    def ready(self) -> dict[str, Any]:
        """``{"ready": bool}`` with the reason as ``error``, as ``/v2/health/ready``."""
        return self._plane.ready()

    def models(self) -> list[dict[str, Any]]:
        """Every model version listed (name, state, reason, version), as the index."""
        return self._plane.repository_index()

    # -- Serve's hooks --------------------------------------------------------------------
    def check_health(self) -> None:
        """Serve's periodic health check: fails only when the engine is wedged (no worker
        could be started), never because a model failed or the replica is draining."""
        reason = self._client().live_reason()
        if reason is not None:
            raise RuntimeError(reason)

    async def __del__(self) -> None:
        """Replica shutdown (scale-down, redeploy, ``serve.shutdown``): stop the workers."""
        await self.engine.close()


# Not decorated: mypy keeps a decorated class's own type, so ``.options`` would not type.
InferpoolDeployment: Deployment = serve.deployment(
    name="inferpool", max_ongoing_requests=MAX_ONGOING_REQUESTS
)(serve.ingress()(InferpoolReplica))


def _assigned_cpus() -> int:
    """The CPUs Ray reserved for this replica (at least 1): one worker each."""
    # Ray leaves this method unannotated; typed here for the strict call check.
    assigned: Callable[[], dict[str, float]] = ray.get_runtime_context().get_assigned_resources
    return max(1, int(assigned().get("CPU", 1)))


def build_app(args: Mapping[str, Any]) -> Application:
    """The Serve application for ``args``: ``serve run inferpool.ray_serve:build_app
    repository=/models num_replicas=2 workers=2``, or ``serve.run(build_app({...}))``.

    ``repository`` is required; ``num_replicas`` (a number or ``auto``),
    ``max_ongoing_requests`` and ``max_queued_requests`` configure the deployment,
    ``num_cpus`` each replica's CPUs; every other key is a ``ServerSettings`` field. The
    settings are checked here, so a typo fails ``serve run`` rather than every replica.
    """
    settings = dict(args)
    repository = settings.pop("repository", None)
    if not repository:
        raise ValueError("build_app needs 'repository': the model repository's path")
    options: dict[str, Any] = {}
    for name in DEPLOYMENT_OPTIONS:
        if name in settings:
            value = settings.pop(name)
            options[name] = value if value == "auto" else int(value)
    if "num_cpus" in settings:
        options["ray_actor_options"] = {"num_cpus": float(settings.pop("num_cpus"))}
    unknown = sorted(set(settings) - set(ServerSettings.model_fields))
    if unknown:
        raise ValueError(f"unknown inferpool setting(s): {', '.join(unknown)}")
    ServerSettings(model_repository=Path(repository), **settings)  # raises on a bad value
    return InferpoolDeployment.options(**options).bind(str(repository), **settings)
