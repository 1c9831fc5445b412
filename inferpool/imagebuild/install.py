"""``python -m inferpool.imagebuild.install --folder DIR [--python SPEC] -- PIP_ARGS``: a
model folder's requirements installed into the image's environment, run by the
Containerfile of ``inferpool build`` (containerfile.py) as root, in the image.

The image's own packages were installed from its lock (requirements/image.lock); every
one of them is passed to pip as a constraint at the version installed, so a requirement
that needs another version of one of them fails the build with pip's reason, instead of
changing what inferpool was tested with. A Python version the folder asks for
(python_env.yaml, conda.yaml) is checked first. Exit 0, or 1 with one sentence on stderr.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from importlib.metadata import distributions
from pathlib import Path

from inferpool.envpack.sources import Needs, SourceRefused, check_python


def installed() -> dict[str, str]:
    """Every distribution of this environment: its name, lower-case, and version."""
    found: dict[str, str] = {}
    for distribution in distributions():
        name = distribution.metadata["Name"]
        if name:  # a broken .dist-info has no name
            found.setdefault(name.lower(), distribution.version)
    return found


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The packages whose version changed, or that went, as "name old -> new"."""
    return [
        f"{name} {version} -> {after.get(name, 'removed')}"
        for name, version in sorted(before.items())
        if after.get(name) != version
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inferpool.imagebuild.install")
    parser.add_argument("--folder", type=Path, required=True, help="where pip runs")
    parser.add_argument("--python", default=None, help="the Python version asked for")
    parser.add_argument("--python-origin", default="", help="the file asking for it")
    parser.add_argument("pip_arguments", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    pip_arguments = [a for a in args.pip_arguments if a != "--"]
    if args.python is not None:
        origin = Path(args.python_origin or "the folder")
        try:
            check_python(Needs(origin, (), args.python, origin), sys.version_info[:3],
                         Path(sys.executable))  # fmt: skip
        except SourceRefused as exc:
            # check_python's advice (--python) is env pack's: here the base image decides.
            reason = str(exc).split(": pick another")[0]
            print(f"inferpool build: {reason}: choose a base image that has it", file=sys.stderr)
            return 1
    before = installed()
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("".join(f"{name}=={version}\n" for name, version in before.items()))
        constraints.flush()
        pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-input"]
        command = [*pip, "--disable-pip-version-check", "-c", constraints.name, *pip_arguments]
        result = subprocess.run(command, cwd=args.folder, check=False)
    if result.returncode != 0:
        print(
            "inferpool build: pip could not install the folder's requirements beside the "
            "image's packages, each held at its installed version (pip's reason above)",
            file=sys.stderr,
        )
        return 1
    moved = changed(before, installed())
    if moved:
        print(
            f"inferpool build: the install changed the image's packages: {moved}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
