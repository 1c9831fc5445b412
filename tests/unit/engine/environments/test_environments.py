"""What a model names as its environment, and the cache that unpacks tarballs once."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from inferpool.engine.environments.unpack import (
    MARKER,
    EnvironmentUnusable,
    default_cache,
    named_environment,
    prepare,
    tarball_key,
)
from inferpool.errors import ModelLoadError
from inferpool.settings import ModelSettings
from tests.support.environments import add_file, add_link, environment_tarball

ROOT = Path(__file__).resolve().parents[3]


def counting_unpack(counter: Path) -> str:
    """A conda-unpack stand-in that records the folder it ran in, once per run."""
    return f"import os\nwith open({str(counter)!r}, 'a') as f:\n    f.write(os.getcwd() + '\\n')\n"


def test_a_folder_is_used_in_place(tmp_path: Path) -> None:
    folder = tmp_path / "env"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python3").symlink_to(sys.executable)
    environment = prepare(tmp_path / "." / "env", tmp_path / "cache")
    assert environment.root == folder.resolve()
    assert environment.python == folder / "bin" / "python3"
    assert environment.key == hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
    assert environment.source == str(tmp_path / "." / "env")
    assert not (tmp_path / "cache").exists()  # nothing copied


def test_a_folder_with_only_bin_python_is_found(tmp_path: Path) -> None:
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").symlink_to(sys.executable)
    assert prepare(tmp_path / "env", tmp_path / "cache").python.name == "python"


def test_a_folder_without_an_interpreter_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python3").write_text("not executable")
    with pytest.raises(EnvironmentUnusable, match=r"env has no Python interpreter"):
        prepare(tmp_path / "env", tmp_path / "cache")


def test_a_tarball_is_unpacked_once_and_conda_unpack_runs_once(tmp_path: Path) -> None:
    counter = tmp_path / "conda-unpack-runs"
    tarball = environment_tarball(
        tmp_path / "env.tar.gz",
        {"lib/site-packages/mod.py": "X = 1\n", "pyvenv.cfg": "home = /usr\n"},
        conda_unpack=counting_unpack(counter),
    )
    cache = tmp_path / "cache"
    first = prepare(tarball, cache)
    assert first.key == tarball_key(tarball)
    assert first.root == cache.resolve() / first.key
    assert first.python == first.root / "bin" / "python3"
    assert (first.root / "lib/site-packages/mod.py").read_text() == "X = 1\n"
    # conda-unpack ran in the final folder (it rewrites prefixes to where it runs).
    assert counter.read_text().splitlines() == [str(first.root)]
    marker = (first.root / MARKER).stat()
    (first.root / "left-by-the-first").write_text("")

    second = prepare(tarball, cache)
    assert second == first
    assert (first.root / "left-by-the-first").exists()  # not unpacked again
    assert (first.root / MARKER).stat().st_ino == marker.st_ino
    assert counter.read_text().splitlines() == [str(first.root)]
    ran = subprocess.run([first.python, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert ran.stdout == "42\n"


def test_the_key_is_the_hash_of_the_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    one = environment_tarball(tmp_path / "one.tgz", {"a.txt": "a"})
    (tmp_path / "elsewhere").mkdir()
    same = tmp_path / "elsewhere" / "copy.tgz"
    shutil.copyfile(one, same)
    other = environment_tarball(tmp_path / "other.tgz", {"a.txt": "b"})
    assert prepare(one, cache).root == prepare(same, cache).root
    assert prepare(one, cache).key == hashlib.sha256(one.read_bytes()).hexdigest()[:16]
    assert prepare(other, cache).root != prepare(one, cache).root
    assert (prepare(other, cache).root / "a.txt").read_text() == "b"


def test_an_uncompressed_tar_is_unpacked(tmp_path: Path) -> None:
    tarball = environment_tarball(tmp_path / "env.tar", {"a.txt": "plain"}, mode="w")
    assert (prepare(tarball, tmp_path / "cache").root / "a.txt").read_text() == "plain"


def test_a_half_unpacked_folder_is_not_used(tmp_path: Path) -> None:
    tarball = environment_tarball(tmp_path / "env.tgz", {"a.txt": "whole"})
    cache = tmp_path / "cache"
    key = tarball_key(tarball)
    # What a crash leaves: the folder without the marker, and a staging folder.
    (cache / key / "bin").mkdir(parents=True)
    (cache / key / "a.txt").write_text("half")
    (cache / f".tmp-{key}-crashed").mkdir()
    environment = prepare(tarball, cache)
    assert (environment.root / "a.txt").read_text() == "whole"
    assert (environment.root / MARKER).is_file()
    assert not list(cache.glob(".tmp-*"))


def test_a_failed_conda_unpack_leaves_no_marker_and_is_retried(tmp_path: Path) -> None:
    flag = tmp_path / "fail"
    flag.write_text("")
    script = (
        f"import os, sys\nif os.path.exists({str(flag)!r}):\n    sys.exit('prefix rewrite broke')\n"
    )
    tarball = environment_tarball(tmp_path / "env.tgz", conda_unpack=script)
    cache = tmp_path / "cache"
    with pytest.raises(EnvironmentUnusable, match=r"conda-unpack failed: prefix rewrite broke"):
        prepare(tarball, cache)
    assert not (cache / tarball_key(tarball) / MARKER).exists()
    flag.unlink()
    assert (prepare(tarball, cache).root / MARKER).is_file()


CONCURRENT = """
import sys, time
from pathlib import Path
from inferpool.engine.environments.unpack import prepare
go = Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
print(prepare(Path(sys.argv[1]), Path(sys.argv[2])).root)
"""


def test_concurrent_prepares_from_several_processes_share_one_folder(tmp_path: Path) -> None:
    counter = tmp_path / "conda-unpack-runs"
    files = {f"lib/pkg/m{i}.py": "x = 1\n" * 200 for i in range(300)}
    unpack = counting_unpack(counter)
    tarball = environment_tarball(tmp_path / "env.tgz", files, conda_unpack=unpack)
    cache, go = tmp_path / "cache", tmp_path / "go"
    command = [sys.executable, "-c", CONCURRENT, str(tarball), str(cache), str(go)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    processes = [subprocess.Popen(command, **pipes, text=True, cwd=ROOT) for _ in range(4)]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
    go.write_text("")
    outcomes = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0] * 4, outcomes
    roots = {out.strip() for out, _ in outcomes}
    assert roots == {str(cache.resolve() / tarball_key(tarball))}
    assert counter.read_text().splitlines() == list(roots)  # one unpack, one conda-unpack
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        tarball_key(tarball)
    ]
    assert len(list((cache / tarball_key(tarball) / "lib/pkg").iterdir())) == 300


def test_concurrent_prepares_from_threads_share_one_folder(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    counter = tmp_path / "runs"
    tarball = environment_tarball(tmp_path / "env.tgz", conda_unpack=counting_unpack(counter))
    with ThreadPoolExecutor(4) as pool:
        roots = set(pool.map(lambda _: prepare(tarball, tmp_path / "cache").root, range(8)))
    assert len(roots) == 1
    assert len(counter.read_text().splitlines()) == 1


def escaping_tarball(path: Path, how: str) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        add_link(archive, "bin/python3", sys.executable)
        if how == "dotdot":
            add_file(archive, "lib/../../evil.txt", "x")
        elif how == "absolute":
            add_file(archive, str(path.parent / "evil.txt"), "x")
        elif how == "relative symlink":
            add_link(archive, "lib/escape", "../../..")
        elif how == "hard link":
            add_link(archive, "lib/passwd", "/etc/passwd", hard=True)
        elif how == "through a symlink":
            add_link(archive, "lib/out", str(path.parent))
            add_file(archive, "lib/out/evil.txt", "x")
    return path


@pytest.mark.parametrize(
    "how", ["dotdot", "absolute", "relative symlink", "hard link", "through a symlink"]
)
def test_members_escaping_the_folder_are_refused(tmp_path: Path, how: str) -> None:
    tarball = escaping_tarball(tmp_path / "evil.tgz", how)
    cache = tmp_path / "cache"
    with pytest.raises(EnvironmentUnusable, match=r"evil\.tgz .*refused"):
        prepare(tarball, cache)
    assert not (tmp_path / "evil.txt").exists()
    assert sorted(p.name for p in cache.iterdir()) == [f"{tarball_key(tarball)}.lock"]


def test_a_tarball_without_an_interpreter_is_refused_and_not_cached(tmp_path: Path) -> None:
    tarball = environment_tarball(tmp_path / "env.tgz", {"lib/a.py": ""}, interpreter=None)
    with pytest.raises(EnvironmentUnusable, match=r"env\.tgz has no Python interpreter"):
        prepare(tarball, tmp_path / "cache")
    assert not (tmp_path / "cache" / tarball_key(tarball)).exists()


def test_an_interpreter_link_to_nowhere_says_so(tmp_path: Path) -> None:
    tarball = environment_tarball(tmp_path / "env.tgz", interpreter="/nowhere/bin/python3.11")
    expected = r"bin/python3 linking to /nowhere/bin/python3\.11, which is not an interpreter"
    with pytest.raises(EnvironmentUnusable, match=expected):
        prepare(tarball, tmp_path / "cache")


def test_corrupt_and_missing_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(os.urandom(4096))
    whole = environment_tarball(tmp_path / "whole.tgz", {"a.txt": "x" * 100_000}).read_bytes()
    truncated = tmp_path / "truncated.tgz"
    truncated.write_bytes(whole[: len(whole) // 2])
    not_tar = tmp_path / "not-tar.tgz"
    not_tar.write_bytes(gzip.compress(b"hello" * 1000))
    for path in (garbage, truncated, not_tar):
        with pytest.raises(EnvironmentUnusable, match=r"is not a readable tarball") as caught:
            prepare(path, tmp_path / "cache")
        assert str(path) in str(caught.value)
        assert "\n" not in str(caught.value)
    with pytest.raises(EnvironmentUnusable, match=r"absent\.tgz does not exist"):
        prepare(tmp_path / "absent.tgz", tmp_path / "cache")
    assert issubclass(EnvironmentUnusable, ModelLoadError)


def settings(folder: Path, **parameters: object) -> ModelSettings:
    return ModelSettings(name="iris", parameters=parameters, folder=folder)


def test_named_environment_reads_mlservers_key_and_a_folder(tmp_path: Path) -> None:
    model = tmp_path / "models" / "iris"
    assert named_environment(settings(model)) is None
    assert named_environment(settings(model, environment_tarball="env.tar.gz")) == (
        model / "env.tar.gz"
    )
    # Normalised: logs and metrics show the file, not the way to it.
    assert named_environment(settings(model, environment_tarball="../shared/env.tgz")) == (
        model.parent / "shared/env.tgz"
    )
    assert named_environment(settings(model, environment_path="/opt/envs/sk13")) == Path(
        "/opt/envs/sk13"
    )
    assert named_environment(settings(model, environment_path="venv")) == model / "venv"


def test_named_environment_refuses_both_keys_and_non_paths(tmp_path: Path) -> None:
    both = settings(tmp_path, environment_tarball="a.tgz", environment_path="b")
    with pytest.raises(EnvironmentUnusable, match=r"model 'iris' names both .*keep one"):
        named_environment(both)
    for value in (3, "", ["a.tgz"]):
        with pytest.raises(EnvironmentUnusable, match=r"environment_tarball must be a path"):
            named_environment(settings(tmp_path, environment_tarball=value))


def test_default_cache_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache() == tmp_path / "xdg" / "inferpool" / "environments"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache() == tmp_path / "home" / ".cache" / "inferpool" / "environments"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache() == tmp_path / "home" / ".cache" / "inferpool" / "environments"


def test_a_big_tarball_is_hashed_in_chunks(tmp_path: Path) -> None:
    """The key matches hashlib over the whole bytes past several 1 MiB chunks."""
    big = tmp_path / "big.tgz"
    big.write_bytes(os.urandom(3 * 2**20 + 17))
    started = time.monotonic()
    assert tarball_key(big) == hashlib.sha256(big.read_bytes()).hexdigest()[:16]
    assert time.monotonic() - started < 5


def test_a_tarball_of_a_folder_made_with_dot_members_is_unpacked(tmp_path: Path) -> None:
    """``tar czf env.tgz -C myvenv .`` names its members ``./bin/python3``..."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").symlink_to(sys.executable)
    (venv / "lib64").symlink_to("lib")
    (venv / "lib").mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    with tarfile.open(tmp_path / "env.tgz", "w:gz") as archive:
        archive.add(venv, arcname=".")
        assert "./bin/python3" in archive.getnames()
    environment = prepare(tmp_path / "env.tgz", tmp_path / "cache")
    assert (environment.root / "pyvenv.cfg").is_file()
    assert os.readlink(environment.root / "lib64") == "lib"
    ran = subprocess.run([environment.python, "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True)  # fmt: skip
    assert ran.stdout.strip() == str(environment.root)  # the venv's pyvenv.cfg was found
