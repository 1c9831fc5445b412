"""The declaration of an ``image`` tensor: what its PNG/JPEG elements decode to.

A model declares it in the parameters of an input (or output) in model-settings.json,
beside ``"content_type": "image"``; a request without such a model may put the same keys in
its own input's parameters. Parsed once (at load for a model's declaration) into an
``ImageSpec``; a bad declaration raises ``ValueError`` with the reason, which the caller
turns into a load error or a 400.

Keys (all optional): ``height`` and ``width`` (both or neither; the size the model takes,
else each image's own size), ``channel_order`` (``RGB``, ``BGR``, ``RGBA``, ``L``),
``layout`` (``HWC``, ``CHW``), ``dtype`` (``uint8``, ``float32``), ``scale`` (float32 only:
each pixel value is multiplied by it, e.g. 1/255), ``resize`` (``none``, or the Pillow
filter that resizes an image of another size: ``nearest``, ``box``, ``bilinear``,
``hamming``, ``bicubic``, ``lanczos``), ``max_pixels`` (the pixels one input of one request
may decode to, summed over its images).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

CONTENT_TYPE = "image"
# 16 Mi pixels: 48 MiB as RGB uint8, 192 MiB as RGB float32.
DEFAULT_MAX_PIXELS = 1 << 24
# Channels of each channel order; the Pillow mode an image is converted to for it.
CHANNELS = {"RGB": 3, "BGR": 3, "RGBA": 4, "L": 1}
PILLOW_MODE = {"RGB": "RGB", "BGR": "RGB", "RGBA": "RGBA", "L": "L"}
LAYOUTS = ("HWC", "CHW")
DTYPES = {"uint8": "UINT8", "float32": "FP32"}
# Pillow's Image.Resampling values, by name (kept here so parsing needs no Pillow).
RESAMPLING = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
KEYS = frozenset(
    {"content_type", "height", "width", "channel_order", "layout", "dtype", "scale", "resize",
     "max_pixels"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ImageSpec:
    height: int | None = None
    width: int | None = None
    channel_order: str = "RGB"
    layout: str = "HWC"
    dtype: str = "uint8"
    scale: float = 1.0
    resize: int | None = None  # a Pillow resampling filter; None: never resize
    max_pixels: int = DEFAULT_MAX_PIXELS

    @property
    def channels(self) -> int:
        return CHANNELS[self.channel_order]

    @property
    def datatype(self) -> str:
        """The V2 datatype of the decoded array."""
        return DTYPES[self.dtype]

    def image_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """One decoded image's shape, in the declared layout."""
        if self.layout == "CHW":
            return (self.channels, height, width)
        return (height, width, self.channels)

    def to_parameters(self) -> dict[str, Any]:
        """The tensor parameters that declare this spec (what an encoded output carries)."""
        out: dict[str, Any] = {
            "content_type": CONTENT_TYPE,
            "channel_order": self.channel_order,
            "layout": self.layout,
        }
        if self.height is not None:
            out.update(height=self.height, width=self.width)
        return out


def parse_spec(parameters: Mapping[str, Any], strict: bool = True) -> ImageSpec:
    """The spec the ``parameters`` of a tensor declare; ValueError says what is wrong.

    ``strict``: any other key is an error (a model's declaration, where a misspelt key
    would otherwise do nothing); a request's input may carry other parameters (the binary
    extension's ``binary_data_size``, a client's own)."""
    unknown = sorted(set(parameters) - KEYS)
    if strict and unknown:
        raise ValueError(f"unknown image parameter(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(KEYS - {'content_type'}))}")  # fmt: skip
    height = _positive(parameters, "height")
    width = _positive(parameters, "width")
    if (height is None) != (width is None):
        raise ValueError("declare both height and width, or neither")
    dtype = _choice(parameters, "dtype", tuple(DTYPES), "uint8")
    scale = parameters.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if scale != 1.0 and dtype != "float32":
        raise ValueError("scale needs dtype float32")
    resize = _choice(parameters, "resize", ("none", *RESAMPLING), "none")
    if resize != "none" and height is None:
        raise ValueError("resize needs height and width (the size to resize to)")
    max_pixels = _positive(parameters, "max_pixels") or DEFAULT_MAX_PIXELS
    return ImageSpec(
        height=height,
        width=width,
        channel_order=_choice(parameters, "channel_order", tuple(CHANNELS), "RGB"),
        layout=_choice(parameters, "layout", LAYOUTS, "HWC"),
        dtype=dtype,
        scale=float(scale),
        resize=None if resize == "none" else RESAMPLING[resize],
        max_pixels=max_pixels,
    )


def _positive(parameters: Mapping[str, Any], key: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _choice(parameters: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = parameters.get(key, default)
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}; got {value!r}")
    return str(value)
