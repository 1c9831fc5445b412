"""The distribution as users get it: the sdist and the wheel built from the checkout (the
wheel from the sdist, as pip builds it where no wheel fits), installed with ``[sklearn]``
into a brand-new virtualenv, answering V2 requests from there."""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferpool import __version__
from tests.support import free_port, wait_for_200

# The first test to use the distribution or the virtualenv waits for their build and
# install: minutes on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
VERSION = __version__
EXTENSIONS = (
    "inferpool/runtimes/trees/_kernel.",
    "inferpool/engine/ipc/_atomics.",
    "inferpool/protocol/_jsonscan.",
)
# What building the extensions from the sdist needs beside their .c files (setup.py).
HEADERS = (
    "inferpool/protocol/_pow5.h",
    *(f"inferpool/protocol/jsonscan/{name}.h" for name in ("common", "numbers", "dispatch",
      "tier_ssse3", "tier_avx2", "tier_avx512", "scan_generic")),
)  # fmt: skip
PROTOS = ("inferpool/protocol/grpc_predict_v2.proto", "inferpool/protocol/health.proto")


def test_the_sdist_holds_the_c_sources_and_the_protos(dist: Path):
    (sdist,) = dist.glob(f"inferpool-{VERSION}.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for extension in EXTENSIONS:
        assert extension + "c" in names
    for path in (*PROTOS, *HEADERS, "setup.py", "pyproject.toml", "README.md"):
        assert path in names, path


def test_the_wheel_holds_the_compiled_extensions_and_the_protos(dist: Path):
    (wheel,) = dist.glob(f"inferpool-{VERSION}-cp311-cp311-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    for extension in EXTENSIONS:
        assert any(n.startswith(extension) and n.endswith(".so") for n in names), extension
    for proto in PROTOS:
        assert proto in names


def test_version_from_the_installed_wheel(venv: Path):
    result = subprocess.run(
        [venv / "bin" / "inferpool", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"inferpool {VERSION}"


@pytest.fixture
def demo(venv: Path, tmp_path: Path) -> Iterator[str]:
    """``inferpool serve --demo`` from the virtualenv, run outside the checkout so that
    nothing but the installed wheel can be imported."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [venv / "bin" / "inferpool", "serve", "--demo", "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    try:
        wait_for_200(f"{url}/v2/health/ready", process, log.read_text, timeout=120)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_installed_wheel_serves_the_demo(demo: str):
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                        "data": [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3]}]}  # fmt: skip
    for model in ("iris-logreg", "iris-rf"):
        answer = httpx.post(f"{demo}/v2/models/{model}/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [0, 2]
