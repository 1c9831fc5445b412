"""Remote model artefacts: a ``parameters.uri`` of ``s3://``, ``gs://`` or ``http(s)://``
fetched once into a local cache, with fsspec (s3fs, gcsfs, its HTTP filesystem: the
``remote`` extra).

``fetch`` asks the store for the object's description first (its size, its version: S3's
ETag and VersionId, GCS's generation, HTTP's ETag or Last-Modified), refuses one larger
than the limit before a byte is written, and reuses what the cache holds under the URI and
that version. Otherwise it streams the object into a temporary folder beside the cache,
counting bytes against the limit (a store may not say the size, or say it wrong), checks
the checksum the store gives (S3's ETag when it is an MD5, i.e. a single-part upload
without KMS; GCS's md5Hash, else crc32c; an HTTP ``#sha256=HEX`` fragment or a
Content-MD5 header) and renames the folder into place: the cache holds complete, verified
copies only. A URI naming an S3 or GCS prefix (a "folder") fetches every object under it.

Credentials and endpoints are the stores' own: botocore's chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL[_S3]``...) and Google's
(``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``). Every failure is a
``ModelLoadError`` with one sentence naming the URI. The calls block: the lifecycle runs
them in a thread (``remote_models``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from inferpool.errors import ModelLoadError

SCHEMES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}
CHUNK = 1024 * 1024
MIB = 1024 * 1024
# What the stores' clients read their credentials and endpoints from.
_VARIABLES = ("AWS_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "GCLOUD_", "CLOUDSDK_")
_FILESYSTEMS: dict[tuple[str, float, tuple[tuple[str, str], ...]], Any] = {}
_LOCK = threading.Lock()


def is_remote(uri: str | None) -> bool:
    """``uri`` names an object in a store (a scheme ``fetch`` reads), not a local path."""
    return bool(uri) and urllib.parse.urlsplit(str(uri)).scheme in SCHEMES


@dataclass(frozen=True)
class Limits:
    """Where copies go, the largest model accepted (bytes) and the seconds a store may
    stay silent before a connection or a read fails."""

    cache: Path
    max_bytes: int
    timeout: float


@dataclass(frozen=True)
class Remote:
    """One object (or prefix) as the store describes it now."""

    uri: str  # without the fragment
    files: tuple[tuple[str, dict[str, Any]], ...]  # (path below the URI, fsspec info)
    version: str  # what changes when any of its bytes do

    @property
    def size(self) -> int:
        return sum(int(info.get("size") or 0) for _, info in self.files)


def describe(uri: str, limits: Limits) -> Remote:
    """What the store holds at ``uri`` now (one request for an object); ModelLoadError
    with the reason when it cannot say."""
    with _reasons(uri, limits):
        fs, path = _filesystem(uri, limits)
        info = fs.info(path)
        if info.get("type") == "directory" and not uri.startswith("http"):
            found = fs.find(path, detail=True)
            files = tuple(
                (name[len(path.rstrip("/")) + 1 :], found[name])
                for name in sorted(found)
                if found[name].get("type") != "directory"
            )
            if not files:
                raise FileNotFoundError(path)
        else:
            files = (("", info),)
    plain = uri.split("#", 1)[0]
    digest = hashlib.sha256(uri.encode())  # with its #sha256: a copy checked against it
    for name, info in files:
        digest.update(f"\n{name}\0{object_version(info)}".encode())
    return Remote(plain, files, digest.hexdigest()[:32])


def fetch(uri: str, limits: Limits, remote: Remote | None = None) -> Path:
    """The local copy of ``uri`` (a file, or a folder for a prefix) as ``remote``
    (``describe``'s answer) describes it, downloaded unless the cache holds that version."""
    sha256 = _fragment(uri)
    remote = remote or describe(uri, limits)
    if remote.size > limits.max_bytes:
        raise ModelLoadError(_too_large(remote.uri, remote.size, limits.max_bytes))
    name = _basename(remote.uri)
    final = limits.cache / remote.version
    if (final / name).exists():
        return final / name
    try:
        limits.cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=limits.cache))
    except OSError as exc:
        raise ModelLoadError(
            f"{remote.uri}: cannot write into the storage cache {limits.cache} "
            f"(--storage-cache-dir): {exc.strerror or exc}"
        ) from None
    try:
        with _reasons(remote.uri, limits):
            fs, _ = _filesystem(uri, limits)
            budget = limits.max_bytes
            for below, info in remote.files:
                target = _inside(staging / name, below, remote.uri)
                target.parent.mkdir(parents=True, exist_ok=True)
                budget -= _download(fs, info, target, remote.uri, budget, limits)
                if uri.startswith("s3://"):
                    info = _with_encryption(fs, info)
                check_digest(_joined(remote.uri, below), info, target, sha256)
            try:
                os.rename(staging, final)  # atomic: the cache never shows a partial copy
            except OSError:
                if not (final / name).exists():  # not another process's copy, placed first
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final / name


def _inside(root: Path, below: str, uri: str) -> Path:
    """Where an object of a prefix goes under ``root``; a name that would leave it (``..``,
    an absolute path: a hostile bucket) fails the fetch."""
    parts = [part for part in below.split("/") if part]
    if below.startswith("/") or any(part in (".", "..") for part in parts):
        raise ModelLoadError(f"{uri}: the object name {below!r} would leave its folder")
    return root.joinpath(*parts)


def object_version(info: dict[str, Any]) -> str:
    """What identifies an object's content in its store's description: S3's VersionId
    and ETag, GCS's generation, HTTP's ETag or Last-Modified (and the size)."""
    parts = [
        str(info[key])
        for key in ("VersionId", "generation", "ETag", "etag", "md5Hash", "Last-Modified")
        if info.get(key)
    ]
    return "|".join([*parts, str(info.get("size"))])


def check_digest(uri: str, info: dict[str, Any], path: Path, sha256: str | None) -> None:
    """ModelLoadError when the bytes at ``path`` differ from a checksum the store gave."""
    expected: list[tuple[str, str, bytes]] = []  # (name, algorithm, digest)
    if sha256:
        expected.append(("the URI's #sha256", "sha256", bytes.fromhex(sha256)))
    etag = str(info.get("ETag") or "").strip('"')
    # S3: a single-part upload's ETag is the MD5 of its bytes, unless KMS or a customer's
    # key encrypts them (``_with_encryption``), when it is not.
    encrypted = str(info.get("ServerSideEncryption")).startswith("aws:kms")
    encrypted = encrypted or bool(info.get("SSECustomerAlgorithm"))
    if "LastModified" in info and len(etag) == 32 and _is_hex(etag) and not encrypted:
        expected.append(("its ETag (MD5)", "md5", bytes.fromhex(etag)))
    for key in ("md5Hash", "Content-MD5"):  # GCS; an HTTP server's header
        if info.get(key):
            expected.append((f"its {key}", "md5", base64.b64decode(info[key])))
            break
    else:
        if info.get("crc32c"):
            expected.append(("its crc32c", "crc32c", base64.b64decode(info["crc32c"])))
    for what, algorithm, digest in expected:
        if _digest(path, algorithm) != digest:
            raise ModelLoadError(
                f"{uri}: the bytes received do not match {what}: the download was corrupted "
                "or the object changed while it was read"
            )


def _download(
    fs: Any, info: dict[str, Any], target: Path, uri: str, budget: int, limits: Limits
) -> int:
    """Stream one object into ``target``, never past ``budget`` bytes; bytes written."""
    written = 0
    with _open(fs, info) as source, open(target, "wb") as sink:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > budget:  # the store said less, or nothing: still refused
                raise ModelLoadError(_too_large(uri, written, limits.max_bytes, "over"))
            sink.write(chunk)
    return written


def _with_encryption(fs: Any, info: dict[str, Any]) -> dict[str, Any]:
    """An S3 object's description with its encryption, which S3's listings and s3fs's
    description leave out (one HEAD request, once per download)."""
    bucket, key, _ = fs.split_path(info["name"])
    head = fs.call_s3("head_object", Bucket=bucket, Key=key)
    keys = ("ServerSideEncryption", "SSECustomerAlgorithm")
    return {**info, **{name: head.get(name) for name in keys}}


def _open(fs: Any, info: dict[str, Any]) -> BinaryIO:
    name = info.get("url") or info["name"]
    if fs.protocol[0].startswith("http"):
        # A streamed GET: no range requests, which simple servers do not answer.
        return fs.open(name, "rb", block_size=0)  # type: ignore[no-any-return]
    return fs.open(name, "rb", block_size=8 * MIB, cache_type="readahead")  # type: ignore[no-any-return]


def _filesystem(uri: str, limits: Limits) -> tuple[Any, str]:
    """The fsspec filesystem for ``uri``, its listings cache emptied (none may hide a
    change), and the path it takes. One per scheme, timeout and credential variables:
    making an S3 client costs about a second of CPU, too much for every poll."""
    scheme = urllib.parse.urlsplit(uri).scheme
    variables = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_VARIABLES)))
    key = (scheme, limits.timeout, variables)
    with _LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            fs = _FILESYSTEMS[key] = _new_filesystem(uri, scheme, limits)
    fs.invalidate_cache()
    if scheme.startswith("http"):
        return fs, uri.split("#", 1)[0]
    return fs, fs._strip_protocol(uri)


def _new_filesystem(uri: str, scheme: str, limits: Limits) -> Any:
    try:
        import fsspec

        if scheme == "s3":
            import s3fs

            timeouts = {"connect_timeout": limits.timeout, "read_timeout": limits.timeout}
            # One retry: botocore's default five make a silent store take minutes to fail.
            config = {**timeouts, "retries": {"max_attempts": 2, "mode": "standard"}}
            fs: Any = s3fs.S3FileSystem(config_kwargs=config, skip_instance_cache=True)
        elif scheme in ("gs", "gcs"):
            # The plain filesystem: gcsfs's default (its experimental "extended" one) first
            # asks a gRPC API for the bucket's type, which an emulator does not answer.
            from gcsfs.core import GCSFileSystem

            fs = GCSFileSystem(requests_timeout=limits.timeout, skip_instance_cache=True)
        else:
            import aiohttp

            timeout = aiohttp.ClientTimeout(sock_connect=limits.timeout, sock_read=limits.timeout)
            fs = fsspec.filesystem(
                "http", client_kwargs={"timeout": timeout}, skip_instance_cache=True
            )
    except ImportError as exc:
        raise ModelLoadError(
            f"{uri}: reading {scheme}:// URIs needs {SCHEMES[scheme]} ({exc.name} is not "
            "installed): pip install 'inferpool[remote]'"
        ) from None
    return fs


class _reasons:
    """Turns what a store raises into one ModelLoadError sentence naming the URI."""

    def __init__(self, uri: str, limits: Limits) -> None:
        self.uri, self.limits = uri.split("#", 1)[0], limits

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if exc is None or isinstance(exc, ModelLoadError) or not isinstance(exc, Exception):
            return
        raise ModelLoadError(failure_sentence(self.uri, exc, self.limits.timeout)) from None


def failure_sentence(uri: str, exc: Exception, timeout: float) -> str:
    """One sentence for a store's error (its type names the kind of failure; fsspec's
    HTTP filesystem says FileNotFoundError for any failed request, with the cause chained)."""
    chain = [exc]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        following = chain[-1].__cause__ or chain[-1].__context__
        if not isinstance(following, Exception) or following in chain or len(chain) > 8:
            break
        chain.append(following)
    kinds = " ".join(type(e).__name__ for e in chain)
    texts = " ".join(" ".join(str(e).split())[:300] for e in chain)
    if any(isinstance(e, TimeoutError) for e in chain) or "Timeout" in kinds:
        return f"{uri}: the store did not answer within {timeout:g}s (--storage-timeout)"
    if any(isinstance(e, PermissionError) for e in chain) or " 403" in f" {texts}":
        return (
            f"{uri}: access denied ({' '.join(str(exc).split())[:200] or kinds}); check the "
            "credentials the store's usual variables give (AWS_*, GOOGLE_APPLICATION_CREDENTIALS)"
        )
    if isinstance(exc, FileNotFoundError) or "NoSuchKey" in texts or "NoSuchBucket" in texts:
        return f"{uri} was not found (no such object or bucket)"
    text = " ".join(str(exc).split())[:300]
    return f"{uri}: cannot fetch it ({type(exc).__name__}: {text})"


def _too_large(uri: str, size: int, limit: int, over: str = "") -> str:
    said = f"sent more than {_amount(limit)}" if over else f"holds {_amount(size)}"
    return (
        f"{uri} {said}, more than --storage-max-size allows ({_amount(limit)}): "
        "refused before it fills the disk"
    )


def _amount(size: int) -> str:
    return f"{size / MIB:.1f} MiB" if size >= MIB // 10 else f"{size} bytes"


def _digest(path: Path, algorithm: str) -> bytes:
    if algorithm == "crc32c":
        # gcsfs's dependency, there whenever a gs:// object is read (untyped: a module).
        crc32c: Any = importlib.import_module("google_crc32c")
        checksum = crc32c.Checksum()
        for chunk in _chunks(path):
            checksum.update(chunk)
        return checksum.digest()  # type: ignore[no-any-return]
    hasher = hashlib.new(algorithm)
    for chunk in _chunks(path):
        hasher.update(chunk)
    return hasher.digest()


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            yield chunk


def _fragment(uri: str) -> str | None:
    """The hex digest of an ``#sha256=HEX`` fragment, if the URI has one."""
    fragment = urllib.parse.urlsplit(uri).fragment
    if not fragment.startswith("sha256="):
        return None
    value = fragment[len("sha256=") :].lower()
    if len(value) != 64 or not _is_hex(value):
        raise ModelLoadError(f"{uri}: #sha256= must be followed by 64 hex digits")
    return value


def _basename(uri: str) -> str:
    name = urllib.parse.urlsplit(uri).path.rstrip("/").rsplit("/", 1)[-1]
    return urllib.parse.unquote(name) or "model"


def _joined(uri: str, below: str) -> str:
    return f"{uri.rstrip('/')}/{below}" if below else uri


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)
