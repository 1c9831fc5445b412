"""``inferpool build``: an image from a model folder, built with buildah on the project's
image (conftest.py's ``image``, which this environment builds anyway), then run as a
container runtime runs it: the custom runtime's model answers, with a requirement the
folder brought (a wheel the test makes: the build needs no index), as uid 1000 and reading
a copy of the folder that only root may change.

The install step's rules (``inferpool.imagebuild.install``) are checked in a working
container of the project's image: a requirement that would change one of the image's
packages fails, and so does a Python version the folder asks for that the image lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.image.support import ROOT, RUNC, STORAGE, Running, buildah, default_command
from tests.support.environments import build_wheel

pytestmark = pytest.mark.timeout(1800)

TAG = "localhost/inferpool-build-test:1"
CONVERTER = """
    import numpy as np
    from thermo import OFFSET, SCALE  # the folder's requirement

    from inferpool import Runtime, TensorSpec


    class Converter(Runtime):
        def load(self) -> None:
            pass

        def inputs(self) -> list[TensorSpec]:
            return [TensorSpec("celsius", "FP64", [-1])]

        def outputs(self) -> list[TensorSpec]:
            return [TensorSpec("fahrenheit", "FP64", [-1])]

        def predict(self, payload, outputs):
            return {"fahrenheit": np.asarray(payload, dtype=np.float64) * SCALE + OFFSET}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model folder: a custom runtime, its settings, and a requirements.txt naming a
    wheel inside it; every file readable by its owner alone, as a user's umask may leave
    them."""
    model = tmp_path_factory.mktemp("build") / "fahrenheit"
    model.mkdir()
    (model / "converter.py").write_text(textwrap.dedent(CONVERTER))
    settings = {"name": "fahrenheit", "implementation": "converter.Converter"}
    (model / "model-settings.json").write_text(json.dumps(settings))
    build_wheel(model / "wheels", "thermo", "1.0", "SCALE = 1.8\nOFFSET = 32.0\n")
    (model / "requirements.txt").write_text("--no-index\n./wheels/thermo-1.0-py3-none-any.whl\n")
    for path in model.rglob("*"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    return model


@pytest.fixture(scope="module")
def built(image: str, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``inferpool build FOLDER -t TAG`` on the project's image, with buildah: its storage
    the tests' (vfs, in a storage.conf: buildah takes no variable for its driver), its
    isolation passed with --build-option."""
    storage = tmp_path_factory.mktemp("storage") / "storage.conf"
    storage.write_text(
        '[storage]\ndriver = "vfs"\nrunroot = "/run/containers/storage"\n'
        'graphroot = "/var/lib/containers/storage"\n'
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONTAINERS_STORAGE_CONF": str(storage)}
    command = [sys.executable, "-m", "inferpool", "build", str(folder), "-t", TAG,
               "--base-image", image, "--builder", "buildah",
               "--build-option=--isolation=chroot"]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        f"built {TAG} from {folder}: it serves /opt/models/fahrenheit"
    )
    container = buildah("from", TAG).strip()
    yield container
    buildah("rm", container)
    subprocess.run(["buildah", *STORAGE, "rmi", TAG], capture_output=True, timeout=120)


def test_the_built_image_serves_the_folder_as_non_root(built: str, no_shm: Path):
    config = json.loads(buildah("inspect", "--type", "container", built))["OCIv1"]["config"]
    assert config["Cmd"] == ["inferpool", "serve", "/opt/models"]
    assert config["User"] == "1000:1000"
    running = Running(built, default_command(config), no_shm)
    body = {"inputs": [{"name": "celsius", "shape": [3], "datatype": "FP64",
                        "data": [100.0, 0.0, -40.0]}]}  # fmt: skip
    try:
        running.wait_ready()
        answer = httpx.post(f"{running.url}/v2/models/fahrenheit/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [212.0, 32.0, -40.0]
        for process in running.tini().children(recursive=True):
            assert process.uids().effective == 1000, process.cmdline()
    finally:
        running.stop()
    assert running.process.returncode == 0, running.output()


def test_the_folder_is_owned_by_root_readable_and_its_requirement_installed(built: str):
    check = (
        "import os, thermo; p = '/opt/models/fahrenheit/converter.py'; s = os.stat(p); "
        "print(s.st_uid, os.access(p, os.R_OK), os.access(p, os.W_OK), "
        "os.access('/opt/models/fahrenheit', os.W_OK), thermo.__file__)"
    )
    seen = buildah("run", *RUNC, built, "--", "python", "-c", check).split()
    assert seen[:4] == ["0", "True", "False", "False"]
    assert seen[4].startswith("/opt/inferpool/lib/"), seen
    # the build's own files did not reach the image
    listed = buildah("run", *RUNC, built, "--", "ls", "-A", "/opt/models/fahrenheit").split()
    assert "Containerfile" not in listed and ".dockerignore" not in listed
    assert {"converter.py", "model-settings.json", "requirements.txt"} <= set(listed)


def _install(container: str, wheels: Path, *arguments: str) -> subprocess.CompletedProcess:
    """``python -m inferpool.imagebuild.install`` as the Containerfile runs it (root)."""
    command = ["buildah", *STORAGE, "run", *RUNC, "--user", "0:0", "-v", f"{wheels}:/wheels:ro",
               container, "--", "python", "-m", "inferpool.imagebuild.install",
               "--folder", "/wheels", *arguments]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_requirement_cannot_change_the_images_packages(container: str, tmp_path: Path):
    """A wheel that needs a newer certifi, which is there to be had: pip would upgrade the
    image's certifi without the constraints; with them, the install fails, saying why."""
    version = buildah("run", *RUNC, container, "--", "python", "-c",
                      "import certifi; print(certifi.__version__)").strip()  # fmt: skip
    build_wheel(tmp_path, "certifi", "9999.1.1")
    build_wheel(tmp_path, "needy", "1.0", requires=("certifi>=9999",))
    result = _install(container, tmp_path, "--", "--no-index", "--find-links", "/wheels", "needy")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "beside the image's packages, each held at its installed version" in result.stderr
    after = buildah("run", *RUNC, container, "--", "python", "-c",
                    "import certifi; print(certifi.__version__)").strip()  # fmt: skip
    assert after == version


def test_a_python_version_the_image_lacks_is_refused(container: str, tmp_path: Path):
    result = _install(container, tmp_path, "--python", "3.9", "--python-origin", "conda.yaml",
                      "--", "--no-index", "nothing")  # fmt: skip
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]  # then buildah's own line on the exit status
    assert first.startswith("inferpool build: conda.yaml asks for Python 3.9, but ")
    assert first.endswith(": choose a base image that has it")
