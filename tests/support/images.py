"""Test images made here with Pillow: PNG and JPEG files of given pixels, a 16-bit PNG,
and the header of a decompression bomb."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def pixels_of(file: bytes) -> np.ndarray:
    """The pixels Pillow reads from an image file."""
    return np.asarray(Image.open(io.BytesIO(file)))


def sixteen_bit_png() -> bytes:
    return png(np.full((4, 5), 40000, np.uint16))


def bomb_header(width: int, height: int) -> bytes:
    """A valid PNG of a few dozen bytes whose header declares ``width`` x ``height``
    grayscale pixels (its data holds almost none of them)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = chunk(b"IDAT", zlib.compress(b"\0" * 64))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + data + chunk(b"IEND", b"")
