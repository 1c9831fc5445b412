"""A streamed request's flow control on the wire: the reply flags of its chunks, the two
windows that bound what either side holds, and the three control messages of a stream's
input (``Credit``, ``Feed``, ``EndInput``).

The frontend's side is ``engine/stream_sink.py`` (and ``engine/stream_feed.py`` in-process),
the worker's ``engine/worker/streaming.py`` and ``engine/worker/stream_input.py``.
"""

from __future__ import annotations

from inferpool.engine.ipc.ops import Control, Op

# Reply header flag: more replies to the same request follow this one (a stream's chunk).
MORE = 1
# Reply header flag: no chunk, the stream's runtime took one more fed request (with
# ``MORE``): the frontend may feed one more (``INPUT_WINDOW``).
TOOK = 2
# Chunks a stream may send ahead of its consumer (``Credit`` returns them).
STREAM_WINDOW = 16
# Requests fed into a running stream that its runtime has not taken yet, at most: a fast
# client waits (HTTP/2 flow control) instead of queueing without bound.
INPUT_WINDOW = 4


class Credit(Control, frozen=True):
    """A stream's consumer took ``chunks`` of its replies: the worker may send as many
    more (``engine/streams.py``: the window that bounds what a slow consumer buffers)."""

    op = Op.CREDIT
    request_id: int
    chunks: int


class Feed(Control, frozen=True):
    """One more request (``body``, in its stream's wire format) for the running stream
    ``request_id`` (``engine/worker/stream_input.py``)."""

    op = Op.FEED
    request_id: int
    body: bytes


class EndInput(Control, frozen=True):
    """The client of stream ``request_id`` sends no more requests."""

    op = Op.END_INPUT
    request_id: int
