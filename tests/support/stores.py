"""Local object stores for the remote-storage tests, each in a thread of the test process
on 127.0.0.1: moto's S3 server (with its IAM checks on, so that a wrong key is refused as
AWS refuses it), gcp-storage-emulator's GCS JSON API, and an HTTP server whose objects a
test sets, with paths that misbehave.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from benchmarks.ports import free_port

BUCKET = "models"
_POLICY = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'


@dataclass
class S3Store:
    """moto's S3 at ``endpoint``; ``env``: the variables of a client allowed to use it."""

    endpoint: str
    env: dict[str, str]
    client: object = None

    def put(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=body)  # type: ignore[attr-defined]


@contextmanager
def s3_store() -> Iterator[S3Store]:
    """moto's server with bucket ``models``, and an IAM user's key allowed everything;
    every later request must be signed by that key (moto's auth checks turned on)."""
    import boto3
    import httpx
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    anyone = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
    # moto's state and its auth switch live in this process: a store started earlier in it
    # left both behind.
    httpx.post(f"{endpoint}/moto-api/reset").raise_for_status()
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf").raise_for_status()
    try:
        iam = boto3.client("iam", **setup, **anyone)
        iam.create_user(UserName="inferpool")
        iam.put_user_policy(UserName="inferpool", PolicyName="all", PolicyDocument=_POLICY)
        key = iam.create_access_key(UserName="inferpool")["AccessKey"]
        credentials = {
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
        }
        httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()
        client = boto3.client("s3", **setup, **credentials)
        client.create_bucket(Bucket=BUCKET)
        env = {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
        yield S3Store(endpoint, env, client)
    finally:
        httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf")
        server.stop()


@contextmanager
def gcs_store() -> Iterator[tuple[str, object]]:
    """gcp-storage-emulator (in memory) with bucket ``models``: its address (for
    ``STORAGE_EMULATOR_HOST``) and a gcsfs filesystem that writes to it."""
    from gcp_storage_emulator.server import create_server
    from gcsfs.core import GCSFileSystem

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    address = f"http://127.0.0.1:{port}"
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = address  # read by gcsfs when it is made
    try:
        yield address, GCSFileSystem(token="anon", skip_instance_cache=True)
    finally:
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
        server.stop()


@dataclass
class HttpStore:
    """``objects`` served at ``url`` + their path, with an ETag (their sha256); paths
    under ``/silent/`` are accepted and never answered, under ``/unsized/`` sent without
    a Content-Length (HTTP/1.0, the connection's end ends them)."""

    url: str
    objects: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@contextmanager
def http_store() -> Iterator[HttpStore]:
    port = free_port()
    store = HttpStore(f"http://127.0.0.1:{port}")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            store.requests.append(f"{self.command} {self.path}")
            if self.path.startswith("/silent/"):
                store.release.wait(120)  # never answers while the test runs
                return
            data = store.objects.get(self.path)
            if data is None:
                self.send_error(404)
                return
            unsized = self.path.startswith("/unsized/")
            if unsized:
                self.protocol_version = "HTTP/1.0"
                self.close_connection = True
            self.send_response(200)
            if not unsized:
                self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield store
    finally:
        store.release.set()
        server.shutdown()
        server.server_close()
