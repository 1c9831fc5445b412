"""The ``image`` content type in a real server, in-process and in 2 workers: PNG and JPEG
files sent over REST (base64 in JSON) and gRPC (``bytes_contents``, ``raw_input_contents``)
reach a custom runtime as the declared array (it answers the mean of each channel of each
image, so the test checks the decoded pixels exactly), an output declared as images comes
back as PNG files, and hostile files (not images, truncated, the wrong size, 16-bit,
decompression bombs) are a 400 naming the input while the workers live on, their memory
stays flat, and another client keeps being answered."""

from __future__ import annotations

import base64
import io
import re
import threading
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as triton
from PIL import Image

from inferpool.protocol.binary import bytes_elements_to_wire, tensor_from_bytes
from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from tests.support import Server, write_custom_model
from tests.support.grpc import models_server, stub_for
from tests.support.images import bomb_header, jpeg, pixels_of, png, sixteen_bit_png
from tests.support.pool import worker_pids

server = models_server  # the module's server fixture, over its models

RUNTIMES = """
import numpy as np

from inferpool import Runtime


class Means(Runtime):
    \"\"\"The mean of each channel of each image (``axes``: where the pixels are).\"\"\"

    def load(self):
        self.axes = tuple(self.settings.parameters.extra.get("axes", [1, 2]))

    def predict(self, payload, outputs):
        return {outputs[0]: np.asarray(payload, dtype=np.float64).mean(axis=self.axes)}


class Invert(Runtime):
    def load(self):
        pass

    def predict(self, payload, outputs):
        return {outputs[0]: 255 - payload}
"""
MEANS_OUTPUT = [{"name": "means", "datatype": "FP64", "shape": [-1, -1]}]
RNG = np.random.default_rng(1)
PIXELS = RNG.integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)  # two 5x4 RGB images
GRAY = RNG.integers(0, 256, (3, 6, 7), dtype=np.uint8)


def image_input(name: str, **declaration) -> dict:
    parameters = {"content_type": "image", **declaration}
    return {"name": name, "datatype": "BYTES", "shape": [-1], "parameters": parameters}


def write_model(root: Path, name: str, runtime: str, inputs: list, outputs: list, **extra):
    write_custom_model(
        root / name, RUNTIMES, runtime, inputs=inputs, outputs=outputs,
        parameters={"extra": extra},
    )  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("images")
    declared = {
        "means": image_input("img", height=4, width=5),
        "means-bgr-chw": image_input(
            "img", height=4, width=5, channel_order="BGR", layout="CHW", dtype="float32",
            scale=1 / 255,
        ),
        "means-resized": image_input("img", height=2, width=3, resize="bilinear"),
    }  # fmt: skip
    axes = {"means-bgr-chw": [2, 3]}
    for name, declaration in declared.items():
        write_model(root, name, "Means", [declaration], MEANS_OUTPUT, axes=axes.get(name, [1, 2]))
    write_model(root, "means-any", "Means", [], MEANS_OUTPUT)  # the request declares
    gray = image_input("gray", channel_order="L")
    inverted = {**image_input("inverted", channel_order="L"), "shape": [-1]}
    write_model(root, "invert", "Invert", [gray], [inverted])
    return root, declared


def rest(server: Server, model: str, files: list[bytes], name: str = "img", **parameters):
    tensor = {"name": name, "datatype": "BYTES", "shape": [len(files)],
              "data": [base64.b64encode(f).decode() for f in files]}  # fmt: skip
    if parameters:
        tensor["parameters"] = parameters
    body = {"inputs": [tensor]}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=30)


def rest_means(server: Server, model: str, files: list[bytes], **parameters) -> np.ndarray:
    reply = rest(server, model, files, **parameters)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    return np.array(output["data"]).reshape(output["shape"])


def grpc_request(model: str, files: list[bytes], raw: bool, name: str = "img"):
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype="BYTES", shape=[len(files)])
    if raw:
        data = np.empty(len(files), dtype=object)
        data[:] = files
        request.raw_input_contents.append(bytes_elements_to_wire(data))
    else:
        tensor.contents.bytes_contents.extend(files)
    return request


def grpc_means(server: Server, request: pb.ModelInferRequest) -> np.ndarray:
    """The one FP64 output of a gRPC request, in its shape."""
    with stub_for(server) as stub:
        response = stub.ModelInfer(request, timeout=30)
    (output,) = response.outputs
    if response.raw_output_contents:
        values = np.frombuffer(response.raw_output_contents[0], "<f8")
    else:
        values = np.array(output.contents.fp64_contents)
    return values.reshape(output.shape)


def channel_means(images: np.ndarray) -> np.ndarray:
    return images.astype(np.float64).mean(axis=(1, 2))


def test_the_declaration_shows_in_the_model_metadata(server, models) -> None:
    _, declared = models
    for name, declaration in declared.items():
        metadata = httpx.get(f"{server.url}/v2/models/{name}", timeout=10).json()
        assert metadata["inputs"] == [declaration]
    with stub_for(server) as stub:
        response = stub.ModelMetadata(pb.ModelMetadataRequest(name="means-bgr-chw"), timeout=10)
    (tensor,) = response.inputs
    assert tensor.parameters["content_type"].string_param == "image"
    assert tensor.parameters["height"].int64_param == 4
    assert tensor.parameters["layout"].string_param == "CHW"
    assert tensor.parameters["scale"].double_param == 1 / 255


def triton_means(server: Server, model: str, files: list[bytes]) -> np.ndarray:
    """Over REST with Triton's binary extension (each file's bytes as they are)."""
    client = triton.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    tensor = triton.InferInput("img", [len(files)], "BYTES")
    tensor.set_data_from_numpy(np.array(files, dtype=object), binary_data=True)
    result = client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("means")])
    return result.as_numpy("means")


@pytest.mark.parametrize("transport", ["rest", "rest-binary", "grpc", "grpc-raw"])
def test_png_images_arrive_as_the_declared_array(server, transport) -> None:
    files = [png(image) for image in PIXELS]

    def means(model: str) -> np.ndarray:
        if transport == "rest":
            return rest_means(server, model, files)
        if transport == "rest-binary":
            return triton_means(server, model, files)
        return grpc_means(server, grpc_request(model, files, raw=transport == "grpc-raw"))

    np.testing.assert_array_equal(means("means"), channel_means(PIXELS))
    # BGR, CHW, float32 scaled to [0, 1]: the channels come reversed and scaled.
    expected = channel_means(PIXELS)[:, ::-1] / 255
    np.testing.assert_allclose(means("means-bgr-chw"), expected, rtol=1e-5)
    resized = np.stack(
        [np.asarray(Image.fromarray(i).resize((3, 2), Image.Resampling.BILINEAR)) for i in PIXELS]
    )
    np.testing.assert_array_equal(means("means-resized"), channel_means(resized))


def test_jpeg_and_a_request_declared_input(server) -> None:
    files = [jpeg(image) for image in PIXELS]
    decoded = np.stack([pixels_of(file) for file in files])
    np.testing.assert_array_equal(rest_means(server, "means", files), channel_means(decoded))
    # A model that declares nothing: the request's input says image, and how.
    gray = rest_means(server, "means-any", [png(GRAY[0])], content_type="image", channel_order="L")
    np.testing.assert_array_equal(gray, [[GRAY[0].mean()]])
    request = grpc_request("means-any", [jpeg(PIXELS[0])], raw=False)
    request.inputs[0].parameters["content_type"].string_param = "image"
    request.inputs[0].parameters["layout"].string_param = "CHW"
    # CHW: the means over channels and rows, one per column.
    means = grpc_means(server, request)
    np.testing.assert_array_equal(means, [decoded[0].astype(np.float64).mean(axis=(0, 2))])


def test_an_output_declared_as_images_comes_back_as_png_files(server) -> None:
    files = [png(image) for image in GRAY]
    reply = rest(server, "invert", files, name="gray")
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["datatype"] == "BYTES" and output["shape"] == [3]
    assert output["parameters"]["content_type"] == "image"
    returned = np.stack([pixels_of(base64.b64decode(item)) for item in output["data"]])
    np.testing.assert_array_equal(returned, 255 - GRAY)
    with stub_for(server) as stub:
        response = stub.ModelInfer(grpc_request("invert", files, False, "gray"), timeout=30)
    (output,) = response.outputs
    items = list(output.contents.bytes_contents)
    if response.raw_output_contents:
        raw = response.raw_output_contents[0]
        items = tensor_from_bytes(raw, "BYTES", tuple(output.shape), "inverted").tolist()
    np.testing.assert_array_equal(np.stack([pixels_of(i) for i in items]), 255 - GRAY)


HOSTILE = {
    "not-an-image": (b"%PDF-1.4 not an image", "is not a PNG or JPEG image$"),
    "truncated": (png(PIXELS[0])[:-30], "(cannot be decoded|is not a PNG or JPEG)"),
    "wrong-size": (png(PIXELS[0, :3]), "is 5x3; the model takes 5x4"),
    "16-bit": (sixteen_bit_png(), "has mode I;16"),
    "bomb-header": (bomb_header(100_000, 100_000), "is refused as a decompression bomb"),
    "bomb-5000px": (bomb_header(5000, 5000), "is 5000x5000; the model takes 5x4"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_a_400_naming_the_input(server, case) -> None:
    element, message = HOSTILE[case]
    files = [png(PIXELS[0]), element]
    reply = rest(server, "means", files)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"].startswith("input 'img': image 1 ")
    assert re.search(message, reply.json()["error"]), reply.json()
    with stub_for(server) as stub, pytest.raises(grpc.RpcError) as failure:
        stub.ModelInfer(grpc_request("means", files, raw=True), timeout=30)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'img': image 1 " in failure.value.details()


def tree_rss(server: Server) -> int:
    process = psutil.Process(server.process.pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])


def test_bombs_leave_the_workers_alive_their_memory_flat_and_others_answered(server) -> None:
    real_bomb = io.BytesIO()
    Image.new("RGB", (6000, 6000)).save(real_bomb, format="PNG")  # 108 MB of pixels in ~100 KB
    bombs = [real_bomb.getvalue(), bomb_header(60_000, 60_000)]
    good = [png(image) for image in PIXELS]
    pids = worker_pids(server)
    rest_means(server, "means-any", good, content_type="image")  # warm
    before = tree_rss(server)
    answered: list[int] = []
    stop = threading.Event()

    def other_client() -> None:
        while not stop.is_set():
            answered.append(rest(server, "means", good).status_code)

    thread = threading.Thread(target=other_client)
    thread.start()
    try:
        for _ in range(10):
            # means-any has no size to hold images to: only max_pixels bounds them.
            reply = rest(server, "means-any", bombs, content_type="image")
            assert reply.status_code == 400, reply.text
            assert "input 'img': image 0 is 6000x6000: more pixels than max_pixels" in reply.text
    finally:
        stop.set()
        thread.join(30)
    assert answered and set(answered) == {200}
    assert tree_rss(server) - before < 64 * 1024 * 1024
    assert worker_pids(server) == pids
    assert "Traceback" not in server.output()
