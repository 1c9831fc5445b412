"""Per-model environments: what a model names, and the cache of unpacked tarballs.

A model may run in a Python environment of its own (docs/environments.md), named in its
settings as MLServer names it:

- ``parameters.environment_tarball``: a conda-pack or venv tarball (``.tar.gz``, ``.tgz``,
  ``.tar``), unpacked once into the cache folder ``<cache>/<key>/``, where the key is the
  first 16 hex digits of the sha256 of the tarball's bytes (the same bytes anywhere share
  one folder; changed bytes get a new one);
- ``parameters.environment_path``: an existing environment folder, used where it is.

Relative paths are relative to the model's folder. This module owns the naming, the
unpacking and the checks (a member escaping the folder, no interpreter inside, a corrupt
archive); the lead's worker groups start the environment's interpreter.

Unpacking is safe against other threads, processes and servers sharing the cache: one
lock file per key serialises the unpackers, each unpacks into a temporary folder in the
cache and renames it into place, and a marker file written last says the folder is
complete (a crash before it leaves a folder that the next ``prepare`` throws away).
conda-pack's ``bin/conda-unpack`` rewrites the prefixes to the folder it runs in, so it
runs once after the rename, before the marker.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from inferpool.errors import ModelLoadError

if TYPE_CHECKING:
    from inferpool.settings import ModelSettings

TARBALL_KEY = "environment_tarball"
FOLDER_KEY = "environment_path"
# Written last into an unpacked folder: without it the folder is a crashed half-unpack.
MARKER = ".inferpool-unpacked"
_CHUNK = 1 << 20
KEY_DIGITS = 16
_INTERPRETERS = ("python3", "python")
# conda-unpack only rewrites text in files; minutes would mean something is wrong.
_CONDA_UNPACK_TIMEOUT = 600.0
# 'tar', not 'data': a venv's bin/python is an absolute symlink to its base interpreter,
# which 'data' refuses. _check_members refuses what escapes on its own, so a Python 3.11
# older than 3.11.4 (no filters) is as safe; the filter adds clearing setuid bits.
_FILTER: dict[str, Any] = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}


class EnvironmentUnusable(ModelLoadError):
    """A model's environment cannot be used; the message is one sentence naming it."""


@dataclass(frozen=True, slots=True)
class Environment:
    """A ready environment: its folder and interpreter."""

    key: str  # first 16 hex of the sha256 of the tarball's bytes, or of the folder's path
    root: Path  # the unpacked (or existing) environment folder
    python: Path  # root/bin/python3 or root/bin/python, not resolved (a venv needs its link)
    source: str  # what the model named, for messages and logs


def named_environment(settings: ModelSettings, server: Path | None = None) -> Path | None:
    """The environment a model names: ``parameters.environment_tarball`` (MLServer's key) or
    ``parameters.environment_path`` (an existing folder), relative to the model's folder;
    else the ``server``'s (``ServerSettings.environment_tarball``: every model runs in it
    as if it named it); None if none. Both keys set, or a value that is not a path:
    ``EnvironmentUnusable``."""
    extra = settings.parameters.model_extra or {}
    given = [key for key in (TARBALL_KEY, FOLDER_KEY) if extra.get(key) is not None]
    if not given:
        return server
    if len(given) > 1:
        raise EnvironmentUnusable(
            f"model '{settings.name}' names both parameters.{TARBALL_KEY} and "
            f"parameters.{FOLDER_KEY}: keep one"
        )
    value = extra[given[0]]
    if not isinstance(value, str) or not value.strip():
        raise EnvironmentUnusable(
            f"model '{settings.name}': parameters.{given[0]} must be a path, not {value!r}"
        )
    # Normalised, so that logs and metrics show the folder, not the way to it.
    return Path(os.path.normpath(settings.resolve(value)))


def default_cache() -> Path:
    """Where unpacked tarballs live: ``$XDG_CACHE_HOME/inferpool/environments``, or
    ``~/.cache/inferpool/environments``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec: a relative value is invalid and is ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "inferpool" / "environments"


def tarball_digest(path: Path) -> str:
    """The sha256 of a tarball's bytes, in hex; read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tarball_key(path: Path) -> str:
    """The cache key of a tarball: the first 16 hex digits of the sha256 of its bytes."""
    return tarball_digest(path)[:KEY_DIGITS]


def prepare(named: Path, cache: Path) -> Environment:
    """The environment ``named`` stands for, ready to start: a folder is checked and used in
    place; a tarball is unpacked once into ``cache`` (see the module's docstring). Blocks
    while hashing and unpacking: call it from a thread. ``EnvironmentUnusable`` otherwise."""
    source = str(named)
    if named.is_dir():
        root = named.resolve()
        key = hashlib.sha256(str(root).encode()).hexdigest()[:KEY_DIGITS]
        return Environment(key, root, _interpreter(root, source), source)
    if not named.exists():
        raise EnvironmentUnusable(f"environment {source} does not exist")
    if not named.is_file():
        raise EnvironmentUnusable(f"environment {source} is neither a tarball nor a folder")
    try:
        key = tarball_key(named)
        cache = cache.resolve()
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentUnusable(f"environment {source} cannot be read or cached: {exc}") from None
    root = cache / key
    if not (root / MARKER).is_file():
        with _locked(cache / f"{key}.lock", source):
            # Another process may have finished it while this one waited for the lock.
            if not (root / MARKER).is_file():
                _unpack_into_cache(named, cache, key, source)
    return Environment(key, root, _interpreter(root, source), source)


@contextmanager
def _locked(path: Path, source: str) -> Iterator[None]:
    # flock: released by the kernel when its holder dies, so a crash never wedges the cache.
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EnvironmentUnusable(f"environment {source} cannot be cached: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def _unpack_into_cache(tarball: Path, cache: Path, key: str, source: str) -> None:
    """Unpack, under the key's lock: leftovers of crashed unpacks go first."""
    root = cache / key
    shutil.rmtree(root, ignore_errors=True)
    for leftover in cache.glob(f".tmp-{key}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=cache))
    try:
        _unpack(tarball, staging, source)
        _interpreter(staging, source)  # checked before anything lands under the key
        os.rename(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    unpack_script = root / "bin" / "conda-unpack"
    if unpack_script.is_file():
        _run_conda_unpack(root, unpack_script, source)
    marker = root / (MARKER + ".part")
    marker.write_text(json.dumps({"source": source, "key": key}) + "\n")
    marker.rename(root / MARKER)


def _unpack(tarball: Path, into: Path, source: str) -> None:
    try:
        with tarfile.open(tarball, "r:*") as archive:
            members = archive.getmembers()  # reads the whole listing: a truncated file fails here
            _check_members(members, source)
            archive.extractall(into, members=members, **_FILTER)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        if isinstance(exc, getattr(tarfile, "FilterError", ())):
            raise EnvironmentUnusable(f"environment {source} was refused: {exc}") from None
        reason = (str(exc) or type(exc).__name__).splitlines()[0]
        if "could not be opened successfully" in reason:  # 'r:*' tried every compression
            reason = "neither a gzip, bzip2 or xz compressed tar nor a plain one"
        raise EnvironmentUnusable(
            f"environment {source} is not a readable tarball ({reason})"
        ) from None


def _check_members(members: list[tarfile.TarInfo], source: str) -> None:
    links = {PurePosixPath(m.name) for m in members if m.issym()}
    for member in members:
        _check_member(member, source)
        # A member written through a symlink member lands where the link points.
        through = next((p for p in PurePosixPath(member.name).parents if p in links), None)
        if through is not None:
            raise EnvironmentUnusable(
                f"environment {source} holds a member under the link {str(through)!r} "
                f"({member.name!r}): refused"
            )


def _check_member(member: tarfile.TarInfo, source: str) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise EnvironmentUnusable(
            f"environment {source} holds a member outside its folder ({member.name!r}): refused"
        )
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise EnvironmentUnusable(
            f"environment {source} holds a device or pipe ({member.name!r}): refused"
        )
    if member.islnk() or member.issym():
        link = PurePosixPath(member.linkname)
        if member.issym() and link.is_absolute():
            return  # a venv's interpreter link: it points at the machine's Python, no write
        # A hard link names a member; a relative symlink is relative to its own folder.
        target = link if member.islnk() else name.parent / link
        if link.is_absolute() or ".." in PurePosixPath(os.path.normpath(target)).parts:
            raise EnvironmentUnusable(
                f"environment {source} holds a link out of its folder "
                f"({member.name!r} -> {member.linkname!r}): refused"
            )


def _interpreter(root: Path, source: str) -> Path:
    for name in _INTERPRETERS:
        candidate = root / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    for name in _INTERPRETERS:
        candidate = root / "bin" / name
        if candidate.is_symlink():
            raise EnvironmentUnusable(
                f"environment {source} has bin/{name} linking to {os.readlink(candidate)}, "
                "which is not an interpreter on this machine (a venv runs only where its base "
                "Python is installed at the same path; a conda-pack tarball carries its own)"
            )
    raise EnvironmentUnusable(
        f"environment {source} has no Python interpreter (bin/python3 or bin/python)"
    )


def _run_conda_unpack(root: Path, script: Path, source: str) -> None:
    python = _interpreter(root, source)
    try:
        result = subprocess.run(
            [str(python), str(script)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=_CONDA_UNPACK_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentUnusable(f"environment {source}: bin/conda-unpack failed: {exc}") from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        raise EnvironmentUnusable(f"environment {source}: bin/conda-unpack failed: {reason}")
