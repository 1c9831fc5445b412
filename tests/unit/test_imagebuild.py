"""``inferpool dockerfile`` / ``inferpool build`` without a builder: the Containerfile a
model folder gets, its build context, the builder chosen, and the clear refusals.
(tests/image/test_build.py builds and runs such an image.)"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from inferpool import __version__
from inferpool.cli import main
from inferpool.imagebuild.builders import build_command, find_builder, write_context
from inferpool.imagebuild.containerfile import DEFAULT_BASE, render
from inferpool.imagebuild.folder import BuildRefused, read_folder
from inferpool.imagebuild.install import changed


def model(folder: Path, name: str = "m") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps({"name": name}))
    return folder


def instructions(text: str) -> list[tuple[str, str]]:
    """The Containerfile's instructions, comments left out: (keyword, rest)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [(line.split(" ", 1)[0], line.split(" ", 1)[1]) for line in lines]


def runs(text: str) -> list[list[str]]:
    return [json.loads(rest) for keyword, rest in instructions(text) if keyword == "RUN"]


def test_a_model_folder_is_copied_under_its_name_and_served_as_uid_1000(tmp_path: Path):
    folder = model(tmp_path / "fahrenheit")
    (folder / "requirements.txt").write_text("thermo==1.0\n")
    text = render(read_folder(folder))
    steps = instructions(text)
    assert steps[0] == ("ARG", f"BASE=inferpool:{__version__}") and DEFAULT_BASE.endswith(
        __version__
    )
    assert ("FROM", "${BASE}") in steps
    assert ("COPY", '[".", "/opt/models/fahrenheit"]') in steps
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users == ["0:0", "1000:1000"]  # root to copy and install, the server's user last
    assert steps[-1] == ("CMD", '["inferpool", "serve", "/opt/models"]')
    settle, install = runs(text)
    assert "chown -R 0:0 /opt/models; chmod -R a+rX,go-w /opt/models" in settle[-1]
    assert install == ["python", "-m", "inferpool.imagebuild.install", "--folder",
                       "/opt/models/fahrenheit", "--", "-r", "requirements.txt"]  # fmt: skip
    # the installs come after the copy and before the server's user
    keywords = [keyword for keyword, _ in steps]
    assert (
        keywords.index("COPY")
        < keywords.index("RUN")
        < len(keywords) - 1 - keywords[::-1].index("RUN")
        < keywords.index("USER", keywords.index("USER") + 1)
    )


def test_a_repository_is_copied_whole_and_needs_no_install_without_requirements(
    tmp_path: Path,
):
    model(tmp_path / "models" / "a")
    model(tmp_path / "models" / "group" / "b")
    folder = read_folder(tmp_path / "models")
    assert not folder.single and str(folder.target) == "/opt/models"
    text = render(folder, base="registry.example.com/inferpool:1")
    assert ("COPY", '[".", "/opt/models"]') in instructions(text)
    assert instructions(text)[0] == ("ARG", "BASE=registry.example.com/inferpool:1")
    assert len(runs(text)) == 1  # the copy settled, nothing installed


def test_a_conda_yaml_becomes_its_pip_list_and_a_python_check(tmp_path: Path):
    folder = model(tmp_path / "m")
    (folder / "extra.txt").write_text("six\n")
    (folder / "conda.yaml").write_text(
        "channels: [conda-forge]\ndependencies:\n  - python=3.11.7\n  - pip\n"
        "  - pip:\n    - thermo==1.0\n    - -r extra.txt\n"
    )
    install = runs(render(read_folder(folder)))[-1]
    assert install[install.index("--python") + 1] == "3.11.7"
    assert install[install.index("--python-origin") + 1] == "conda.yaml"
    assert install[install.index("--") + 1 :] == ["thermo==1.0", "-r", "extra.txt"]


def test_a_python_env_yaml_is_read_as_mlflow_writes_it(tmp_path: Path):
    folder = model(tmp_path / "m")
    (folder / "python_env.yaml").write_text(
        "python: 3.11.7\nbuild_dependencies: [pip]\ndependencies:\n  - scikit-learn==1.7.1\n"
    )
    install = runs(render(read_folder(folder)))[-1]
    assert install[install.index("--") + 1 :] == ["scikit-learn==1.7.1"]
    assert install[install.index("--python") + 1] == "3.11.7"
    # MLflow writes a requirements.txt too: installed, the yaml's pin still checked
    (folder / "requirements.txt").write_text("scikit-learn==1.7.1\n")
    install = runs(render(read_folder(folder)))[-1]
    assert install[install.index("--") + 1 :] == ["-r", "requirements.txt"]
    assert install[install.index("--python-origin") + 1] == "python_env.yaml"


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "is not a model folder: it holds no model-settings.json"),
        ({"conda.yaml": "dependencies:\n  - python=3.11\n  - cudatoolkit=11.8\n"},
         "conda dependency 'cudatoolkit=11.8' cannot be installed without conda"),
        ({"requirements.txt": "-r ../outside.txt\n"}, "names ../outside.txt, outside "),
        ({"python_env.yaml": "dependencies: [-r ../outside.txt]\n"}, "names a file outside"),
    ],
)  # fmt: skip
def test_what_cannot_be_built_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str], reason: str
):
    folder = tmp_path / "m"
    if files:
        model(folder)
    else:
        folder.mkdir()
    (tmp_path / "outside.txt").write_text("six\n")
    for name, text in files.items():
        (folder / name).write_text(text)
    assert main(["dockerfile", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("inferpool dockerfile: ") and reason in err
    assert err.count("\n") == 1 and "Traceback" not in err and "conda-pack" not in err


def test_dockerfile_prints_or_writes_the_containerfile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    folder = model(tmp_path / "m")
    assert main(["dockerfile", str(folder), "--base-image", "x/inferpool:9"]) == 0
    printed = capsys.readouterr().out
    assert printed == render(read_folder(folder), "x/inferpool:9")
    out = tmp_path / "Containerfile"
    assert main(["dockerfile", str(folder), "--base-image", "x/inferpool:9", "-o", str(out)]) == 0
    assert out.read_text() == printed


def test_the_context_holds_the_folder_its_containerfile_and_a_dockerignore(tmp_path: Path):
    folder = model(tmp_path / "m")
    (folder / "runtime.py").write_text("x = 1\n")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "runtime.cpython-311.pyc").write_bytes(b"stale")
    (folder / ".dockerignore").write_text("data/raw\n")
    context = tmp_path / "context"
    write_context(read_folder(folder), context, "base:1")
    assert sorted(p.name for p in context.iterdir()) == [
        ".dockerignore", "Containerfile", "model-settings.json", "runtime.py"
    ]  # fmt: skip
    ignored = (context / ".dockerignore").read_text().splitlines()
    assert ignored[:2] == ["Containerfile", ".dockerignore"] and ignored[-1] == "data/raw"
    assert "ARG BASE=base:1" in (context / "Containerfile").read_text()


def executable(folder: Path, name: str, body: str = "exit 0") -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_builder_is_the_first_found_and_docker_only_with_its_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildRefused, match="no container builder is installed"):
        find_builder()
    with pytest.raises(BuildRefused, match="the builder podman is not installed"):
        find_builder("podman")
    buildah = executable(tmp_path, "buildah")
    assert find_builder() == str(buildah)
    # a docker client whose daemon is not running: `docker version` fails
    docker = executable(tmp_path, "docker", "exit 1")
    assert find_builder() == str(buildah)
    assert find_builder("docker") == str(docker)
    executable(tmp_path, "docker")  # its daemon answers
    assert find_builder() == str(docker)
    os.unlink(buildah)
    executable(tmp_path, "docker", "exit 1")
    assert find_builder() == str(docker)  # nothing else: docker says why it fails


def test_the_build_commands_of_each_builder(tmp_path: Path):
    assert build_command("/usr/bin/buildah", tmp_path, "t:1", ["--isolation=chroot"]) == [
        "/usr/bin/buildah", "bud", "--isolation=chroot", "-f", str(tmp_path / "Containerfile"),
        "-t", "t:1", str(tmp_path),
    ]  # fmt: skip
    for builder in ("docker", "podman"):
        assert build_command(builder, tmp_path, "t:1")[:2] == [builder, "build"]


def test_build_refuses_without_a_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("PATH", str(tmp_path))
    folder = model(tmp_path / "m")
    assert main(["build", str(folder), "-t", "t:1"]) == 2
    assert capsys.readouterr().err == (
        "inferpool build: no container builder is installed: install docker, podman or "
        "buildah (or name one with --builder).\n"
    )


def test_changed_names_every_package_the_install_moved():
    before = {"numpy": "2.3.1", "certifi": "2026.1.1", "six": "1.16"}
    after = {"numpy": "2.3.1", "certifi": "9999.1", "thermo": "1.0"}
    assert changed(before, after) == ["certifi 2026.1.1 -> 9999.1", "six 1.16 -> removed"]
    assert changed(before, {**before, "thermo": "1.0"}) == []
