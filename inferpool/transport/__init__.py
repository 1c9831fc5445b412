"""Network transports that know nothing of the protocols carried over them.

``http2.py`` is an RFC 9113 server connection, in layers: ``http2_frames.py`` (frames
in), ``http2_streams.py`` (streams, answers out, stream errors), ``http2_headers.py``
(HPACK decoding) and ``http2_wire.py`` (the wire vocabulary). What a request means (gRPC's
routes, framing and statuses) belongs to the frontend that uses it (``frontends/grpc``).
"""
