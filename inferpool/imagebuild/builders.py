"""``inferpool build``: the build context written (the folder's copy, its Containerfile and
.dockerignore) and handed to the first container builder found: docker, podman or buildah.

The folder is copied into a context of its own rather than built in place, so nothing is
written into the user's folder and the Containerfile is not copied into the image.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from inferpool.imagebuild.containerfile import DOCKERIGNORE, NAME, dockerignore, render
from inferpool.imagebuild.folder import IGNORED, BuildRefused, ModelFolder

BUILDERS = ("docker", "podman", "buildah")


def find_builder(chosen: str | None = None) -> str:
    """The builder's executable: the one chosen, else the first of BUILDERS on PATH (docker
    only when its daemon answers: its client is often installed without one, and podman or
    buildah need none; docker still, when nothing else is found, and its error says why)."""
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise BuildRefused(f"the builder {chosen} is not installed (not found on PATH)")
        return found
    present = [found for name in BUILDERS if (found := shutil.which(name))]
    for found in present:
        if Path(found).name != "docker" or _daemon_answers(found):
            return found
    if present:
        return present[0]
    raise BuildRefused(
        "no container builder is installed: install docker, podman or buildah (or name one "
        "with --builder)"
    )


def _daemon_answers(docker: str) -> bool:
    try:
        answer = subprocess.run([docker, "version", "--format", "{{.Server.Version}}"],
                                capture_output=True, timeout=20, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return answer.returncode == 0


def build_command(builder: str, context: Path, tag: str, options: Sequence[str] = ()) -> list[str]:
    """The builder's command line: ``bud`` for buildah, ``build`` for docker and podman
    (buildah takes ``build`` too since 1.21; ``bud`` works in every release)."""
    verb = "bud" if Path(builder).name == "buildah" else "build"
    return [builder, verb, *options, "-f", str(context / NAME), "-t", tag, str(context)]


def write_context(folder: ModelFolder, context: Path, base: str) -> None:
    """The folder's copy at the context's top, the Containerfile and the .dockerignore."""
    shutil.copytree(folder.source, context, ignore=shutil.ignore_patterns(*IGNORED),
                    dirs_exist_ok=True)  # fmt: skip
    own = context / DOCKERIGNORE
    (context / DOCKERIGNORE).write_text(dockerignore(own.read_text() if own.is_file() else ""))
    (context / NAME).write_text(render(folder, base))


def build(
    folder: ModelFolder,
    tag: str,
    base: str,
    builder: str,
    options: Sequence[str] = (),
    context: Path | None = None,
) -> int:
    """Write the context (in a temporary folder unless one is given, then kept) and run
    the builder in it; its output goes to ours. The builder's exit status."""
    if context is not None and context.exists() and any(context.iterdir()):
        raise BuildRefused(f"the build context {context} exists and is not empty")
    with tempfile.TemporaryDirectory(prefix="inferpool-build-") as temporary:
        where = context if context is not None else Path(temporary) / "context"
        write_context(folder, where, base)
        return subprocess.run(build_command(builder, where, tag, options), check=False).returncode
