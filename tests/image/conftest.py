"""The image tests' fixtures: the project's image, built once a session, a working
container of it, its configuration, and an empty read-only /dev/shm for each run."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.support import CA_BUNDLE, ROOT, STORAGE, VERSION, buildah


@pytest.fixture(scope="session")
def image() -> str:
    base = subprocess.run(
        ["sh", "scripts/build_image_base.sh", "build/image"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=600,
    ).stdout.split()[-1]  # fmt: skip
    name = f"localhost/inferpool:{VERSION}"
    # No layer cache (--layers): with vfs storage every layer committed is a full copy of
    # the tree, which made a build three times slower (12 minutes against 4) and saved
    # time only when nothing at all had changed.
    previous = subprocess.run(
        ["buildah", *STORAGE, "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    buildah(
        "bud", "--isolation", "chroot", "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
        "--build-arg", f"BASE={base}", "-t", name, str(ROOT), timeout=1500,
    )  # fmt: skip
    if previous:  # the last run's image, untagged now: its copy of the tree goes
        subprocess.run(["buildah", *STORAGE, "rmi", previous], capture_output=True, timeout=120)
    return name


@pytest.fixture(scope="session")
def container(image: str) -> Iterator[str]:
    """One working container of the image; each test runs its own process in it."""
    name = buildah("from", image).strip()
    yield name
    buildah("rm", name)


@pytest.fixture(scope="session")
def config(container: str) -> dict:
    return json.loads(buildah("inspect", "--type", "container", container))["OCIv1"]["config"]


@pytest.fixture
def no_shm(tmp_path: Path) -> Path:
    folder = tmp_path / "no-shm"
    folder.mkdir()
    return folder
