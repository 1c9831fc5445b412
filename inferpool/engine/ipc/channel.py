"""The control channel: typed messages (and file descriptors) over a Unix socketpair.

A ``SOCK_SEQPACKET`` socketpair keeps message boundaries and carries fds, and its EOF
tells the other side at once that the process died. A message too big for the socket
travels in its own memfd, sent as an fd and released by the receiver after reading.
The parts of a message (a request's slot header, its body) are written to the memfd by
one ``writev``, never joined first; a spilled request or reply is read back as its header
and its body apart (``messages.Parts``), so its body is not copied again to cut the
header off.
"""

from __future__ import annotations

import array
import itertools
import os
import socket
from collections.abc import Callable, Sequence

from inferpool.engine.ipc import messages

# A message up to this size goes inline; above it, in a memfd.
INLINE_LIMIT = 32 * 1024
_SPILLED = 0x80  # opcode bit: the payload is in the last fd
_MAX_FDS = 8
_FD_SPACE = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def memfd_with(parts: Sequence[bytes]) -> int:
    """A memfd holding ``parts`` back to back (one copy of the data)."""
    fd = os.memfd_create("inferpool-payload", os.MFD_CLOEXEC)
    try:
        # writev, not a mapping: a fresh mapping's page faults and unmapping cost 2-3x more.
        size = sum(len(part) for part in parts)
        written = os.writev(fd, parts) if size else 0
        while written < size:  # a short write (a signal, a huge payload): the rest
            rest = b"".join(parts)[written:]
            written += os.write(fd, rest)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_memfd(fd: int) -> bytes:
    """The whole content of a memfd, which is closed (and so released) afterwards."""
    try:
        return _pread_all(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def read_memfd_parts(fd: int) -> messages.Parts:
    """A spilled request's or reply's slot header and body, each read into its own bytes
    (one copy of the body, where a whole read then a slice made two); the memfd is
    closed afterwards. A memfd shorter than a header (only a bug sends one) gives what
    it holds as the header."""
    try:
        size = os.fstat(fd).st_size
        head = min(size, messages.HEADER_SIZE)
        return messages.Parts(_pread_all(fd, head, 0), _pread_all(fd, size - head, head))
    finally:
        os.close(fd)


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes of ``fd`` from ``offset``, over as many reads as it takes."""
    if size == 0:
        return b""
    data = os.pread(fd, size, offset)
    while 0 < len(data) < size:  # a short read: the rest
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


class Outgoing:
    """A message ready to send; a big payload already sits in its own memfd."""

    __slots__ = ("data", "fds", "spill")

    def __init__(self, op: int, parts: Sequence[bytes], fds: Sequence[int] = ()) -> None:
        self.spill: int | None = None
        if sum(len(part) for part in parts) + 1 <= INLINE_LIMIT:
            self.data = bytes([op]) + b"".join(parts)
            self.fds = list(fds)
        else:
            self.spill = memfd_with(parts)
            self.data = bytes([op | _SPILLED])
            self.fds = [*fds, self.spill]

    def release(self) -> None:
        """Close our copy of the spilled payload (the receiver holds its own)."""
        if self.spill is not None:
            os.close(self.spill)
            self.spill = None


def _rights(fds: Sequence[int]) -> tuple[int, int, bytes]:
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())


class Channel:
    """One end of a control socketpair. Sends block; receives may or may not."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(True)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, op: int, *parts: bytes, fds: Sequence[int] = ()) -> None:
        self.send_packed(Outgoing(op, parts, fds), block=True)

    def send_control(self, message: messages.Control, fds: Sequence[int] = ()) -> None:
        """Send a typed control message (blocking)."""
        self.send(message.op, messages.encode(message), fds=fds)

    def send_packed(self, message: Outgoing, block: bool) -> None:
        """Send a packed message; non-blocking, BlockingIOError means try again later."""
        flags = 0 if block else socket.MSG_DONTWAIT
        if message.fds:
            self.sock.sendmsg([message.data], [_rights(message.fds)], flags)
        else:
            self.sock.sendmsg([message.data], [], flags)
        message.release()

    def receive(self, block: bool = True) -> tuple[int, bytes, list[int]]:
        """(opcode, payload, fds); EOFError when the other side is gone.

        Non-blocking, it raises BlockingIOError when nothing is waiting.
        """
        flags = 0 if block else socket.MSG_DONTWAIT
        # socket.recv_fds would ignore ``flags`` (Python 3.11), so unpack SCM_RIGHTS here.
        data, ancillary, _, _ = self.sock.recvmsg(INLINE_LIMIT, _FD_SPACE, flags)
        return self._unpacked(data, ancillary)

    @staticmethod
    def _unpacked(
        data: bytes, ancillary: list[tuple[int, int, bytes]]
    ) -> tuple[int, bytes, list[int]]:
        """A received message's opcode, payload and fds; EOFError for the other side's EOF."""
        fds = _received_fds(ancillary)
        if not data:
            for fd in fds:
                os.close(fd)
            raise EOFError("the other side closed the channel")
        op = data[0]
        if op & _SPILLED:
            return op & ~_SPILLED, read_memfd(fds[-1]), fds[:-1]
        return op, data[1:], fds

    def _receive_parts(self) -> tuple[int, bytes | messages.Parts, list[int]]:
        """``receive`` without blocking, a spilled request or reply read as its ``Parts``."""
        data, ancillary, _, _ = self.sock.recvmsg(INLINE_LIMIT, _FD_SPACE, socket.MSG_DONTWAIT)
        if data and data[0] & _SPILLED and data[0] & ~_SPILLED in messages.BINARY_OPS:
            fds = _received_fds(ancillary)
            return data[0] & ~_SPILLED, read_memfd_parts(fds[-1]), fds[:-1]
        return self._unpacked(data, ancillary)

    def dispatch_pending(
        self, dispatch: Callable[[int, bytes | messages.Parts], object], limit: int | None = None
    ) -> bool:
        """Hand every message waiting (at most ``limit``) to ``dispatch(op, payload)``
        without blocking, and close the fds that came with each; False once the other
        side has gone."""
        for _ in itertools.repeat(None) if limit is None else range(limit):
            try:
                op, payload, fds = self._receive_parts()
            except BlockingIOError:
                return True
            except (EOFError, OSError):
                return False
            if fds and op in messages.FD_OPS:  # its handler takes (and owns) them
                dispatch(op, messages.WithFds(payload, fds))  # type: ignore[arg-type]
                continue
            for fd in fds:
                os.close(fd)
            dispatch(op, payload)
        return True

    def close(self) -> None:
        self.sock.close()


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return list(fds)
