"""Tiny random-weight transformers models served by a live server, in-process
(``--workers 0``) and by two workers that each import torch and load after the fork: in
MLServer's layout (``mlserver_huggingface.HuggingFaceRuntime``, ``parameters.extra``) and
as plain folders (``"runtime": "huggingface"``, the task read from config.json). Answers
over REST and gRPC equal the transformers pipeline called in this process; text
generation streams; load errors are one sentence each."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import torch

from inferpool.protocol.generated import grpc_predict_v2_pb2 as pb
from inferpool.protocol.generated.grpc_predict_v2_pb2_grpc import GRPCInferenceServiceStub
from tests.huggingface.models import assert_close, save_bert, save_gpt2
from tests.support import Server
from tests.support.grpc import WORKER_COUNTS, workers_server

pytestmark = pytest.mark.huggingface

MLSERVER = "mlserver_huggingface.HuggingFaceRuntime"
GENERATE = {"max_new_tokens": 6, "do_sample": False}
TEXTS = {
    "classify": "the movie was good",
    "tokens": "john lives in paris",
    "embed": "the cat sat on the mat",
    "generate": "the dog ran",
}
QUESTION = ("where does john live ?", "john lives in paris and mary lives in london")


def write_settings(folder: Path, settings: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-settings.json").write_text(json.dumps(settings))


PAGE = Path(__file__).resolve().parents[2] / "docs" / "runtimes" / "huggingface.md"


def page_example() -> tuple[str, dict]:
    """docs/runtimes/huggingface.md's example: its Python, and its curl request's body."""
    text = PAGE.read_text()
    example = text[text.index("## Example") : text.index("## Settings")]
    (script,) = re.findall(r"```python\n(.*?)```", example, re.DOTALL)
    (shell,) = re.findall(r"```sh\n(.*?)```", example, re.DOTALL)
    body = re.search(r"-d '(.*?)'", shell, re.DOTALL)
    assert body is not None
    return script, json.loads(body.group(1))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The docs page's example writes models/sentiment: the other models go beside it.
    folder = tmp_path_factory.mktemp("hf")
    script, _ = page_example()
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True, env=os.environ)
    root = folder / "models"
    # MLServer's layout: the weights in a folder that pretrained_model names.
    save_bert(root / "classify" / "weights", "text-classification")
    write_settings(
        root / "classify",
        {
            "name": "classify",
            "implementation": MLSERVER,
            "parameters": {
                "extra": {"task": "text-classification", "pretrained_model": "./weights"}
            },
        },
    )
    save_bert(root / "qa" / "weights", "question-answering")
    write_settings(
        root / "qa",
        {
            "name": "qa",
            "implementation": MLSERVER,
            "parameters": {
                "extra": {"task": "question-answering", "pretrained_model": "./weights"}
            },
        },
    )
    save_gpt2(root / "generate" / "weights")
    write_settings(
        root / "generate",
        {
            "name": "generate",
            "implementation": MLSERVER,
            "parameters": {
                "uri": "./weights",
                "extra": {"task": "text-generation", "inference_kwargs": GENERATE},
            },
        },
    )
    # Plain folders: the saved files beside the settings, the task from config.json.
    for name, task in (("tokens", "token-classification"), ("embed", "feature-extraction")):
        save_bert(root / name, task)
        write_settings(root / name, {"name": name, "runtime": "huggingface"})
    return root


@pytest.fixture(scope="module")
def pipelines(repository: Path) -> dict[str, Any]:
    """The same models' pipelines, called in this process."""
    from transformers import pipeline

    return {
        "classify": pipeline("text-classification", model=str(repository / "classify/weights")),
        "tokens": pipeline("token-classification", model=str(repository / "tokens")),
        "embed": pipeline("feature-extraction", model=str(repository / "embed")),
        "generate": pipeline("text-generation", model=str(repository / "generate/weights")),
    }


def expected(pipelines: dict[str, Any], name: str, **kwargs: Any) -> list:
    """The pipeline's answer as MLServer's codec sends it: a list, JSON round-tripped."""
    extra = GENERATE if name == "generate" else {}
    answer = pipelines[name](TEXTS[name], **extra, **kwargs)
    items = answer if isinstance(answer, list) else [answer]
    return [json.loads(json.dumps(item, default=lambda value: value.item())) for item in items]


@pytest.fixture(scope="module", params=WORKER_COUNTS, ids=lambda w: f"w{w}")
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[Server]:
    with workers_server(repository, request.param, timeout=240) as running:
        yield running


def rest(server: Server, model: str, inputs: list[dict], path: str = "infer") -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{model}/{path}", json={"inputs": inputs}, timeout=60)


def text_input(name: str, *texts: str) -> dict:
    return {"name": name, "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}


def decoded(reply: httpx.Response) -> list:
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["name"] == "output" and output["datatype"] == "BYTES"
    assert output["parameters"]["content_type"] == "hg_jsonlist"
    assert output["shape"] == [len(output["data"]), 1]
    return [json.loads(item) for item in output["data"]]


@pytest.mark.parametrize("name", ["classify", "tokens", "embed", "generate"])
def test_rest_answers_equal_the_pipeline(server: Server, pipelines, name: str) -> None:
    got = decoded(rest(server, name, [text_input("args", TEXTS[name])]))
    assert_close(got, expected(pipelines, name))


def test_a_batch_is_array_inputs_and_answers_each_text(server: Server, pipelines) -> None:
    texts = ["the movie was good", "the plot was awful and the actor bad"]
    got = decoded(rest(server, "classify", [text_input("array_inputs", *texts)]))
    assert_close(got, pipelines["classify"](texts))


def test_grpc_answers_equal_the_pipeline(server: Server, pipelines) -> None:
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = GRPCInferenceServiceStub(channel)
        for name in ("classify", "embed"):
            request = pb.ModelInferRequest(model_name=name)
            tensor = request.inputs.add(name="args", datatype="BYTES", shape=[1])
            tensor.contents.bytes_contents.append(TEXTS[name].encode())
            response = stub.ModelInfer(request, timeout=60)
            (output,) = response.outputs
            assert output.name == "output" and list(output.shape) == [1, 1]
            got = [json.loads(item) for item in output.contents.bytes_contents]
            assert_close(got, expected(pipelines, name))


def best_span(repository: Path, question: str, context: str) -> dict:
    """The answer by brute force over every span of context tokens, from the model's own
    logits (transformers 5 has no question-answering pipeline to ask)."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    folder = repository / "qa" / "weights"
    model = AutoModelForQuestionAnswering.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(question, context, return_tensors="pt", return_offsets_mapping=True)
    offsets = encoded.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        out = model(**encoded)
    start, end = out.start_logits[0].softmax(-1), out.end_logits[0].softmax(-1)
    tokens = [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1]
    score, first, last = max(
        (float(start[i] * end[j]), i, j) for i in tokens for j in tokens if i <= j < i + 15
    )
    begin, finish = offsets[first][0], offsets[last][1]
    return {"score": score, "start": begin, "end": finish, "answer": context[begin:finish]}


def test_question_answering_answers_the_best_span(server: Server, repository: Path) -> None:
    question, context = QUESTION
    inputs = [text_input("question", question), text_input("context", context)]
    got = decoded(rest(server, "qa", inputs))
    assert_close(got, [best_span(repository, question, context)])
    assert got[0]["answer"] in context and got[0]["answer"]


def test_text_generation_streams_the_generated_text(server: Server, pipelines) -> None:
    want = pipelines["generate"](TEXTS["generate"], return_full_text=False, **GENERATE)
    body = {"args": TEXTS["generate"]}
    pieces = []
    with httpx.stream(
        "POST", f"{server.url}/v2/models/generate/generate_stream", json=body, timeout=60
    ) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                assert "error" not in event, event
                pieces.append(event["output"])
    assert len(pieces) > 1  # a chunk per piece, not one answer
    assert "".join(pieces) == want[0]["generated_text"]
    with grpc.insecure_channel(server.grpc_address) as channel:
        request = pb.ModelInferRequest(model_name="generate")
        tensor = request.inputs.add(name="args", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(TEXTS["generate"].encode())
        stream = GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request]), timeout=60)
        grpc_pieces = []
        for message in stream:
            assert not message.error_message, message.error_message
            output = message.infer_response.outputs
            if output:
                grpc_pieces.append(output[0].contents.bytes_contents[0].decode())
    assert grpc_pieces == pieces


def test_metadata_names_the_task_inputs_and_the_json_output(server: Server) -> None:
    for model, inputs in (("classify", ["args"]), ("qa", ["question", "context"])):
        meta = httpx.get(f"{server.url}/v2/models/{model}", timeout=10).json()
        assert meta["platform"] == "huggingface"
        assert [tensor["name"] for tensor in meta["inputs"]] == inputs
        assert all(tensor["datatype"] == "BYTES" for tensor in meta["inputs"])
        (output,) = meta["outputs"]
        assert (output["name"], output["datatype"], output["shape"]) == ("output", "BYTES", [-1, 1])


def test_the_docs_example_answers_as_the_page_says(server: Server, repository: Path) -> None:
    from transformers import pipeline

    _, body = page_example()
    reply = httpx.post(f"{server.url}/v2/models/sentiment/infer", json=body, timeout=60)
    (answer,) = decoded(reply)
    want = pipeline("text-classification", model=str(repository / "sentiment" / "weights"))
    assert_close([answer], want(body["inputs"][0]["data"][0]))
    assert answer["label"] in ("NEGATIVE", "POSITIVE")


def test_bad_input_is_a_400_and_the_model_keeps_serving(server: Server, pipelines) -> None:
    reply = rest(server, "qa", [text_input("question", "who ?")])  # no context
    assert reply.status_code == 400, reply.text
    assert "context" in reply.json()["error"]
    image = {**text_input("args", "x"), "parameters": {"content_type": "pillow_image"}}
    reply = rest(server, "classify", [image])
    assert reply.status_code == 400 and "pillow_image" in reply.json()["error"]
    got = decoded(rest(server, "classify", [text_input("args", TEXTS["classify"])]))
    assert_close(got, expected(pipelines, "classify"))


def test_each_worker_sets_torch_threads_to_its_share(server: Server) -> None:
    log = server.output()
    workers = server.workers  # type: ignore[attr-defined]
    if workers:
        # Each worker loads after the fork, torch sized to its share (the supervisor's rule);
        # the placement line covers the replicas.
        share = max(1, (os.cpu_count() or 1) // workers)
        unit = "thread" if share == 1 else "threads"
        replicas = rf"model 'classify': {workers} replica\(s\) on workers "
        pattern = replicas + rf".* on torch .*\((\d+) intra-op {unit}\)"
        assert re.findall(pattern, log) == [str(share)], log
    else:
        assert re.search(r"model 'classify'.*transformers .* on torch .*intra-op", log), log
