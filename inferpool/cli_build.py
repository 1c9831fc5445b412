"""``inferpool build`` and ``inferpool dockerfile``: declared here (argparse, as cli.py
declares its commands) and run by inferpool.imagebuild (docs/deploy/build.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

BUILD_EXAMPLES = """\
examples:
  inferpool build ./my-model -t my-model:1     a model folder (model-settings.json at its top)
  inferpool build ./models -t models:1 --builder podman      a folder of model folders
  inferpool build ./my-model -t my-model:1 --base-image registry.example.com/inferpool:0.1.0

The folder is copied to /opt/models in the image (a single model to /opt/models/NAME), owned
by root, readable by the server's user (uid 1000); requirements.txt, python_env.yaml or
conda.yaml (its pip: list and python pin) at the folder's top are installed with pip, every
package of the base image held at its installed version. The image runs
`inferpool serve /opt/models` as uid 1000.
"""
DOCKERFILE_EXAMPLES = """\
examples:
  inferpool dockerfile ./my-model > Containerfile
  inferpool dockerfile ./my-model -o ./my-model/Containerfile
  docker build -f ./my-model/Containerfile -t my-model:1 ./my-model

Build it with the folder as the context, and a .dockerignore there that leaves out the
Containerfile (inferpool build writes both for you).
"""


def add_build_commands(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    """The ``build`` and ``dockerfile`` subcommands, on the parser's subcommands."""
    from inferpool.imagebuild.builders import BUILDERS
    from inferpool.imagebuild.containerfile import DEFAULT_BASE

    build = commands.add_parser(
        "build",
        help="build a container image serving a model folder",
        description="Build a container image that serves a model folder (one model, or a "
        "repository of them) with its custom runtime code and requirements, on top of "
        "inferpool's image, with docker, podman or buildah (the first found).",
        epilog=BUILD_EXAMPLES,
        formatter_class=formatter,
    )
    dockerfile = commands.add_parser(
        "dockerfile",
        help="print the Containerfile that inferpool build would use",
        description="Write the Containerfile of a model folder's image (what inferpool "
        "build builds), for building it yourself with the folder as the context.",
        epilog=DOCKERFILE_EXAMPLES,
        formatter_class=formatter,
    )
    for parser in (build, dockerfile):
        parser.add_argument("folder", type=Path, metavar="FOLDER",
                            help="a model folder or a folder of model folders")  # fmt: skip
        parser.add_argument(
            "--base-image",
            default=DEFAULT_BASE,
            metavar="IMAGE",
            help=f"the inferpool image to build on (default: {DEFAULT_BASE}, the name "
            "inferpool's Dockerfile is built as, docs/deploy/image.md)",
        )
    build.add_argument("-t", "--tag", required=True, help="the new image's name[:tag]")
    build.add_argument("--builder", choices=BUILDERS, default=None,
                       help="the builder to run (default: the first of "
                       f"{', '.join(BUILDERS)} installed)")  # fmt: skip
    build.add_argument(
        "--build-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="passed to the builder's build command, repeatable (--build-option=--network=host)",
    )
    build.add_argument("--context", type=Path, default=None, metavar="DIR",
                       help="write the build context there and keep it (a new or empty "
                       "folder; default: a temporary folder)")  # fmt: skip
    dockerfile.add_argument("-o", "--output", type=Path, default=None,
                            help="write it to this file (default: standard output)")  # fmt: skip


def build_command(args: argparse.Namespace) -> int:
    from inferpool.imagebuild import builders
    from inferpool.imagebuild.folder import BuildRefused, read_folder

    try:
        folder = read_folder(args.folder)
        builder = builders.find_builder(args.builder)
        status = builders.build(folder, args.tag, args.base_image, builder,
                                args.build_option, args.context)  # fmt: skip
    except BuildRefused as exc:
        print(f"inferpool build: {exc}.", file=sys.stderr)
        return 2
    if status != 0:
        print(f"inferpool build: {Path(builder).name} failed (exit {status}): its output is "
              "above", file=sys.stderr)  # fmt: skip
        return 1
    print(f"built {args.tag} from {folder.source}: it serves {folder.target}")
    return 0


def dockerfile_command(args: argparse.Namespace) -> int:
    from inferpool.imagebuild.containerfile import render
    from inferpool.imagebuild.folder import BuildRefused, read_folder

    try:
        text = render(read_folder(args.folder), args.base_image)
    except BuildRefused as exc:
        print(f"inferpool dockerfile: {exc}.", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text)
    return 0
