"""``inferpool serve``: command-line flags → ServerSettings → the server; and
``inferpool env pack``: a model's requirements → an environment tarball.

Every server setting is a flag, generated from ServerSettings so the two never drift;
only flags given on the command line override ``settings.json`` and the environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import typing
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from inferpool.logs import configure_logging, hold_early_records
from inferpool.mlserver_env import SettingsRefused
from inferpool.settings import ServerSettings, load_server_settings


def _is_structured(annotation: Any) -> bool:
    kinds = typing.get_args(annotation) or (annotation,)
    return any(isinstance(k, type) and issubclass(k, BaseModel) for k in kinds)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"not valid JSON: {text!r}") from None


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    for name, field in ServerSettings.model_fields.items():
        if name == "model_repository":
            continue
        flag = "--" + name.replace("_", "-")
        default = field.default
        help_text = f"{field.description} (default: {default}; env INFERPOOL_{name.upper()})"
        if field.annotation is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            numbers: dict[Any, Callable[[str], Any]] = {int: int, float: float}
            kind = numbers.get(field.annotation, str)
            if _is_structured(field.annotation):
                kind = _json_value  # e.g. cors_settings: JSON, as in the environment
            parser.add_argument(
                flag, dest=name, type=kind, default=argparse.SUPPRESS, help=help_text
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferpool", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('inferpool')}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve a model repository over the V2 inference protocol",
        description="Serve a model repository over the Open Inference Protocol (V2).",
    )
    serve.add_argument(
        "model_repository",
        nargs="?",
        type=Path,
        default=None,
        help="folder of model folders (default: INFERPOOL_MODEL_REPOSITORY, "
        "MLSERVER_MODELS_DIR, MLSERVER_MODEL_REPOSITORY_ROOT, or the folder of "
        "MLSERVER_MODEL_URI)",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="train iris models into a temporary repository and serve it on 127.0.0.1",
    )
    _add_setting_flags(serve)
    _add_env_commands(commands)
    return parser


def _add_env_commands(commands: Any) -> None:
    env = commands.add_parser(
        "env",
        help="per-model Python environments",
        description="Per-model Python environments (docs/environments.md).",
    )
    actions = env.add_subparsers(dest="env_command", required=True)
    pack = actions.add_parser(
        "pack",
        help="pack a model's requirements into an environment tarball",
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


def serve_command(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {
        k: v for k, v in vars(args).items() if k not in ("command", "model_repository", "demo")
    }
    # The settings' own warnings (unknown keys...) are held until their format is known.
    hold_early_records()
    repository = args.model_repository
    if args.demo:
        from inferpool.demo import build_demo_repository

        repository = build_demo_repository()
        overrides.setdefault("host", "127.0.0.1")
    try:
        settings = load_server_settings(repository, overrides)
    except (ValidationError, SettingsRefused) as exc:
        configure_logging(None)
        what = "invalid settings" if isinstance(exc, ValidationError) else "setting refused"
        print(f"inferpool: {what}: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    if args.demo:
        logging.getLogger("inferpool").info("demo models in %s", repository)
    if settings.model_repository is None:
        logging.getLogger("inferpool").critical("name a model repository (or use --demo)")
        return 2
    import uvloop

    from inferpool.frontends.server import serve

    return uvloop.run(serve(settings))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve_command(args)
    if args.command == "env" and args.env_command == "pack":
        return env_pack_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
