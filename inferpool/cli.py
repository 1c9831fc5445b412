"""The ``inferpool`` command: ``serve`` (flags -> ServerSettings -> the server),
``env pack`` (a model's requirements -> an environment tarball), and ``build`` /
``dockerfile`` (a model folder -> a container image, inferpool.cli_build).

Every server setting is a flag, generated from ServerSettings so the two never drift
(inferpool.cli_flags); only flags given on the command line override ``settings.json`` and
the environment. A refused value is one sentence on stderr naming its flag, variable or
settings.json key (inferpool.cli_errors), exit 2. Ctrl-C before the server is ready exits
130 without a traceback; after, it is a shutdown like SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

# Only the standard library at the top: the heavy imports (pydantic, the server) happen in
# main(), where a Ctrl-C during them is caught and exits quietly.

EXIT_USAGE = 2  # a refused setting or argument, as argparse exits
EXIT_INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C before the server was ready, as shells report it

DESCRIPTION = """\
inferpool serves scikit-learn, XGBoost, LightGBM, MLflow and custom Python models over the
Open Inference Protocol (KServe V2, as Triton and MLServer speak it): REST and gRPC on one
server, a pool of worker processes fed through shared memory, Prometheus metrics. It reads
MLServer's model-settings.json and settings.json as they are."""
EXAMPLES = """\
examples:
  inferpool serve --demo                 train two iris models and serve them on 127.0.0.1
  inferpool serve ./models               serve a folder of model folders (REST 8080, gRPC 8081)
  inferpool serve --help                 every setting, grouped, with its environment variable
  inferpool env pack model/ -o env.tar.gz  pack a model's requirements into an environment
  inferpool build model/ -t my-model:1   an image serving a model folder (docker, podman, buildah)
"""
SERVE_EXAMPLES = """\
examples:
  inferpool serve --demo
  inferpool serve ./models --workers 4 --http-port 9000 --grpc-port 0
  INFERPOOL_LOG_FORMAT=json inferpool serve ./models --access-log
  inferpool serve ./models --model-control-mode poll --metrics-port 0

Every flag is also an INFERPOOL_* environment variable and a key of the repository's
settings.json; MLServer's MLSERVER_* variables and settings.json keys are read too.
Precedence, highest first: flags, INFERPOOL_* variables, settings.json, MLSERVER_* variables.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line naming the command and the way to help."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version_text() -> str:
    """``inferpool --version``: the version, then what it runs on and which runtimes are
    installed (read from the packages' metadata: nothing is imported)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found, missing = [], []
    for label, package in (
        ("scikit-learn", "scikit-learn"),
        ("XGBoost", "xgboost"),
        ("LightGBM", "lightgbm"),
        ("MLflow", "mlflow-skinny"),
    ):
        try:
            found.append(f"{label} {version(package)}")
        except PackageNotFoundError:
            if package == "xgboost":
                try:
                    found.append(f"{label} {version('xgboost-cpu')}")
                    continue
                except PackageNotFoundError:
                    pass
            missing.append(label)
    runtimes = ", ".join(found) or "none"
    if missing:
        runtimes += f" (not installed: {', '.join(missing)})"
    return (
        f"inferpool {version('inferpool')}\n"
        "Open Inference Protocol (KServe V2) server for classical ML models\n"
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}\n"
        f"runtimes: {runtimes}"
    )


def build_parser() -> argparse.ArgumentParser:
    from rich_argparse import RawDescriptionRichHelpFormatter

    from inferpool.cli_flags import add_setting_flags, setting_groups

    parser = _Parser(
        prog="inferpool",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=RawDescriptionRichHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=_version_text(), help="show the version and exit"
    )
    # Not required by argparse: a bare `inferpool` gets a sentence of ours (_run).
    commands = parser.add_subparsers(dest="command", title="commands")
    serve = commands.add_parser(
        "serve",
        usage="inferpool serve [MODEL_REPOSITORY | --demo] [options]",
        help="serve a model repository over the V2 inference protocol",
        description="Serve a folder of model folders over the Open Inference Protocol (V2):\n"
        "REST and gRPC, with Prometheus metrics. Each setting below is a flag, an\n"
        "INFERPOOL_* variable and a settings.json key.",
        epilog=SERVE_EXAMPLES,
        formatter_class=RawDescriptionRichHelpFormatter,
    )
    groups = setting_groups(serve)
    repository = groups["repository"]
    repository.add_argument(
        "model_repository",
        nargs="?",
        type=_repository_argument,
        default=None,
        metavar="MODEL_REPOSITORY",
        help="folder of model folders, or an s3://, gs:// URI of one (fetched once at "
        "start-up; docs/operate/remote-storage.md) (default: INFERPOOL_MODEL_REPOSITORY, "
        "MLSERVER_MODELS_DIR, MLSERVER_MODEL_REPOSITORY_ROOT, or the folder of "
        "MLSERVER_MODEL_URI)",
    )
    repository.add_argument(
        "--demo",
        action="store_true",
        help="train iris models into a temporary repository and serve it on 127.0.0.1",
    )
    add_setting_flags(groups)
    _add_env_commands(commands)
    from inferpool.cli_build import add_build_commands

    add_build_commands(commands, RawDescriptionRichHelpFormatter)
    return parser


def _add_env_commands(commands: Any) -> None:
    from rich_argparse import RichHelpFormatter

    env = commands.add_parser(
        "env",
        help="per-model Python environments",
        description="Per-model Python environments (docs/environments.md).",
        formatter_class=RichHelpFormatter,
    )
    actions = env.add_subparsers(dest="env_command", required=True)
    pack = actions.add_parser(
        "pack",
        help="pack a model's requirements into an environment tarball",
        formatter_class=RichHelpFormatter,
        description="Build a virtualenv holding the requirements of an MLflow model folder "
        "(its requirements.txt, python_env.yaml or conda.yaml), a requirements.txt or a "
        "conda.yaml, and write it as a tarball for parameters.environment_tarball.",
    )
    pack.add_argument("source", type=Path, help="an MLflow model folder, requirements.txt "
                      "or conda.yaml")  # fmt: skip
    pack.add_argument("-o", "--output", type=Path, required=True, help="the tarball to write")
    pack.add_argument(
        "--python",
        type=Path,
        default=None,
        help="the environment's interpreter (default: the server's base interpreter); "
        "the server serves from it only if it runs the same Python X.Y",
    )
    pip = pack.add_argument_group("passed to pip install")
    pip.add_argument("--find-links", action="append", default=[], metavar="DIR_OR_URL")
    pip.add_argument("--no-index", action="store_true")
    pip.add_argument("--index-url", metavar="URL")
    pip.add_argument("--extra-index-url", action="append", default=[], metavar="URL")


def env_pack_command(args: argparse.Namespace) -> int:
    from inferpool.envpack.pack import PackFailed, pack

    options = [option for link in args.find_links for option in ("--find-links", link)]
    options += ["--no-index"] if args.no_index else []
    options += ["--index-url", args.index_url] if args.index_url else []
    options += [option for url in args.extra_index_url for option in ("--extra-index-url", url)]
    try:
        packed = pack(args.source, args.output, python=args.python, pip_options=options)
    except PackFailed as exc:
        print(f"inferpool env pack: {exc}", file=sys.stderr)
        return 2
    size = f"{packed.size / 2**20:.1f} MiB" if packed.size >= 2**20 else f"{packed.size} bytes"
    print(f"wrote {packed.out} ({size}), environment key {packed.key} (sha256 {packed.sha256})")
    server = ".".join(map(str, sys.version_info[:2]))
    if not packed.python.startswith(server + "."):
        print(
            f"note: this server runs Python {server}: it serves from this Python "
            f"{packed.python} environment only with inferpool installed inside"
        )
    return 0


def _repository_argument(text: str) -> Path | str:
    """A local folder, or a remote URI kept as text (``serve_command`` fetches it)."""
    from inferpool.engine.remote_fetch import is_remote

    return text if is_remote(text) else Path(text)


def _refuse(message: str) -> int:
    print(f"inferpool: {message}", file=sys.stderr)
    return EXIT_USAGE


def _repository_refusal(settings: Any, repository: Path | None) -> str | None:
    """Why the settings' model repository cannot be served, if it cannot."""
    from inferpool.cli_errors import source_of

    found = settings.model_repository
    if found is None:
        return (
            "name a model repository (a folder of model folders, or "
            "INFERPOOL_MODEL_REPOSITORY), or use --demo."
        )
    # A model server whose loads an agent drives (--no-load-models-at-startup: Seldon's
    # agent makes the folder when it starts, maybe after us) may start before its folder.
    may_come = not found.exists() and not settings.load_models_at_startup
    if found.is_dir() or may_come:
        return None
    given = {"model_repository": found} if repository else {}
    source = source_of("model_repository", given, repository)
    what = "does not exist" if not found.exists() else "is not a folder"
    return f"the model repository {found} ({source}) {what}."


def serve_command(args: argparse.Namespace) -> int:
    with _interrupts_deferred():
        from inferpool.logs import hold_early_records

        # The settings' own warnings (unknown keys...) are held until their format is known.
        hold_early_records()
    repository = args.model_repository
    remote = None  # the URI of a remote repository, once fetched
    if args.demo:  # seconds of training, interruptible as they go
        from inferpool.demo import build_demo_repository

        repository = build_demo_repository()
    elif isinstance(repository, str):  # a remote repository: its local copy is served
        with _interrupts_deferred():
            from pydantic import ValidationError

            from inferpool.engine.remote_models import fetch_repository
            from inferpool.errors import ModelLoadError
            from inferpool.logs import configure_logging
        overrides = _overrides(args)
        try:  # downloads, interruptible as they go
            remote, repository = repository, fetch_repository(repository, overrides)
        except ModelLoadError as exc:
            configure_logging(None)
            return _refuse(f"the model repository cannot be fetched: {exc.message}")
        except ValidationError as exc:
            return _invalid_settings(exc, overrides, None)
    with _interrupts_deferred():
        settings = _settings_or_refusal(args, repository, remote)
        if isinstance(settings, int):
            return settings
        if args.demo:
            import logging

            logging.getLogger("inferpool").info("demo models in %s", repository)
        import uvloop

        from inferpool.frontends.server import serve

    return uvloop.run(serve(settings))


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the command line gives."""
    overrides: dict[str, Any] = {
        k: v for k, v in vars(args).items() if k not in ("command", "model_repository", "demo")
    }
    if args.demo:
        overrides.setdefault("host", "127.0.0.1")
    return overrides


def _invalid_settings(exc: Any, overrides: dict[str, Any], repository: Path | None) -> int:
    """Prints each invalid setting's sentence (``exc``: pydantic's ValidationError)."""
    from inferpool.cli_errors import sentences
    from inferpool.logs import configure_logging

    configure_logging(None)
    given = {**overrides, **({"model_repository": repository} if repository else {})}
    for line in sentences(exc, given, repository):
        print(f"inferpool: invalid settings: {line}", file=sys.stderr)
    return EXIT_USAGE


def _settings_or_refusal(
    args: argparse.Namespace, repository: Path | None, remote: str | None
) -> Any:
    """The server's settings from the flags, the environment and settings.json, logging
    configured by them; or the exit code of a refusal, its sentences printed. ``remote``:
    the URI ``repository`` was fetched from, if any."""
    from pydantic import ValidationError

    from inferpool.logs import configure_logging
    from inferpool.mlserver.contract.server_settings import SettingsRefused
    from inferpool.settings import load_server_settings

    overrides = _overrides(args)
    try:
        settings = load_server_settings(repository, overrides)
    except ValidationError as exc:
        return _invalid_settings(exc, overrides, repository)
    except SettingsRefused as exc:
        configure_logging(None)
        return _refuse(f"setting refused: {exc}")
    # Refused before any port is bound or any worker started.
    refused = (
        _repository_refusal(settings, repository)
        or _unusable_admin_token(settings)
        or _unusable_security(settings)
    )
    if refused:
        configure_logging(None)
        return _refuse(refused)
    configure_logging(settings)
    if remote is not None:
        import logging

        logging.getLogger("inferpool").info("the model repository %s is at %s", remote, repository)
    return settings


def _unusable_admin_token(settings: Any) -> str | None:
    """Why the admin token settings cannot be used (both given, an unreadable or empty
    file), checked here so that the start stops before anything is bound; None if usable."""
    from inferpool.engine.admin import AdminPolicy, SettingsError

    try:
        AdminPolicy.from_settings(settings)
    except SettingsError as exc:
        return f"invalid settings: {exc}."
    return None


def _unusable_security(settings: Any) -> str | None:
    """Why the TLS files or the API key file cannot be used, in one sentence; None if
    they can (or are not set)."""
    from inferpool.engine.admin import SettingsError
    from inferpool.frontends.api_keys import ApiKeys
    from inferpool.frontends.tls import ServerTls

    try:
        ServerTls.from_settings(settings)
        ApiKeys.from_settings(settings)
    except SettingsError as exc:
        return f"invalid settings: {exc}."
    return None


def _run(argv: list[str] | None) -> int:
    with _interrupts_deferred():
        args = build_parser().parse_args(argv)
    if args.command is None:
        return _refuse(
            "name a command: serve, env, build or dockerfile (see inferpool --help; --version)."
        )
    if args.command == "serve":
        return serve_command(args)
    if args.command == "env" and args.env_command == "pack":
        return env_pack_command(args)
    if args.command in ("build", "dockerfile"):
        from inferpool.cli_build import build_command, dockerfile_command

        return (build_command if args.command == "build" else dockerfile_command)(args)
    return EXIT_USAGE


class _EarlyInterrupt:
    """SIGINT before the server's loop owns it (imports, settings, the demo's training,
    binding). While inferpool imports its dependencies and reads its settings, a Ctrl-C is
    only remembered, and raised as KeyboardInterrupt when that step ends: raised inside an
    extension's import, it comes back as that extension's own error (pydantic-core wraps it
    in a SchemaError) or as a Rust panic printed on stderr (pyo3 importing the datetime C
    API). Elsewhere it is raised at once. The server's loop replaces this handler when it
    installs its own."""

    def __init__(self) -> None:
        self.received = False
        self.deferring = 0
        # Not in the main thread (main() called from an embedding app): the app's SIGINT.
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        insisted = self.received  # a second Ctrl-C does not wait (a hung import)
        self.received = True
        if insisted or not self.deferring:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
        if self.received and not self.deferring:
            raise KeyboardInterrupt


_EARLY_INTERRUPT: _EarlyInterrupt | None = None


def _interrupts_deferred() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C held until the block ends (main()'s handler; nothing when main() did not
    install one)."""
    if _EARLY_INTERRUPT is None:
        return contextlib.nullcontext()
    return _EARLY_INTERRUPT.deferred()


def launch() -> int:
    """The ``inferpool`` program (its console script and ``python -m inferpool``): for
    ``serve``, first the restart that puts large buffers on huge pages
    (inferpool.huge_pages), then ``main``. Not for an app calling ``main`` itself, whose
    process must not be replaced."""
    if sys.argv[1:2] == ["serve"]:
        from inferpool.huge_pages import restart_with_huge_pages

        restart_with_huge_pages()
    return main()


def main(argv: list[str] | None = None) -> int:
    global _EARLY_INTERRUPT
    early = _EARLY_INTERRUPT = _EarlyInterrupt()
    try:
        code = _run(argv)
    except BaseException:
        if not early.received:
            raise
        # Nothing was served, nothing to say: whatever the interrupted step turned the
        # KeyboardInterrupt into.
        return EXIT_INTERRUPTED
    finally:
        _EARLY_INTERRUPT = None
    return EXIT_INTERRUPTED if early.received and code != 0 else code


if __name__ == "__main__":
    sys.exit(main())
