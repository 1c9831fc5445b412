"""A model file that will not load, said in one sentence: which file, which library, what.

Every built-in runtime opens its artefact inside ``reading(path, library)``, the one place
where a library's load errors become sentences. It does two things:

- it tells the process's listener which file it is about to open (``listen``): the worker
  template, the workers and the load probe send that to the frontend before the library
  runs, so that a load that kills its process (LightGBM and XGBoost abort or crash on some
  truncated files, and may hang on others) is blamed on that file (``crashed``);
- it turns what the library raised into a ``ModelLoadError`` whose message names the file
  and the library and says what is wrong (truncated, corrupt, empty, another format under
  the right name, a pickle of a class that is not installed, a newer format), instead of
  ``KeyError: 204``.

Nothing here imports a model library.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from inferpool.errors import ModelLoadError

# Who hears of each file a runtime opens (file, library): set by the process that loads.
_listener: Callable[[str, str], None] | None = None

MAX_DETAIL = 160  # characters of the library's own message kept in the sentence


def listen(listener: Callable[[str, str], None] | None, stop_after_reading: bool = False) -> None:
    """Have ``listener(file, library)`` called before each artefact is opened (None: stop).

    ``stop_after_reading``: a load stops (``ArtefactRead``) as soon as its artefact has been
    read, before the runtime builds anything from it (the load probe asks only that)."""
    global _listener, _stop_after_reading
    _listener, _stop_after_reading = listener, stop_after_reading


_stop_after_reading = False


class ArtefactRead(BaseException):
    """Raised out of ``reading`` once the artefact has been read, when ``listen`` asked."""


@contextmanager
def reading(path: Path, library: str) -> Iterator[None]:
    """Open ``path`` with ``library`` (its display name, e.g. ``"LightGBM"``) in the block:
    announced first, and any error of the block raised as one ``ModelLoadError`` sentence."""
    if _listener is not None:
        _listener(str(path), library)
    if path.is_file() and path.stat().st_size == 0:
        # Never handed to the library: XGBoost aborts the process on an empty buffer.
        raise ModelLoadError(f"{path.name} is not a valid {library} model (the file is empty)")
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(describe(exc, path, library)) from None
    if _stop_after_reading:
        raise ArtefactRead(str(path))


def describe(exc: BaseException, path: Path, library: str) -> str:
    """The sentence for ``library`` failing to load ``path`` with ``exc``."""
    name = path.name
    if isinstance(exc, WrongModel):
        return f"{name} is not a valid {library} model ({exc})"
    if isinstance(exc, ModuleNotFoundError):
        module = exc.name or "a module"
        return (
            f"{name} is not a model this server can load with {library} (it is a pickle that "
            f"needs the module '{module}', which is not installed; it was written with other "
            "libraries or another version of them)"
        )
    if isinstance(exc, AttributeError) and looks_like(path) == "a pickle":
        # Unpickling looks up each class by name: a missing one raises AttributeError.
        return (
            f"{name} is not a model this server can load with {library} (it is a pickle of a "
            f"class that does not exist here: {_detail(exc)}; it was written with another "
            "version of the library, or needs code that is not installed)"
        )
    if isinstance(exc, ValueError) and "unsupported pickle protocol" in str(exc):
        return (
            f"{name} is not a valid {library} model ({_detail(exc)}: it was written by a "
            "newer Python than this server runs)"
        )
    looks = looks_like(path)
    expected = _expected_format(path, library)
    if looks is not None and expected is not None and looks != expected:
        return f"{name} is not a valid {library} model (it holds {looks}, not {expected})"
    what = "the file may be truncated or corrupt"
    if isinstance(exc, MemoryError):
        what = "it asked for more memory than there is; the file may be corrupt"
    return f"{name} is not a valid {library} model ({_detail(exc)}; {what})"


def crashed(path: str, library: str, how: str) -> str:
    """The sentence for a load of ``path`` by ``library`` that ``how`` (e.g. ``"aborted"``,
    ``"was killed by signal SIGSEGV"``, ``"hung for 30 s"``) its process."""
    return (
        f"{Path(path).name} is not a valid {library} model (the process {how} while "
        f"{library} parsed it; the file may be truncated or corrupt)"
    )


# The first bytes of the formats a model file may hold, in the order they are tried.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x80", "a pickle"),
    (b"CBM1", "a CatBoost model"),
    (b"tree\n", "a LightGBM text model"),
    (b"tree\r\n", "a LightGBM text model"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\x78", "zlib-compressed data"),  # a joblib file saved with compress=True
    (b"{L", "UBJSON"),
    (b"{$", "UBJSON"),
    (b"{i", "UBJSON"),
    (b"{U", "UBJSON"),
    (b"{", "JSON"),
    (b"[", "JSON"),
)


def looks_like(path: Path) -> str | None:
    """What the file's first bytes say it holds (``"a pickle"``, ``"JSON"``...), or None."""
    try:
        with path.open("rb") as file:
            head = file.read(8).lstrip(b" \t\r\n")
    except OSError:
        return None
    for signature, kind in _SIGNATURES:
        if head.startswith(signature):
            return kind
    if head and all(32 <= byte < 127 or byte in b"\t\r\n" for byte in head):
        return "text"
    return None


def _expected_format(path: Path, library: str) -> str | None:
    """The format ``library`` reads under this file name, when only one fits it."""
    suffix = path.suffix
    if suffix in (".joblib", ".pkl", ".pickle"):
        # joblib writes a pickle, or compressed data holding one.
        compressed = looks_like(path) in ("gzip-compressed data", "zlib-compressed data")
        return None if compressed else "a pickle"
    if library == "LightGBM" and suffix in (".txt", ".bst"):
        return "a LightGBM text model"
    if library == "XGBoost" and suffix == ".json":
        return "JSON"
    if library == "XGBoost" and suffix == ".ubj":
        return "UBJSON"
    if library == "CatBoost":
        return "a CatBoost model"  # save_model's own format (MLServer's model.bin too)
    return None


# XGBoost's "[10:21:33] src/x.cc:12: ", LightGBM's "[LightGBM] [Fatal] ", CatBoost's
# "catboost/libs/model/model.cpp:1185: ".
_NATIVE_NOISE = re.compile(
    r"^\[[0-9:]+\]\s+\S+:\d+:\s*|^\[LightGBM\] \[\w+\]\s*|^[\w/.]+\.cpp:\d+:\s*"
)


def _detail(exc: BaseException) -> str:
    """The library's message, first line only, without its source location and backtrace."""
    text = str(exc).strip()
    if isinstance(exc, pickle.UnpicklingError | EOFError | KeyError | IndexError) or not text:
        kind = type(exc).__name__
        text = f"{kind}: {text}" if text else kind
        if isinstance(exc, EOFError | KeyError | IndexError):
            text = f"the pickle stream breaks off or is garbled ({text})"
    elif (
        type(exc).__module__ == "builtins"
        and not isinstance(exc, ValueError | RuntimeError)  # libraries' own messages
        and not text.startswith(type(exc).__name__)
    ):
        # Python's own errors say little without their name ("division by zero").
        text = f"{type(exc).__name__}: {text}"
    line = _NATIVE_NOISE.sub("", text.splitlines()[0] if text else "").strip()
    printable = "".join(c if c.isprintable() else "?" for c in line)
    if len(printable) > MAX_DETAIL:
        printable = printable[: MAX_DETAIL - 3] + "..."
    return printable or type(exc).__name__


def check_type(model: object, expected: tuple[type, ...], library: str) -> None:
    """A pickle that holds another library's model (or none) under the runtime's name."""
    if not isinstance(model, expected):
        raise WrongModel(f"it holds a {type(model).__name__}, not a {library} model")


class WrongModel(TypeError):
    """The artefact loaded, as an object of a class the runtime does not serve."""
