"""MLServer's behaviours around ``predict``, served by inferpool without MLServer: the
runtimes of ``tests/mlserver/parity_runtimes.py`` with only their import lines rewritten
to ``inferpool.mlserver``; ``unload()`` awaited, adaptive batching, response headers over
REST and gRPC (the tests are ``tests/mlserver/parity_cases.py``'s), in worker processes
with the builtin gRPC server and in-process with grpcio's."""

from __future__ import annotations

from tests.mlserver.parity_cases import (  # noqa: F401 - collected here
    fixtures,
    test_adaptive_batching_joins_concurrent_requests,
    test_failing_unload_is_logged_and_the_server_stays_up,
    test_max_batch_size_alone_does_not_batch,
    test_response_headers_are_grpc_trailing_metadata,
    test_response_headers_are_http_headers,
    test_unload_is_awaited_async_or_sync,
)

served, server, repository = fixtures(rewrite=True)
