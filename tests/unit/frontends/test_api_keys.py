"""The API key file and its check (``frontends/api_keys.py``), and the REST guard."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from inferpool.engine.admin import SettingsError
from inferpool.errors import Forbidden, RateLimited, Unauthorized
from inferpool.frontends.api_keys import ApiKeys, presented, rest_scope
from inferpool.frontends.file_poll import FilePoll, poll_forever
from inferpool.frontends.grpc.service import check_key
from inferpool.frontends.rest.key_guard import KeyGuard
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support.code_blocks import ROOT, blocks

FILE = """\
# every model
alpha-key-0001   label=ops
beta-key-0002    iris  forest   # two models, no label
\t
"""


@pytest.fixture
def keys(tmp_path: Path) -> ApiKeys:
    path = tmp_path / "keys"
    path.write_text(FILE)
    return ApiKeys(path)


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"x"), (b"authorization", f"Bearer {key}".encode())]


def test_the_documented_file_means_what_the_page_says(tmp_path: Path) -> None:
    page = "docs/operate/security.md"
    (block,) = [b for b in blocks((ROOT / page).read_text(), page) if "label=ops" in b.code]
    path = tmp_path / "keys"
    path.write_text(block.code)
    keys = ApiKeys(path)
    ops, fraud = "3f9c1e0d8b7a4c2e9d1f0a6b5c4d3e2f", "a81b72c63d54e45f36a27b18c09d0e1f"
    assert keys.check(bearer(ops), "iris") == "ops"
    assert keys.check([(b"x-api-key", fraud.encode())], "fraud-rules") == "fraud"
    with pytest.raises(Forbidden):
        keys.check(bearer(fraud), "iris")


def test_keys_labels_and_scopes(keys: ApiKeys) -> None:
    assert len(keys) == 2
    assert keys.check(bearer("alpha-key-0001"), "anything") == "ops"
    assert keys.check([("x-api-key", "beta-key-0002")], "iris") == "line 3"
    assert keys.check(bearer("beta-key-0002"), None) == "line 3"  # a server-wide read
    with pytest.raises(Forbidden, match="not valid for model 'other'"):
        keys.check(bearer("beta-key-0002"), "other")
    with pytest.raises(Forbidden):
        keys.check(bearer("beta-key-0002"), None, admin=True)
    assert keys.check(bearer("alpha-key-0001"), None, admin=True) == "ops"
    assert keys.label(bearer("alpha-key-0001")) == "ops"
    assert keys.label(bearer("nope")) is None and keys.label([]) is None


@pytest.mark.parametrize(
    "pairs",
    [
        [],
        [(b"authorization", b"Basic YWxhZGRpbjpvcGVuc2VzYW1l")],
        [(b"authorization", b"Bearer ")],
        bearer("alpha-key-000"),  # a prefix
        bearer("alpha-key-00011"),  # longer
        bearer("x" * 100_000),  # huge: refused before hashing
        [(b"authorization", b"Bearer alpha-key-0001 # comment")],
    ],
)
def test_no_key_or_a_wrong_one_is_unauthorized(keys: ApiKeys, pairs) -> None:
    with pytest.raises(Unauthorized) as refused:
        keys.check(pairs, "iris")
    assert "alpha" not in refused.value.message and "x" * 20 not in refused.value.message


def test_bearer_first_then_x_api_key() -> None:
    assert presented([(b"x-api-key", b"k2"), (b"authorization", b"bearer k1")]) == b"k1"
    assert presented([(b"authorization", b"Basic abc"), (b"x-api-key", b"k2")]) == b"k2"
    assert presented([("authorization", "Bearer  k3 ")]) == b"k3"
    assert presented([(b"content-type", b"x")]) is None


def test_keys_are_kept_hashed_and_never_shown(keys: ApiKeys) -> None:
    assert "alpha" not in repr(keys)
    assert all(b"alpha" not in digest for digest in keys._keys)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("# only a comment\n\n", "holds no key"),
        ("caf\u00e9-key\n", "not ASCII"),
        ("k" * 5000 + "\n", "at most 4096"),
    ],
)
def test_unusable_files_are_refused(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(SettingsError, match=error):
        ApiKeys(path)
    with pytest.raises(SettingsError, match="cannot read"):
        ApiKeys(tmp_path / "missing")


def test_rest_paths() -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/v2/models/m/ready",
                 "/v2/models/m/versions/2/ready", "/ping", "/health"):  # fmt: skip
        assert rest_scope(path)[0] is False, path
    assert rest_scope("/v2/models/m/infer") == (True, "m", False)
    assert rest_scope("/v2/models/m/versions/1/infer") == (True, "m", False)
    assert rest_scope("/v2/models/stats") == (True, None, False)
    assert rest_scope("/v2/models/stats/infer") == (True, "stats", False)
    assert rest_scope("/v2") == (True, None, False)
    assert rest_scope("/v2/repository/models/m/load") == (True, None, True)


def test_rest_paths_of_the_v1_protocol_and_the_settings_extensions() -> None:
    # KServe V1: the root (liveness) and a model's readiness are its probes; predict and
    # explain name their model before the colon, so a key limited to models holds there.
    assert rest_scope("/")[0] is False
    assert rest_scope("/v1/models/m")[0] is False
    assert rest_scope("/v1/models/m:predict") == (True, "m", False)
    assert rest_scope("/v1/models/m:explain") == (True, "m", False)
    assert rest_scope("/v1/models") == (True, None, False)
    # Triton's trace and log settings are the admin's, as load and unload are.
    for path in ("/v2/trace/setting", "/v2/logging", "/v2/models/m/trace/setting",
                 "/v2/models/m/versions/1/trace/setting"):  # fmt: skip
        assert rest_scope(path) == (True, None, True), path


def test_shared_memory_calls_are_server_wide_whatever_their_region_is_named(keys: ApiKeys) -> None:
    # A region's name is not a model's: a key limited to models may register "other".
    assert rest_scope("/v2/systemsharedmemory/region/other/register") == (True, None, False)
    request = pb.SystemSharedMemoryRegisterRequest(name="other", key="/k", byte_size=8)
    check_key(keys, "SystemSharedMemoryRegister", request, bearer("beta-key-0002"))
    with pytest.raises(Unauthorized):
        check_key(keys, "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(), [])


def test_a_key_limited_to_models_is_refused_on_another_models_v1_predict(keys: ApiKeys) -> None:
    needed, model, admin = rest_scope("/v1/models/other:predict")
    assert needed and model == "other"
    with pytest.raises(Forbidden):
        keys.check(bearer("beta-key-0002"), model, admin)
    assert keys.check(bearer("beta-key-0002"), "iris", False) == "line 3"


def test_the_poll_reloads_a_changed_file(keys: ApiKeys) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(poll_forever(FilePoll([keys.path]), keys.reload, "keys", 0.01))
        time.sleep(0.01)  # a distinct modification time
        keys.path.write_text("gamma-key-0003\n")
        for _ in range(300):
            await asyncio.sleep(0.01)
            if len(keys) == 1:
                break
        keys.path.write_text("")  # unusable: the previous keys stay
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert keys.check(bearer("gamma-key-0003"), "iris") == "line 1"
    with pytest.raises(Unauthorized):
        keys.check(bearer("alpha-key-0001"), "iris")


def test_the_rest_guard_answers_401_with_a_challenge(keys: ApiKeys) -> None:
    sent: list[dict] = []
    reached: list[str] = []

    async def app(scope, receive, send) -> None:
        reached.append(scope["path"])

    async def send(message: dict) -> None:
        sent.append(message)

    guard = KeyGuard(app, keys)
    scope = {"type": "http", "path": "/v2/models/iris/infer", "headers": []}
    asyncio.run(guard(scope, None, send))
    assert sent[0]["status"] == 401 and not reached
    headers = dict(sent[0]["headers"])
    assert headers[b"www-authenticate"] == b'Bearer realm="inferpool"'
    assert headers[b"connection"] == b"close"  # its body unread: not reused over HTTP/1.1
    assert b"needs an API key" in sent[1]["body"]
    sent.clear()
    asyncio.run(guard({**scope, "headers": bearer("nope")}, None, send))
    assert b'error="invalid_token"' in dict(sent[0]["headers"])[b"www-authenticate"]
    asyncio.run(guard({**scope, "headers": bearer("beta-key-0002")}, None, send))
    asyncio.run(guard({**scope, "path": "/v2/health/ready"}, None, send))
    assert reached == ["/v2/models/iris/infer", "/v2/health/ready"]


def test_a_key_with_a_rate_is_limited_on_calls_naming_a_model(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("fast-key-01 label=fast\nslow-key-02 iris label=slow rate=1 burst=2\n")
    keys = ApiKeys(path)
    slow = bearer("slow-key-02")
    assert keys.check(slow, "iris") == keys.check(slow, "iris") == "slow"  # its burst
    with pytest.raises(RateLimited, match="API key is over its rate limit") as refused:
        keys.check(slow, "iris")
    assert refused.value.status == 429 and refused.value.retry_seconds == 1
    assert "slow-key" not in refused.value.message
    assert keys.check(slow, None) == "slow"  # a server-wide read takes no token
    for _ in range(20):  # the other key has no limit
        assert keys.check(bearer("fast-key-01"), "iris") == "fast"
    with pytest.raises(Forbidden):  # its scope still comes first
        keys.check(slow, "other")


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("k-1 rate=0", "rate= takes requests per second > 0"),
        ("k-1 rate=fast", "rate= takes requests per second > 0"),
        ("k-1 rate=nan", "rate= takes requests per second > 0"),
        ("k-1 rate=5 burst=0", "burst= takes a whole number >= 1"),
        ("k-1 rate=5 burst=2.5", "burst= takes a whole number >= 1"),
        ("k-1 burst=3", "burst= needs rate="),
    ],
)
def test_bad_rates_are_refused_naming_the_line(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "keys"
    path.write_text(f"ok-key-0\n{line}\n")
    with pytest.raises(SettingsError, match=f"line 2 of the API key file .*{error}"):
        ApiKeys(path)
