"""Running inferpool's modules under another interpreter (``environments/interpreters.py``):
the overlay the command carries, the refusal of another Python X.Y, and each way the
capability probe can fail, with this interpreter and small fake ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import inferpool
from inferpool.engine.environments import interpreters
from inferpool.engine.environments.interpreters import OVERLAY_ENV, ProbeFailed, command, probe


def fake_python(folder: Path, script: str) -> Path:
    """An executable that runs ``script`` (shell) whatever it is asked."""
    path = folder / "python"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


def test_the_command_carries_the_overlay_and_not_the_server_s_pythonpath(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/server/first")
    monkeypatch.setenv("PYTHONHOME", "/server/home")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv, env = command("/env/bin/python", "some.module", "a", "b", first="PRELUDE\n")
    assert (
        argv[0] == "/env/bin/python" and argv[1] == "-c" and argv[3:] == ["some.module", "a", "b"]
    )
    assert argv[2].startswith("PRELUDE\n") and argv[2].endswith(interpreters.BOOT)
    assert "PYTHONPATH" not in env and "PYTHONHOME" not in env
    overlay = json.loads(env[OVERLAY_ENV])
    assert overlay["python"] == list(sys.version_info[:2])
    assert overlay["package"] == str(Path(inferpool.__file__).resolve())
    assert overlay["path"][0] == str(tmp_path)  # the server's path, after the environment's
    assert all(Path(entry).is_dir() for entry in overlay["path"])


def test_a_module_runs_with_this_package_loaded_from_the_server_s_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "where.py").write_text(
        "import sys, inferpool\nprint(inferpool.__file__, sys.argv[1:])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv, env = command(sys.executable, "where", "x")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(Path(inferpool.__file__).resolve()), "['x']"]


def test_another_python_version_exits_with_a_sentence_saying_so() -> None:
    argv, env = command(sys.executable, "where")
    overlay = json.loads(env[OVERLAY_ENV])
    overlay["python"] = [2, 7]  # as if the server ran 2.7: this interpreter differs
    env[OVERLAY_ENV] = json.dumps(overlay)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    version = "{}.{}".format(*sys.version_info[:2])
    assert done.stderr.strip() == (
        f"this environment runs Python {version}; the server runs 2.7, and the workers "
        "of an environment must run the same Python X.Y"
    )


def test_the_probe_reads_this_interpreter_s_capabilities() -> None:
    answer = probe(sys.executable)
    assert isinstance(answer, dict) and answer  # what capabilities.py prints, as JSON


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("echo 'Traceback' >&2; echo 'ImportError: no orjson' >&2; exit 1", "ImportError: no"),
        ("exit 3", "exited with 3"),
        ("echo 'not json'", "printed no capabilities"),
        ("echo '[1, 2]'", "printed no capabilities"),
    ],
)
def test_a_probe_that_fails_says_why(tmp_path: Path, script: str, says: str) -> None:
    python = fake_python(tmp_path, script)
    with pytest.raises(ProbeFailed) as raised:
        probe(python)
    assert says in str(raised.value)


def test_an_interpreter_that_does_not_run_or_hangs_fails_the_probe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ProbeFailed, match="did not run"):
        probe(tmp_path / "no-such-python")
    monkeypatch.setattr(interpreters, "PROBE_TIMEOUT", 0.2)
    with pytest.raises(ProbeFailed, match=r"did not run: .*timed out"):
        probe(fake_python(tmp_path, "exec sleep 30"))
