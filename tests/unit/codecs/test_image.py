"""The ``image`` codec (inferpool/codecs/image.py): PNG and JPEG files made here with Pillow
decode to exactly the pixels Pillow reads, in each channel order, layout and dtype; bad
declarations and hostile files are refused with a message naming the input, before any
pixel of an oversized image is decoded."""

from __future__ import annotations

import base64
import io
import sys

import numpy as np
import pytest
from PIL import Image

from inferpool.codecs.image import declared_images, decode_images, encode_images
from inferpool.codecs.image_spec import ImageSpec, parse_spec
from inferpool.codecs.payload import decode_payload
from inferpool.codecs.registry import decode_input, decode_output
from inferpool.errors import BadRequest, ModelError, ModelLoadError
from inferpool.protocol.types import InferenceRequest, Tensor, TensorSpec
from tests.support.images import bomb_header, jpeg, png, sixteen_bit_png

RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (4, 5, 3), dtype=np.uint8)  # H=4, W=5, RGB


def images(*files: bytes, shape: tuple[int, ...] | None = None, **parameters) -> Tensor:
    data = np.empty(len(files), dtype=object)
    data[:] = list(files)
    shape = (len(files),) if shape is None else shape
    return Tensor("img", "BYTES", shape, data.reshape(shape), parameters)


def decode(tensor: Tensor, **declaration) -> np.ndarray:
    return decode_images(tensor, parse_spec(declaration))


def test_png_decodes_to_its_exact_pixels_in_each_channel_order_and_layout() -> None:
    tensor = images(png(PIXELS), png(PIXELS[::-1]))
    rgb = decode(tensor)
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 4, 5, 3)
    np.testing.assert_array_equal(rgb[0], PIXELS)
    np.testing.assert_array_equal(rgb[1], PIXELS[::-1])
    bgr_chw = decode(tensor, channel_order="BGR", layout="CHW")
    assert bgr_chw.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(bgr_chw[0], PIXELS[:, :, ::-1].transpose(2, 0, 1))
    gray = decode(tensor, channel_order="L")
    expected_gray = np.asarray(Image.fromarray(PIXELS).convert("L"))
    assert gray.shape == (2, 4, 5, 1)
    np.testing.assert_array_equal(gray[0, :, :, 0], expected_gray)
    rgba = decode(tensor, channel_order="RGBA", layout="CHW")
    assert rgba.shape == (2, 4, 4, 5)
    np.testing.assert_array_equal(rgba[0, 3], np.full((4, 5), 255))


def test_float32_scales_each_pixel() -> None:
    out = decode(images(png(PIXELS)), dtype="float32", scale=1 / 255)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0], PIXELS / 255, rtol=1e-6)


def test_jpeg_decodes_as_pillow_reads_it() -> None:
    file = jpeg(PIXELS)
    expected = np.asarray(Image.open(io.BytesIO(file)).convert("RGB"))
    np.testing.assert_array_equal(decode(images(file))[0], expected)


def test_raw_base64_and_data_uri_elements_are_the_same_image() -> None:
    file = png(PIXELS)
    text = base64.b64encode(file)
    out = decode(images(file, text, b"data:image/png;base64," + text))
    for index in range(3):
        np.testing.assert_array_equal(out[index], PIXELS)


def test_the_tensor_shape_leads_the_image_shape() -> None:
    file = png(PIXELS)
    assert decode(images(file, shape=())).shape == (4, 5, 3)
    assert decode(images(file, file, file, file, shape=(2, 2))).shape == (2, 2, 4, 5, 3)
    empty = decode(images(), height=4, width=5, layout="CHW")
    assert empty.shape == (0, 3, 4, 5)


def test_resize_only_when_declared_with_the_declared_filter() -> None:
    file = png(PIXELS)
    with pytest.raises(BadRequest, match=r"input 'img': image 0 is 5x4; the model takes 3x2"):
        decode(images(file), height=2, width=3)
    out = decode(images(file), height=2, width=3, resize="bilinear")
    expected = np.asarray(Image.fromarray(PIXELS).resize((3, 2), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(out[0], expected)
    # An image already of the declared size is not resampled.
    np.testing.assert_array_equal(decode(images(file), height=4, width=5, resize="box")[0], PIXELS)


def test_images_of_one_input_must_share_a_size_unless_resized() -> None:
    other = png(RNG.integers(0, 256, (6, 5, 3), dtype=np.uint8))
    with pytest.raises(BadRequest, match=r"image 1 is 5x6, image 0 is 5x4"):
        decode(images(png(PIXELS), other))
    assert decode(images(png(PIXELS), other), height=4, width=5, resize="nearest").shape == (
        2, 4, 5, 3,
    )  # fmt: skip


def test_palette_and_alpha_images_convert_to_the_declared_channels() -> None:
    palette = Image.fromarray(PIXELS).convert("P")
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG")
    out = decode(images(buffer.getvalue()))
    np.testing.assert_array_equal(out[0], np.asarray(palette.convert("RGB")))
    rgba = np.dstack([PIXELS, np.full((4, 5), 7, np.uint8)])
    np.testing.assert_array_equal(decode(images(png(rgba)), channel_order="RGBA")[0], rgba)
    np.testing.assert_array_equal(decode(images(png(rgba)))[0], PIXELS)  # alpha dropped


@pytest.mark.parametrize(
    ("element", "message"),
    [
        (b"not an image", r"image 0 is neither a PNG or JPEG file nor base64 text of one"),
        (base64.b64encode(b"GIF89a" + bytes(40)), r"image 0 is not a PNG or JPEG image"),
        (png(PIXELS)[:-30], r"image 0 (cannot be decoded|is not a PNG or JPEG)"),
        (jpeg(PIXELS)[:60], r"image 0 (cannot be decoded|is not a PNG or JPEG)"),
        (bomb_header(100_000, 100_000), r"image 0 is refused as a decompression bomb"),
        # Pillow warns here; the tests make warnings errors, and that is a 400 too.
        (bomb_header(10_000, 10_000), r"image 0 is refused as a decompression bomb"),
        (bomb_header(5000, 5000), r"image 0 is 5000x5000: more pixels than max_pixels"),
    ],
    ids=["text", "gif", "truncated-png", "truncated-jpeg", "bomb", "bomb-warned", "bomb-ours"],
)
def test_bad_files_are_a_400_naming_the_input(element: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=rf"^input 'img': {message}"):
        decode(images(element))


def test_a_real_decompression_bomb_is_refused_before_its_pixels_are_decoded() -> None:
    buffer = io.BytesIO()
    Image.new("L", (6000, 6000)).save(buffer, format="PNG")  # 36 Mpx in ~40 KB
    assert len(buffer.getvalue()) < 100_000
    with pytest.raises(BadRequest, match="6000x6000: more pixels than max_pixels"):
        decode(images(buffer.getvalue()))


def test_max_pixels_counts_every_image_of_the_input() -> None:
    file = png(PIXELS)  # 20 pixels each
    assert decode(images(file, file), max_pixels=40).shape == (2, 4, 5, 3)
    with pytest.raises(BadRequest, match=r"image 2 is 5x4: more pixels than max_pixels \(40\)"):
        decode(images(file, file, file), max_pixels=40)
    with pytest.raises(BadRequest, match=r"3 images of 5x4 are 60 pixels, more than max_pixels"):
        decode(images(file, file, file), height=4, width=5, max_pixels=40)


def test_sixteen_bit_images_are_refused() -> None:
    # Pillow 10.0 opens a 16-bit PNG as mode I, later versions as I;16.
    with pytest.raises(BadRequest, match=r"image 0 has mode I(;16\w*)?; only 8-bit images"):
        decode(images(sixteen_bit_png()))


def test_non_bytes_data_is_refused() -> None:
    tensor = Tensor("img", "UINT8", (1, 4), np.zeros((1, 4), np.uint8), {})
    with pytest.raises(BadRequest, match="content type 'image' needs BYTES data, got UINT8"):
        decode(tensor)


@pytest.mark.parametrize(
    ("declaration", "message"),
    [
        ({"height": 4}, "declare both height and width"),
        ({"height": 0, "width": 4}, "height must be a positive integer"),
        ({"channel_order": "CMYK"}, "channel_order must be one of RGB, BGR, RGBA, L"),
        ({"layout": "NHWC"}, "layout must be one of HWC, CHW"),
        ({"dtype": "float64"}, "dtype must be one of uint8, float32"),
        ({"scale": 0.5}, "scale needs dtype float32"),
        ({"resize": "bilinear"}, "resize needs height and width"),
        ({"resize": "cubic", "height": 2, "width": 2}, "resize must be one of none, nearest"),
        ({"hieght": 4}, "unknown image parameter.s. hieght"),
    ],
)
def test_bad_declarations_say_what_is_wrong(declaration: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(declaration)
    if "hieght" in declaration:
        return  # a request's input may carry parameters of its own (next test)
    # Declared in a request's own input: a 400 naming the input.
    tensor = images(png(PIXELS), content_type="image", **declaration)
    with pytest.raises(BadRequest, match=f"input 'img': {message}"):
        decode_input(tensor)


def test_a_request_declared_input_decodes_through_the_registry() -> None:
    tensor = images(png(PIXELS), content_type="image", channel_order="BGR")
    np.testing.assert_array_equal(decode_input(tensor)[0], PIXELS[:, :, ::-1])
    # The binary extension's own parameter (and a client's) do not disturb it.
    tensor = images(png(PIXELS), content_type="image", binary_data_size=99, trace="x")
    np.testing.assert_array_equal(decode_input(tensor)[0], PIXELS)


def test_encoded_images_decode_back_to_the_same_pixels() -> None:
    spec = ImageSpec(channel_order="BGR", layout="CHW")
    batch = np.stack([PIXELS, PIXELS[::-1]])[:, :, :, ::-1].transpose(0, 3, 1, 2)
    tensor = encode_images("out", batch, spec)
    assert tensor.datatype == "BYTES" and tensor.shape == (2,)
    assert tensor.parameters == {"content_type": "image", "channel_order": "BGR", "layout": "CHW"}
    assert all(item.startswith(b"\x89PNG") for item in tensor.data.tolist())
    np.testing.assert_array_equal(decode_output(tensor), batch)
    gray = encode_images("g", PIXELS[None, :, :, :1], ImageSpec(channel_order="L"))
    np.testing.assert_array_equal(decode_output(gray), PIXELS[None, :, :, :1])
    with pytest.raises(ValueError, match="uint8 pixels, got float64"):
        encode_images("out", PIXELS.astype(float), ImageSpec())


def test_model_declarations_are_checked_at_load() -> None:
    good = TensorSpec("img", "BYTES", [-1], {"content_type": "image", "height": 2, "width": 3})
    plain = TensorSpec("x", "FP32", [-1, 4])
    assert declared_images([good, plain], "input") == {"img": ImageSpec(height=2, width=3)}
    with pytest.raises(ModelLoadError, match="input 'img': content type 'image' needs datatype"):
        declared_images([TensorSpec("img", "UINT8", [-1], {"content_type": "image"})], "input")
    with pytest.raises(ModelLoadError, match="output 'img': declare both height and width"):
        declared_images([TensorSpec("img", "BYTES", [-1], {**good.parameters, "width": None})],
                        "output")  # fmt: skip


def test_without_pillow_loading_and_decoding_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # `from PIL import Image` raises ImportError
    declaration = TensorSpec("img", "BYTES", [-1], {"content_type": "image"})
    with pytest.raises(ModelLoadError, match=r"input 'img': .*pip install inferpool\[image\]"):
        declared_images([declaration], "input")
    with pytest.raises(ModelError, match=r"pip install inferpool\[image\]"):
        decode(images(b"x"))


def test_images_cannot_be_a_dataframe_column() -> None:
    request = InferenceRequest([images(png(PIXELS), content_type="image")])
    with pytest.raises(BadRequest, match=r"pd input 'img' decodes to shape \[1, 4, 5, 3\]"):
        decode_payload(request, "dataframe", {})


def test_mutated_files_decode_or_are_a_400_never_anything_else() -> None:
    """Bytes flipped, cut and dropped in PNG and JPEG files of several modes (seeded):
    Pillow raises many kinds of exception for them; each must become a 400."""
    rng = np.random.default_rng(7)
    seeds = [png(PIXELS), png(PIXELS[:, :, 0]), jpeg(PIXELS), jpeg(PIXELS[:, :, 0])]
    spec = parse_spec({"height": 3, "width": 3, "resize": "bilinear", "layout": "CHW"})
    outcomes = {"decoded": 0, "refused": 0}
    for _ in range(400):
        data = bytearray(seeds[rng.integers(len(seeds))])
        for _ in range(rng.integers(1, 5)):
            at = int(rng.integers(len(data)))
            if rng.random() < 0.6:
                data[at] = int(rng.integers(256))
            else:
                del data[at : at + int(rng.integers(1, 40))]
        try:
            decode_images(images(bytes(data) or b"\x89PNG"), spec)
            outcomes["decoded"] += 1
        except BadRequest as exc:
            assert exc.message.startswith("input 'img': image 0 ")
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and outcomes["decoded"] > 0
