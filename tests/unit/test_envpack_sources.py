"""What ``inferpool env pack`` reads from an MLflow model folder, a requirements.txt, a
python_env.yaml or a conda.yaml: pip requirement lines and the Python version asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpool.envpack.sources import Needs, SourceRefused, check_python, read_needs

PY = Path("/usr/bin/python3.11")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_requirements_file_is_passed_to_pip_whole(tmp_path: Path) -> None:
    source = write(tmp_path / "reqs.txt", "scikit-learn==1.5.2\n")
    assert read_needs(source) == Needs(source, (f"-r {source.resolve()}",), None, None)


def test_conda_yaml_gives_its_pip_dependencies_and_python(tmp_path: Path) -> None:
    source = write(
        tmp_path / "conda.yaml",
        "channels: [conda-forge]\n"
        "dependencies:\n"
        "- python=3.11.7\n"
        "- pip<=24.0\n"
        "- conda-forge::scikit_learn=1.5.2\n"  # also a pip requirement: pip installs it
        "- pip:\n"
        "  - scikit-learn==1.5.2\n"
        "  - -r extra.txt\n"
        "name: mlflow-env\n",
    )
    needs = read_needs(source)
    assert needs.requirements == ("scikit-learn==1.5.2", f"-r {tmp_path.resolve()}/extra.txt")
    assert (needs.python, needs.python_origin) == ("3.11.7", source)


@pytest.mark.parametrize(
    ("spec", "python"),
    [
        ("python", None),
        ("python=3.11", "3.11"),
        ("python=3.11.*", "3.11"),
        ("python=3.11.7=h955ad1f_0", "3.11.7"),
        ("python 3.12", "3.12"),
        ("python==3.10.4", "==3.10.4"),
        ("python>=3.9,<3.13", ">=3.9,<3.13"),
    ],
)
def test_conda_python_specs(tmp_path: Path, spec: str, python: str | None) -> None:
    source = write(tmp_path / "conda.yaml", f"dependencies:\n- {spec}\n- pip:\n  - a\n")
    assert read_needs(source).python == python


def test_a_conda_only_dependency_is_refused_by_name(tmp_path: Path) -> None:
    source = write(
        tmp_path / "conda.yaml",
        "dependencies:\n- python=3.11\n- cudatoolkit=11.8\n- pip:\n  - scikit-learn\n",
    )
    with pytest.raises(SourceRefused, match=r"conda dependency 'cudatoolkit=11.8' cannot be"):
        read_needs(source)


def test_python_env_yaml_makes_its_file_options_absolute(tmp_path: Path) -> None:
    source = write(
        tmp_path / "model" / "python_env.yaml",
        "python: 3.11.7\nbuild_dependencies:\n- pip==23.0\n- setuptools\n"
        "dependencies:\n- -r requirements.txt\n- -c constraints.txt\n- numpy==2.1.0\n",
    )
    folder = (tmp_path / "model").resolve()
    needs = read_needs(source)
    assert needs.requirements == (
        f"-r {folder}/requirements.txt",
        f"-c {folder}/constraints.txt",
        "numpy==2.1.0",
    )
    assert needs.python == "3.11.7"


def test_an_mlflow_folder_prefers_requirements_and_takes_python_from_yaml(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    write(model / "MLmodel", "flavors: {}\n")
    requirements = write(model / "requirements.txt", "scikit-learn==1.5.2\n")
    # A conda-only dependency in conda.yaml does not matter: requirements.txt is used.
    write(model / "conda.yaml", "dependencies:\n- python=3.10\n- mkl\n- pip:\n  - x\n")
    needs = read_needs(model)
    assert needs.requirements == (f"-r {requirements.resolve()}",)
    assert (needs.python, needs.python_origin) == ("3.10", model / "conda.yaml")
    write(model / "python_env.yaml", "python: 3.12.1\ndependencies:\n- -r requirements.txt\n")
    assert read_needs(model).python == "3.12.1"  # python_env.yaml before conda.yaml


def test_an_mlflow_folder_without_requirements_uses_a_yaml(tmp_path: Path) -> None:
    write(tmp_path / "MLmodel", "flavors: {}\n")
    write(tmp_path / "conda.yaml", "dependencies:\n- python=3.11\n- pip:\n  - pkg==1.0\n")
    assert read_needs(tmp_path).requirements == ("pkg==1.0",)


@pytest.mark.parametrize(
    ("name", "text", "error"),
    [
        ("MLmodel", "flavors: {}\n", r"holds no requirements.txt, python_env.yaml or conda.yaml"),
        ("conda.yaml", "dependencies: [python=3.11\n", r"conda.yaml is not valid YAML \(line"),
        ("conda.yaml", "- a\n- b\n", r"must hold a mapping"),
        ("conda.yaml", "dependencies: {pip: [a]}\n", r"dependencies must be a list"),
        ("conda.yaml", "dependencies:\n- {pip: a}\n", r"pip: must be a list of requirements"),
    ],
)
def test_unreadable_sources_are_refused(tmp_path: Path, name: str, text: str, error: str) -> None:
    write(tmp_path / name, text)
    with pytest.raises(SourceRefused, match=error):
        read_needs(tmp_path)
    with pytest.raises(SourceRefused, match=r"absent\.txt does not exist"):
        read_needs(tmp_path / "absent.txt")


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        (None, True),
        ("3.11", True),
        ("3.11.2", True),  # patch releases share an environment's packages
        ("==3.11.9", True),
        ("3.10", False),
        ("3.1", False),
        (">=3.9,<3.12", True),
        (">=3.12", False),
    ],
)
def test_check_python(spec: str | None, fits: bool) -> None:
    needs = Needs(Path("conda.yaml"), (), spec, Path("conda.yaml") if spec else None)
    if fits:
        check_python(needs, (3, 11, 7), PY)
    else:
        with pytest.raises(SourceRefused, match=r"but /usr/bin/python3.11 is Python 3.11.7: pick"):
            check_python(needs, (3, 11, 7), PY)


def test_check_python_refuses_a_bad_specifier() -> None:
    needs = Needs(Path("c.yaml"), (), ">=three", Path("c.yaml"))
    with pytest.raises(SourceRefused, match=r"python '>=three' is not a version specifier"):
        check_python(needs, (3, 11, 7), PY)
