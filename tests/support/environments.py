"""Per-model environment material made on the spot: hand-built wheels (for offline
``pip install --no-index --find-links``) and environment tarballs laid out as conda-pack
and ``inferpool env pack`` write them (members at the root, ``bin/python3`` inside)."""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import zipfile
from pathlib import Path


def build_wheel(
    folder: Path, name: str, version: str, code: str = "", requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel of the package ``name`` whose ``__version__`` is ``version``,
    followed by ``code`` in its ``__init__.py``; ``requires``: its Requires-Dist lines."""
    info = f"{name}-{version}.dist-info"
    depends = "".join(f"Requires-Dist: {line}\n" for line in requires)
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n{code}",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{depends}",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def add_file(archive: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    member = tarfile.TarInfo(name)
    member.size, member.mode = len(data), mode
    archive.addfile(member, io.BytesIO(data))


def add_link(archive: tarfile.TarFile, name: str, target: str, hard: bool = False) -> None:
    member = tarfile.TarInfo(name)
    member.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    member.linkname = target
    archive.addfile(member)


def environment_tarball(
    path: Path,
    files: dict[str, str] | None = None,
    interpreter: str | None = sys.executable,
    conda_unpack: str | None = None,
    mode: str = "w:gz",
) -> Path:
    """A tarball holding ``bin/python3`` (an absolute symlink to ``interpreter``, as a venv's
    is; none if None), ``files`` and, if given, a ``bin/conda-unpack`` script's source."""
    with tarfile.open(path, mode) as archive:
        if interpreter is not None:
            add_link(archive, "bin/python3", interpreter)
        for name, text in (files or {}).items():
            add_file(archive, name, text)
        if conda_unpack is not None:
            add_file(archive, "bin/conda-unpack", conda_unpack, 0o755)
    return path
