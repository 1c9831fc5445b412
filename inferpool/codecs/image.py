"""The ``image`` codec: BYTES elements holding PNG or JPEG files, as a numpy array of the
declared size, channel order, layout and dtype (``image_spec.ImageSpec``), and back.

An element is the file itself (gRPC, the binary extension) or its base64 text, with or
without a ``data:image/...;base64,`` prefix (JSON, which cannot carry raw bytes). A tensor
of shape ``S`` decodes to an array of shape ``S + image shape``: a batch of N images to
``[N, H, W, C]`` (or ``[N, C, H, W]``); grayscale keeps its channel axis of 1.

Memory stays bounded whatever a file's header claims: each image's size is read from its
header and checked (against the declared size, and ``max_pixels`` summed over the tensor)
before its pixels are decoded. An image of another size is a 400 unless the declaration
asks to ``resize`` it. Only 8-bit modes are taken (16-bit or float images would need a
scaling nobody declared). Pillow is an optional dependency (``inferpool[image]``),
imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import io
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferpool.codecs.base import InputCodec, bytes_tensor, require_bytes
from inferpool.codecs.image_spec import CONTENT_TYPE, PILLOW_MODE, ImageSpec, parse_spec
from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import Tensor, TensorSpec

INSTALL_HINT = "content type 'image' needs Pillow: pip install inferpool[image]"
# The first bytes of the files we decode: anything else is taken as base64 text.
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")
# 8-bit modes Pillow converts to RGB/RGBA/L without losing or rescaling values.
_EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "La", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX",
                              "CMYK", "YCbCr"})  # fmt: skip
_CHANNELS_TO_MODE = {1: "L", 3: "RGB", 4: "RGBA"}
# What Pillow raises for a corrupt or truncated file: the client's file, never a server fault.
_CORRUPT = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)


def pillow() -> Any:
    """Pillow's ``Image`` module; ImportError with the install hint when it is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return Image


class ImageCodec(InputCodec):
    content_types = (CONTENT_TYPE,)

    @classmethod
    def can_encode(cls, value: Any) -> bool:
        # An array says nothing about being an image: only a declared output is encoded so.
        return False

    @classmethod
    def decode(cls, tensor: Tensor) -> np.ndarray:
        """Decode by the declaration in the tensor's own parameters (among others)."""
        try:
            spec = parse_spec(tensor.parameters, strict=False)
        except ValueError as exc:
            raise BadRequest(f"input '{tensor.name}': {exc}") from None
        return decode_images(tensor, spec)

    @classmethod
    def encode(cls, name: str, value: Any) -> Tensor:
        return encode_images(name, value, ImageSpec())


def decode_images(tensor: Tensor, spec: ImageSpec) -> np.ndarray:
    """The images of a BYTES tensor as one array; a 400 names the input and the image."""
    require_bytes(tensor, CONTENT_TYPE)
    try:
        image_module = pillow()
    except ImportError as exc:
        raise ModelError(str(exc)) from None
    items = tensor.data.reshape(-1).tolist()
    if spec.height is not None and spec.width is not None:
        total = len(items) * spec.height * spec.width
        if total > spec.max_pixels:
            raise BadRequest(
                f"input '{tensor.name}': {len(items)} images of {spec.width}x{spec.height} "
                f"are {total} pixels, more than max_pixels ({spec.max_pixels})"
            )
    decoder = _Decoder(image_module, spec, tensor.name)
    out: np.ndarray | None = None
    for index, item in enumerate(items):
        image = decoder.decode(item, index)
        if out is None:
            out = np.empty((len(items), *image.shape), dtype=image.dtype)
        elif image.shape != out.shape[1:]:
            raise BadRequest(
                f"input '{tensor.name}': image {index} is {decoder.size_of(image)}, image 0 is "
                f"{decoder.size_of(out[0])}; images of one input must share a size (declare "
                "height, width and resize to make them)"
            )
        out[index] = image
    if out is None:  # no images: the declared size, else an empty one
        height, width = (spec.height or 0), (spec.width or 0)
        out = np.empty((0, *spec.image_shape(height, width)), dtype=spec.dtype)
    return out.reshape(tuple(tensor.shape) + out.shape[1:])


class _Decoder:
    """Decodes the images of one tensor one by one, keeping count of the pixels."""

    def __init__(self, image_module: Any, spec: ImageSpec, name: str) -> None:
        self.image_module = image_module
        self.spec = spec
        self.name = name
        self.pixels_left = spec.max_pixels

    def decode(self, item: bytes, index: int) -> np.ndarray:
        try:
            return self._decode(item)
        except _Refused as exc:
            raise BadRequest(f"input '{self.name}': image {index} {exc}") from None

    def size_of(self, image: np.ndarray) -> str:
        height, width = image.shape[1:] if self.spec.layout == "CHW" else image.shape[:2]
        return f"{width}x{height}"

    def _decode(self, item: bytes) -> np.ndarray:
        Image = self.image_module
        spec = self.spec
        try:
            image = Image.open(io.BytesIO(_file_bytes(item)), formats=("PNG", "JPEG"))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            # Beyond Pillow's own limit (its warning, between 1x and 2x the limit, is only
            # raised where warnings are errors; elsewhere max_pixels refuses the image).
            raise _Refused(f"is refused as a decompression bomb ({_first_line(exc)})") from None
        except Image.UnidentifiedImageError:
            raise _Refused("is not a PNG or JPEG image") from None
        except _CORRUPT as exc:  # a header Pillow cannot read
            raise _Refused(f"is not a PNG or JPEG image ({_first_line(exc)})") from None
        width, height = image.size
        pixels = width * height
        if spec.width is not None and spec.height is not None and (width, height) != (
            spec.width, spec.height
        ):  # fmt: skip
            if spec.resize is None:
                raise _Refused(
                    f"is {width}x{height}; the model takes {spec.width}x{spec.height} "
                    "(declare resize to have images resized)"
                )
            # A resized image costs the larger of what is decoded and what is kept.
            pixels = max(pixels, spec.height * spec.width)
        if pixels > self.pixels_left:
            raise _Refused(
                f"is {width}x{height}: more pixels than max_pixels ({spec.max_pixels}) leaves"
            )
        self.pixels_left -= pixels
        if image.mode not in _EIGHT_BIT_MODES:
            raise _Refused(f"has mode {image.mode}; only 8-bit images are taken")
        try:
            image.load()
            image = image.convert(PILLOW_MODE[spec.channel_order])
            if image.size != (spec.width, spec.height) and spec.resize is not None:
                image = image.resize((spec.width, spec.height), resample=spec.resize)
            array = np.asarray(image)
        except _CORRUPT as exc:  # truncated or corrupt data
            raise _Refused(f"cannot be decoded ({_first_line(exc)})") from None
        return _arranged(array, spec)


class _Refused(Exception):
    """Why one image is refused (the caller names the input and the image)."""


def _file_bytes(item: bytes) -> bytes:
    """The image file an element holds: itself, or decoded from its base64 text."""
    if item.startswith(_MAGIC):
        return item
    text = item
    if text.startswith(b"data:"):
        _, comma, text = text.partition(b",")
        if not comma:
            raise _Refused("is a data URI without a comma")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused("is neither a PNG or JPEG file nor base64 text of one") from None


def _arranged(array: np.ndarray, spec: ImageSpec) -> np.ndarray:
    """A decoded HxW or HxWxC uint8 array in the declared channel order, layout and dtype."""
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    if spec.channel_order == "BGR":
        array = array[:, :, ::-1]
    if spec.layout == "CHW":
        array = array.transpose(2, 0, 1)
    if spec.dtype == "float32":
        array = array.astype(np.float32)
        if spec.scale != 1.0:
            array *= np.float32(spec.scale)
    return array


def encode_images(name: str, value: Any, spec: ImageSpec) -> Tensor:
    """An array of images (shape ``S + image shape`` in the spec's layout and channel
    order, uint8) as a BYTES tensor of shape ``S`` holding one PNG each."""
    Image = pillow()
    array = np.asarray(value)
    if array.ndim < 3:
        raise ValueError(f"an image needs 3 dimensions ({spec.layout}), got shape {array.shape}")
    if array.dtype != np.uint8:
        raise ValueError(f"images are encoded from uint8 pixels, got {array.dtype}")
    if spec.layout == "CHW":
        array = np.moveaxis(array, -3, -1)
    channels = array.shape[-1]
    mode = _CHANNELS_TO_MODE.get(channels)
    if mode is None:
        raise ValueError(f"an image has 1, 3 or 4 channels, got {channels}")
    if spec.channel_order == "BGR":
        array = array[..., ::-1]
    batch = array.shape[:-3]
    files = []
    for image in array.reshape(-1, *array.shape[-3:]):
        pixels = np.ascontiguousarray(image[:, :, 0] if channels == 1 else image)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        files.append(buffer.getvalue())
    order = spec.channel_order if channels == 3 else mode
    parameters = ImageSpec(channel_order=order, layout=spec.layout).to_parameters()
    tensor = bytes_tensor(name, files, batch, CONTENT_TYPE)
    tensor.parameters = parameters
    return tensor


def declared_images(specs: list[TensorSpec], what: str) -> dict[str, ImageSpec]:
    """The image declarations among a model's ``specs`` (its inputs or outputs), by name;
    ModelLoadError for a bad one, or for any when Pillow is missing."""
    declared = {}
    for spec in specs:
        if spec.parameters.get("content_type") != CONTENT_TYPE:
            continue
        if spec.datatype != "BYTES":
            raise ModelLoadError(
                f"{what} '{spec.name}': content type 'image' needs datatype BYTES, "
                f"got {spec.datatype}"
            )
        try:
            declared[spec.name] = parse_spec(spec.parameters)
        except ValueError as exc:
            raise ModelLoadError(f"{what} '{spec.name}': {exc}") from None
    if declared:
        try:
            pillow()
        except ImportError as exc:
            raise ModelLoadError(f"{what} '{next(iter(declared))}': {exc}") from None
    return declared


def decode_declared(inputs: list[Tensor], declared: Mapping[str, ImageSpec]) -> None:
    """Replace each input the model declares as images (and that does not say otherwise
    itself) by its decoded array, labelled ``np`` so that nothing decodes it again."""
    for position, tensor in enumerate(inputs):
        spec = declared.get(tensor.name)
        if spec is None or tensor.content_type not in (None, CONTENT_TYPE):
            continue
        array = decode_images(tensor, spec)
        inputs[position] = Tensor(
            tensor.name, spec.datatype, array.shape, array, {"content_type": "np"}
        )


def encode_declared(
    result: Mapping[str, Any], declared: Mapping[str, ImageSpec]
) -> Mapping[str, Any]:
    """``result`` with each output the model declares as images encoded to PNG files."""
    if not any(name in declared for name in result):
        return result
    encoded = dict(result)
    for name, spec in declared.items():
        value = encoded.get(name)
        if value is None or isinstance(value, Tensor):
            continue
        try:
            encoded[name] = encode_images(name, value, spec)
        except ValueError as exc:
            raise ModelError(f"output '{name}': cannot encode as PNG images ({exc})") from None
    return encoded


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
