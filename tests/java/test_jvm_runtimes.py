"""The java and pmml runtimes loaded in this process: each load error in one sentence (no
JVM found, jar missing, not a jar, class not found, class not implementing the interface,
PMML invalid), the registry's entries (never in the template), the shipped interface jar
matching its source, and a batch crossing as primitive arrays."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from inferpool.errors import ModelLoadError
from inferpool.runtimes.registry import RUNTIMES, is_fork_safe, runtime_name_for
from inferpool.settings import ModelSettings, read_model_settings
from tests.java.models import (
    INTERFACE_JAR,
    LINEAR,
    NOT_A_MODEL,
    compile_jar,
    write_java_model,
)
from tests.support.runtimes import infer, load

pytest.importorskip("jpype")  # the languages environment's (tox -e languages)


@pytest.fixture(scope="module")
def jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jars")
    return compile_jar(root / "demo.jar", {"demo/Linear": LINEAR, "demo/NotAModel": NOT_A_MODEL})


def load_error(folder: Path) -> str:
    with pytest.raises(ModelLoadError) as refused:
        load(folder)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_missing_jar(tmp_path: Path) -> None:
    folder = write_java_model(tmp_path / "m", "demo.Linear", jar=tmp_path / "gone.jar")
    assert load_error(folder) == f"jar {tmp_path / 'gone.jar'} does not exist"
    empty = write_java_model(tmp_path / "empty", "demo.Linear")
    assert load_error(empty) == f"model 'empty' has no jar: no .jar file in {empty}"


def test_a_file_that_is_not_a_jar(tmp_path: Path) -> None:
    folder = write_java_model(tmp_path / "m", "demo.Linear")
    (folder / "model.jar").write_text("not a zip")
    assert load_error(folder) == "model.jar is not a jar (not a zip archive)"


def test_a_class_not_in_the_jar(tmp_path: Path, jar: Path) -> None:
    folder = write_java_model(tmp_path / "m", "demo.Missing", jar=jar)
    assert load_error(folder) == "class 'demo.Missing' is not in demo.jar"


def test_a_class_not_implementing_the_interface(tmp_path: Path, jar: Path) -> None:
    folder = write_java_model(tmp_path / "m", "demo.NotAModel", jar=jar)
    assert load_error(folder) == (
        "class 'demo.NotAModel' of demo.jar does not implement io.inferpool.Model"
    )


def test_no_class_named_and_a_bad_heap(tmp_path: Path, jar: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    document = {"name": "m", "implementation": "java", "parameters": {"uri": str(jar)}}
    (folder / "model-settings.json").write_text(json.dumps(document))
    assert "names no class: set parameters.extra.java_class" in load_error(folder)
    heap = write_java_model(tmp_path / "h", "demo.Linear", jar=jar, jvm_heap="lots")
    assert load_error(heap) == "jvm_heap 'lots' is not a size such as 512m or 2g"


def test_no_java_runtime_found() -> None:
    # A fresh process (this one may run a JVM already) where JPype finds no JVM.
    script = (
        "import jpype\n"
        "from inferpool.runtimes import jvm\n"
        "def nowhere():\n"
        "    raise jpype.JVMNotFoundException('No JVM shared library file (libjvm.so) found')\n"
        "jpype.getDefaultJVMPath = nowhere\n"
        "try:\n"
        "    jvm.ensure_started()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == (
        "ModelLoadError no Java runtime found (none under JAVA_HOME or the usual places): "
        "install one (apt-get install default-jre-headless) or set JAVA_HOME"
    ), done.stderr


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("hello", "model.pmml is not a valid PMML model (not XML)"),
        ("<PMML><Header/></PMML>", "model.pmml is not a valid PMML model ("),
        ("<?xml version='1.0'?><PMML", "model.pmml is not a valid PMML model ("),
    ],
)
def test_invalid_pmml(tmp_path: Path, text: str, reason: str) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.pmml").write_text(text)
    assert load_error(tmp_path / "m").startswith(reason)


def test_a_folder_without_settings_holding_model_pmml_is_pmml(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.pmml").write_text("<PMML/>")
    assert runtime_name_for(read_model_settings(tmp_path / "m", "m")) == "pmml"


def test_the_template_never_holds_a_jvm() -> None:
    for name in ("java", "pmml"):
        assert RUNTIMES[name].preload == ()
        assert not RUNTIMES[name].fork_safe
        assert not is_fork_safe(ModelSettings(name="m", implementation=name))


def test_the_shipped_interface_jar_matches_its_source(tmp_path: Path) -> None:
    """scripts/build_java_interface.sh was run after the last change of the sources."""
    sources = sorted((INTERFACE_JAR.parent / "io" / "inferpool").glob("*.java"))
    subprocess.run(
        ["javac", "--release", "11", "-d", str(tmp_path), *map(str, sources)], check=True
    )
    with zipfile.ZipFile(INTERFACE_JAR) as shipped:
        names = sorted(n for n in shipped.namelist() if n.endswith(".class"))
        assert names == sorted(f"io/inferpool/{s.stem}.class" for s in sources)
        for name in names:
            assert shipped.read(name) == (tmp_path / name).read_bytes(), name


def test_a_big_batch_crosses_as_arrays(tmp_path: Path, jar: Path) -> None:
    folder = write_java_model(tmp_path / "m", "demo.Linear", jar=jar)
    model = load(folder)
    rows = np.random.default_rng(0).normal(size=(5000, 3))
    (answer,) = infer(model, rows).values()
    expected = 0.5 + rows @ np.array([1.5, -2.0, 0.25])
    np.testing.assert_allclose(answer[:, 0], expected, rtol=1e-12)


CAPPED = """
import re, resource, sys
import jpype
from inferpool.runtimes import jvm
status = open("/proc/self/status").read()
mapped = int(re.search(r"VmSize:\\s+(\\d+)", status).group(1)) * 1024
left = int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (mapped + left, resource.RLIM_INFINITY))
try:
    jvm.ensure_started("128m")
    print("started", jpype.JClass("java.lang.Math").max(2, 3))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def capped(left_mib: int) -> str:
    """What starting a JVM (heap 128m) prints in a process that may map ``left_mib`` more."""
    done = subprocess.run(
        [sys.executable, "-c", CAPPED, str(left_mib)], capture_output=True, text=True
    )
    return done.stdout.strip() or done.stderr[-500:]


def test_under_an_address_space_cap_a_jvm_starts_smaller_or_refuses() -> None:
    # --worker-memory-limit is RLIMIT_AS: JDK 17's default reservations (1.2 GiB beyond
    # the heap) would make the JVM exit the worker; 1400 MiB is enough for the smaller ones.
    assert capped(1400) == "started 3"
    assert capped(600) == (
        "ModelLoadError the worker's memory limit leaves 600 MiB of address space, and a JVM "
        "with heap 128m needs 1152 MiB: raise --worker-memory-limit or lower jvm_heap"
    )


def test_the_heap_is_the_models_jvm_heap() -> None:
    script = (
        "import jpype\n"
        "from inferpool.runtimes import jvm\n"
        "jvm.ensure_started('96m')\n"
        "print(jpype.JClass('java.lang.Runtime').getRuntime().maxMemory() >> 20)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    # the serial collector reports -Xmx less one survivor space
    assert 80 <= int(done.stdout) <= 96, done.stderr
