"""``remote_fetch``: remote artefacts fetched into the cache, against a local S3 (moto's
server), a local GCS (gcp-storage-emulator) and a local HTTP server, each started once for
the module."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from inferpool.engine.remote_fetch import MIB, Limits, check_digest, describe, fetch
from inferpool.errors import ModelLoadError
from tests.support.stores import gcs_store, http_store, s3_store


@pytest.fixture(scope="module")
def s3():
    with s3_store() as store:
        yield store


@pytest.fixture(scope="module")
def gcs():
    with gcs_store() as store:
        yield store


@pytest.fixture(scope="module")
def web():
    with http_store() as store:
        yield store


@pytest.fixture
def aws(s3, monkeypatch):
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.fixture
def limits(tmp_path) -> Limits:
    return Limits(tmp_path / "cache", 1 * MIB, 5.0)


def _cached_files(limits: Limits) -> list[Path]:
    return [p for p in limits.cache.rglob("*") if p.is_file()] if limits.cache.exists() else []


def test_an_s3_object_is_fetched_once_per_version(aws, limits):
    aws.put("iris/model.bin", b"first")
    first = fetch("s3://models/iris/model.bin", limits)
    assert first.name == "model.bin" and first.read_bytes() == b"first"
    assert fetch("s3://models/iris/model.bin", limits) == first  # the cache's copy
    aws.put("iris/model.bin", b"second version")
    second = fetch("s3://models/iris/model.bin", limits)
    assert second != first and second.read_bytes() == b"second version"
    assert first.read_bytes() == b"first"  # the copy a running model may use stays
    assert not [p for p in limits.cache.iterdir() if p.name.startswith(".partial")]


def test_an_s3_prefix_is_fetched_as_a_folder(aws, limits):
    aws.put("folder/a/MLmodel", b"flavors: {}")
    aws.put("folder/a/data/model.pkl", b"pickle")
    folder = fetch("s3://models/folder/a", limits)
    assert folder.is_dir() and folder.name == "a"
    assert (folder / "MLmodel").read_bytes() == b"flavors: {}"
    assert (folder / "data" / "model.pkl").read_bytes() == b"pickle"


def test_a_huge_s3_object_is_refused_before_any_byte_is_written(aws, limits):
    aws.put("huge.bin", os.urandom(MIB + MIB // 2))
    with pytest.raises(ModelLoadError) as refused:
        fetch("s3://models/huge.bin", limits)
    assert str(refused.value) == (
        "s3://models/huge.bin holds 1.5 MiB, more than --storage-max-size allows (1.0 MiB): "
        "refused before it fills the disk"
    )
    assert _cached_files(limits) == []


def test_missing_objects_and_buckets_are_not_found(aws, limits, web):
    for uri in ("s3://models/nothing/here.bin", "s3://no-such-bucket/model.bin"):
        with pytest.raises(ModelLoadError, match="was not found"):
            fetch(uri, limits)
    with pytest.raises(ModelLoadError, match=r"^http://\S+/absent.bin was not found"):
        fetch(f"{web.url}/absent.bin", limits)


def test_a_wrong_key_is_access_denied(aws, limits, monkeypatch):
    aws.put("secret.bin", b"x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    with pytest.raises(ModelLoadError) as denied:
        fetch("s3://models/secret.bin", limits)
    assert str(denied.value).startswith("s3://models/secret.bin: access denied")
    assert "AWS_*" in str(denied.value)


def test_an_http_object_is_cached_by_its_etag(web, limits):
    web.objects["/m/model.bin"] = b"weights"
    web.requests.clear()
    path = fetch(f"{web.url}/m/model.bin", limits)
    assert path.read_bytes() == b"weights"
    assert fetch(f"{web.url}/m/model.bin", limits) == path
    assert [r for r in web.requests if r.startswith("GET")] == ["GET /m/model.bin"]
    web.objects["/m/model.bin"] = b"new weights"
    assert fetch(f"{web.url}/m/model.bin", limits).read_bytes() == b"new weights"


def test_a_sha256_fragment_is_checked(web, limits):
    web.objects["/pinned.bin"] = b"the right bytes"
    right = hashlib.sha256(b"the right bytes").hexdigest()
    assert fetch(f"{web.url}/pinned.bin#sha256={right}", limits).read_bytes() == b"the right bytes"
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    with pytest.raises(ModelLoadError) as mismatch:
        fetch(f"{web.url}/pinned.bin#sha256={wrong}", limits)
    assert str(mismatch.value) == (
        f"{web.url}/pinned.bin: the bytes received do not match the URI's #sha256: the "
        "download was corrupted or the object changed while it was read"
    )
    with pytest.raises(ModelLoadError, match="64 hex digits"):
        fetch(f"{web.url}/pinned.bin#sha256=abc", limits)


def test_an_s3_etag_that_is_no_md5_of_the_bytes_is_a_mismatch(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"received")
    info = {"ETag": '"' + hashlib.md5(b"received").hexdigest() + '"', "LastModified": "x"}
    check_digest("s3://b/model.bin", info, path, None)  # matches: nothing raised
    info["ETag"] = '"' + hashlib.md5(b"sent").hexdigest() + '"'
    with pytest.raises(ModelLoadError, match="do not match its ETag"):
        check_digest("s3://b/model.bin", info, path, None)
    # A multipart upload's ETag (an MD5 of MD5s, "-N") says nothing of the bytes.
    check_digest("s3://b/model.bin", {"ETag": '"abc-2"', "LastModified": "x"}, path, None)
    # Nor does an SSE-KMS or SSE-C object's ETag.
    for encryption in ({"ServerSideEncryption": "aws:kms"}, {"SSECustomerAlgorithm": "AES256"}):
        check_digest("s3://b/model.bin", {**info, **encryption}, path, None)
    with pytest.raises(ModelLoadError):  # SSE-S3 (AES256) keeps the MD5
        check_digest("s3://b/model.bin", {**info, "ServerSideEncryption": "AES256"}, path, None)


def test_gcs_md5_and_crc32c_are_checked(tmp_path):
    import google_crc32c

    path = tmp_path / "model.bin"
    path.write_bytes(b"received")
    md5 = base64.b64encode(hashlib.md5(b"received").digest()).decode()
    crc = base64.b64encode(google_crc32c.Checksum(b"received").digest()).decode()
    check_digest("gs://b/model.bin", {"md5Hash": md5, "crc32c": crc}, path, None)
    check_digest("gs://b/model.bin", {"crc32c": crc}, path, None)  # a composite object
    wrong_md5 = base64.b64encode(hashlib.md5(b"sent").digest()).decode()
    with pytest.raises(ModelLoadError, match="do not match its md5Hash"):
        check_digest("gs://b/model.bin", {"md5Hash": wrong_md5, "crc32c": crc}, path, None)
    wrong_crc = base64.b64encode(google_crc32c.Checksum(b"sent").digest()).decode()
    with pytest.raises(ModelLoadError, match="do not match its crc32c"):
        check_digest("gs://b/model.bin", {"crc32c": wrong_crc}, path, None)


def test_a_gcs_object_and_prefix_are_fetched_per_generation(gcs, limits):
    _, writer = gcs
    writer.pipe("models/gcs/model.bin", b"first")
    first = fetch("gs://models/gcs/model.bin", limits)
    assert first.read_bytes() == b"first"
    assert fetch("gs://models/gcs/model.bin", limits) == first
    writer.pipe("models/gcs/model.bin", b"second")  # a new generation
    assert fetch("gs://models/gcs/model.bin", limits).read_bytes() == b"second"
    writer.pipe("models/gcs-folder/MLmodel", b"flavors: {}")
    writer.pipe("models/gcs-folder/data/model.pkl", b"pickle")
    folder = fetch("gs://models/gcs-folder", limits)
    assert (folder / "data" / "model.pkl").read_bytes() == b"pickle"
    with pytest.raises(ModelLoadError, match=r"^gs://models/absent\.bin was not found"):
        fetch("gs://models/absent.bin", limits)


def test_an_object_sent_without_a_size_stops_at_the_limit(web, limits):
    web.objects["/unsized/big.bin"] = b"x" * (2 * MIB)
    with pytest.raises(ModelLoadError, match=r"sent more than 1\.0 MiB, more than --storage-max"):
        fetch(f"{web.url}/unsized/big.bin", limits)
    assert _cached_files(limits) == []


def test_a_silent_server_times_out(web, tmp_path):
    limits = Limits(tmp_path, MIB, 1.0)
    began = time.monotonic()
    with pytest.raises(ModelLoadError) as silent:
        describe(f"{web.url}/silent/model.bin", limits)
    assert str(silent.value) == (
        f"{web.url}/silent/model.bin: the store did not answer within 1s (--storage-timeout)"
    )
    assert time.monotonic() - began < 15


def test_an_object_name_that_would_leave_the_folder_is_refused(aws, limits):
    aws.put("evil/model.bin", b"ok")
    aws.put("evil/a/../../../escaped.bin", b"outside")
    with pytest.raises(ModelLoadError, match=r"the object name .* would leave its folder"):
        fetch("s3://models/evil", limits)
    assert not list(limits.cache.parent.rglob("escaped.bin"))


def test_a_cache_that_cannot_be_written_fails_the_fetch(web, tmp_path):
    web.objects["/cached.bin"] = b"bytes"
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(ModelLoadError) as refused:
        fetch(f"{web.url}/cached.bin", Limits(blocked, MIB, 5.0))
    assert str(refused.value).startswith(
        f"{web.url}/cached.bin: cannot write into the storage cache {blocked} "
        "(--storage-cache-dir):"
    )


def test_an_embedded_engine_without_workers_serves_an_s3_model(aws, tmp_path):
    """--workers 0: the fetched copy loads in this process (the same lifecycle path)."""
    import io
    import json

    import joblib
    from sklearn.linear_model import LogisticRegression

    from inferpool import Engine
    from tests.support import iris_data

    X, y = iris_data()
    buffer = io.BytesIO()
    joblib.dump(LogisticRegression(max_iter=1000).fit(X, y), buffer)
    aws.put("embedded/model.joblib", buffer.getvalue())
    folder = tmp_path / "repo" / "iris"
    folder.mkdir(parents=True)
    settings = {"name": "iris", "parameters": {"uri": "s3://models/embedded/model.joblib"}}
    (folder / "model-settings.json").write_text(json.dumps(settings))
    cache = tmp_path / "cache"
    with Engine(tmp_path / "repo", workers=0, storage_cache_dir=cache, load_probe=False) as engine:
        result = engine.infer_sync("iris", X[[0, 60, 120]])
    assert list(result["predict"]) == [0, 1, 2]
    assert [p.name for p in cache.rglob("model.joblib")] == ["model.joblib"]
