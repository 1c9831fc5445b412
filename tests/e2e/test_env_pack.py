"""``inferpool env pack`` as a user runs it: a requirements.txt, a conda.yaml or an MLflow
model folder made into a tarball that ``prepare`` unpacks into a working interpreter.

pip stays offline: the requirements are hand-built wheels on ``--find-links``, installed
with ``--no-index``. Each successful pack builds a virtualenv (a few seconds), so only
three do; the refusals stop before one is built."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from inferpool.engine.environments.unpack import prepare
from tests.support.environments import build_wheel

ROOT = Path(__file__).resolve().parents[2]
SERVER_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
OFFLINE = ("--no-index", "--find-links")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    build_wheel(folder, "envtest_alpha", "1.4.2")
    build_wheel(folder, "envtest_alpha", "2.0.0")
    build_wheel(folder, "envtest_beta", "0.9")
    return folder


def env_pack(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inferpool", "env", "pack", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=180)


def version_inside(tarball: Path, cache: Path, package: str) -> str:
    """What the environment's own interpreter reports for ``package.__version__``."""
    environment = prepare(tarball, cache)
    code = f"import {package}; print({package}.__version__)"
    result = subprocess.run([environment.python, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_pack_a_requirements_file(tmp_path: Path, wheels: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("envtest_alpha==1.4.2\n")
    out = tmp_path / "env.tar.gz"
    result = env_pack(requirements, "-o", out, *OFFLINE, wheels)
    assert result.returncode == 0, result.stderr
    assert f"installed from {requirements}: envtest_alpha 1.4.2\n" in result.stdout
    environment = prepare(out, tmp_path / "cache")
    assert f"wrote {out} (" in result.stdout
    assert f"environment key {environment.key} (sha256 {environment.key}" in result.stdout
    with tarfile.open(out) as archive:
        top = {Path(name).parts[0] for name in archive.getnames()}
    assert {"bin", "lib", "pyvenv.cfg"} <= top  # members at the root, as conda-pack's
    assert version_inside(out, tmp_path / "cache", "envtest_alpha") == "1.4.2"
    # The server's own packages are not inside: the server brings them.
    # (inferpool's own package imports its parts lazily: its dependencies tell.)
    imports = "import msgspec, pydantic_settings"
    isolated = subprocess.run([environment.python, "-c", imports], capture_output=True)
    assert isolated.returncode != 0
    assert not list(tmp_path.glob(".env.tar.gz.*"))  # no temporary tarball left


def test_pack_a_conda_yaml(tmp_path: Path, wheels: Path) -> None:
    conda = tmp_path / "conda.yaml"
    conda.write_text(
        "channels: [conda-forge]\n"
        "dependencies:\n"
        f"- python={SERVER_PYTHON}\n"
        "- pip\n"
        "- envtest-beta=0.9\n"  # a conda spec of a name pip installs too
        "- pip:\n"
        "  - envtest_alpha==2.0.0\n"
        "  - envtest-beta==0.9\n"
        "name: mlflow-env\n"
    )
    out = tmp_path / "conda-env.tgz"
    result = env_pack(conda, "-o", out, *OFFLINE, wheels)
    assert result.returncode == 0, result.stderr
    assert "envtest_alpha 2.0.0, envtest_beta 0.9" in result.stdout
    cache = tmp_path / "cache"
    assert version_inside(out, cache, "envtest_alpha") == "2.0.0"
    assert version_inside(out, cache, "envtest_beta") == "0.9"


def test_pack_an_mlflow_model_folder(tmp_path: Path, wheels: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "MLmodel").write_text("flavors:\n  python_function:\n    loader_module: x\n")
    (model / "requirements.txt").write_text("envtest_beta==0.9\n")
    (model / "python_env.yaml").write_text(
        f"python: {SERVER_PYTHON}.0\nbuild_dependencies:\n- pip\n"
        "dependencies:\n- -r requirements.txt\n"
    )
    # MLflow writes a conda.yaml too; with requirements.txt there, its conda specs are unused.
    (model / "conda.yaml").write_text("dependencies:\n- mkl\n- pip:\n  - envtest_beta==0.9\n")
    out = tmp_path / "model-env.tar.gz"
    result = env_pack(model, "--output", out, "--python", sys.executable, *OFFLINE, wheels)
    assert result.returncode == 0, result.stderr
    assert version_inside(out, tmp_path / "cache", "envtest_beta") == "0.9"


def assert_refused(result: subprocess.CompletedProcess[str], *phrases: str) -> str:
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.startswith("inferpool env pack: ") and "\n" not in line, result.stderr
    for phrase in phrases:
        assert phrase in line, line
    return line


def test_a_missing_requirement_fails_with_pips_reason_and_keeps_out(
    tmp_path: Path, wheels: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("envtest_alpha==1.4.2\nenvtest_absent==3.0\n")
    out = tmp_path / "env.tar.gz"
    out.write_bytes(b"the previous tarball")
    result = env_pack(requirements, "-o", out, *OFFLINE, wheels)
    assert_refused(
        result,
        f"pip could not install the requirements of {requirements}",
        "Could not find a version that satisfies the requirement envtest_absent==3.0",
    )
    assert out.read_bytes() == b"the previous tarball"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.tar.gz", "requirements.txt"]


def test_a_python_version_mismatch_is_refused(tmp_path: Path) -> None:
    conda = tmp_path / "conda.yaml"
    conda.write_text("dependencies:\n- python=2.7\n- pip:\n  - envtest_alpha\n")
    result = env_pack(conda, "-o", tmp_path / "env.tgz")
    interpreter = getattr(sys, "_base_executable", sys.executable)
    assert_refused(
        result,
        f"{conda} asks for Python 2.7, but {interpreter} is Python {SERVER_PYTHON}.",
        "pick another interpreter with --python",
    )
    assert not (tmp_path / "env.tgz").exists()


def test_a_conda_only_dependency_is_refused(tmp_path: Path) -> None:
    conda = tmp_path / "conda.yaml"
    conda.write_text(f"dependencies:\n- python={SERVER_PYTHON}\n- libgomp=14\n")
    assert_refused(
        env_pack(conda, "-o", tmp_path / "env.tgz"),
        "conda dependency 'libgomp=14' cannot be installed without conda",
    )


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (("absent.txt",), "absent.txt does not exist"),
        (("req.txt", "--python", "/bin/true"), "--python /bin/true is not a Python interpreter"),
        (("req.txt", "--python", "nowhere/python"), "--python nowhere/python cannot be run"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, args: tuple[str, ...], phrase: str) -> None:
    (tmp_path / "req.txt").write_text("envtest_alpha\n")
    first, *rest = args
    assert_refused(env_pack(tmp_path / first, "-o", tmp_path / "env.tgz", *rest), phrase)


def test_out_must_be_a_file_in_an_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "req.txt").write_text("envtest_alpha\n")
    assert_refused(env_pack(tmp_path / "req.txt", "-o", tmp_path), "is a folder")
    assert_refused(
        env_pack(tmp_path / "req.txt", "-o", tmp_path / "no" / "env.tgz"),
        f"the folder {tmp_path / 'no'} does not exist",
    )
