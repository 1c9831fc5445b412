"""Batching by default: which models batch (``batching.policy``), no added wait, and
``max_batch_size`` counting rows (``path.run_executions`` joins up to it)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from sklearn.linear_model import LogisticRegression

from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.worker.batching import AUTO_BATCH_ROWS, Batcher, BatchPolicy, policy
from inferpool.engine.worker.model import LoadedModel, load_model
from inferpool.engine.worker.path import Job, run_executions, run_group
from inferpool.runtimes.sklearn import SKLearnRuntime
from inferpool.settings import ModelSettings
from tests.support import iris_data, write_sklearn_model
from tests.support.runtimes import RowSums, loaded_sums_model


class IndependentRowSums(RowSums):
    """The same runtime, opting in to batching by default."""

    rows_independent = True
    input_errors = (ValueError,)


def model(runtime=IndependentRowSums, max_batch_size=0, max_batch_time=0.0) -> LoadedModel:
    return loaded_sums_model(runtime, max_batch_size, max_batch_time)


def job(request_id: int, rows: int, first: float = 1.0) -> Job:
    array = np.full((rows, 2), first)
    tensor = {"name": "x", "shape": [rows, 2], "datatype": "FP64"}
    document = {"id": f"r{request_id}", "inputs": [{**tensor, "data": array.ravel().tolist()}]}
    body = orjson.dumps(document)
    header = RequestHeader(request_id, 1, Kind.REST, None, 0, time.monotonic_ns(), len(body))
    return Job(header, body)


def sums(reply) -> list[float]:
    assert reply.status == 200, reply.body
    return orjson.loads(reply.body)["outputs"][0]["data"]


def test_the_builtin_runtimes_batch_by_default_and_max_batch_size_1_turns_it_off() -> None:
    settings = ModelSettings(name="iris")
    sklearn = SKLearnRuntime(settings)
    assert policy(settings, sklearn) == BatchPolicy(AUTO_BATCH_ROWS, 0)
    assert policy(ModelSettings(name="iris", max_batch_size=1), sklearn) == BatchPolicy(1)
    # A user's wait without a size is ignored, as MLServer ignores it.
    assert policy(ModelSettings(name="iris", max_batch_time=0.5), sklearn).wait_ns == 0
    timed = ModelSettings(name="iris", max_batch_size=32, max_batch_time=0.01)
    assert policy(timed, sklearn) == BatchPolicy(32, 10_000_000)


def test_a_custom_runtime_batches_only_when_it_opts_in_or_its_settings_ask() -> None:
    assert not model(RowSums).batching.joins
    assert model(IndependentRowSums).batching == BatchPolicy(AUTO_BATCH_ROWS)
    assert model(RowSums, max_batch_size=8).batching == BatchPolicy(8)
    assert not model(IndependentRowSums, max_batch_size=1).batching.joins


def test_a_negative_wait_is_refused_and_a_negative_size_means_off_as_in_mlserver() -> None:
    with pytest.raises(ValueError, match="max_batch_time"):
        ModelSettings(name="m", max_batch_time=-1)
    assert not model(IndependentRowSums, max_batch_size=-1).batching.joins


def test_a_custom_runtime_without_the_opt_in_predicts_each_request_alone() -> None:
    plain = model(RowSums)
    replies = run_group(plain, [job(i, 1 + i % 2) for i in range(5)])
    assert [sums(reply) for reply in replies] == [[2.0], [2.0, 2.0], [2.0], [2.0, 2.0], [2.0]]
    assert plain.runtime.calls == [1, 2, 1, 2, 1]


def test_without_a_wait_everything_queued_is_due_at_once() -> None:
    auto = model()
    batcher = Batcher()
    for i in range(5):
        batcher.add(auto, job(i, 1))
    # Nothing waits: the queue is due now, in one group, and nothing is left to time.
    [(_, jobs)] = batcher.due(time.monotonic_ns())
    assert [j.request_id for j in jobs] == [0, 1, 2, 3, 4]
    assert len(batcher) == 0 and batcher.timeout(time.monotonic_ns()) is None
    replies = run_group(auto, jobs)
    assert [sums(reply) for reply in replies] == [[2.0]] * 5
    assert auto.runtime.calls == [5]


def test_a_request_alone_runs_alone_at_once() -> None:
    auto = model()
    batcher = Batcher()
    batcher.add(auto, job(0, 3))
    [(_, jobs)] = batcher.due(time.monotonic_ns())
    assert [sums(reply) for reply in run_group(auto, jobs)] == [[2.0, 2.0, 2.0]]
    assert auto.runtime.calls == [3]


def test_max_batch_size_counts_rows_and_a_bigger_request_runs_alone() -> None:
    capped = model(max_batch_size=4)
    rows = [1, 2, 1, 3, 5, 1]
    replies = run_group(capped, [job(i, n) for i, n in enumerate(rows)])
    assert [len(sums(reply)) for reply in replies] == rows
    # 1+2+1 fill a predict; the 5 would take the 3 past 4, so the 3 runs, then the 5
    # alone (more rows than the cap); the last 1 is what is left.
    assert capped.runtime.calls == [4, 3, 5, 1]
    assert max(call for call in capped.runtime.calls if call != 5) <= 4


def test_each_execution_is_answered_before_the_next_one_runs() -> None:
    capped = model(max_batch_size=2)
    executions = run_executions(capped, [job(i, 2) for i in range(3)])
    positions, replies = next(executions)
    assert positions == [0] and sums(replies[0]) == [2.0, 2.0]
    assert capped.runtime.calls == [2]  # the later requests have not run yet
    assert [positions for positions, _ in executions] == [[1], [2]]


def test_one_execution_is_counted_once_with_its_rows() -> None:
    auto = model()
    replies = run_group(auto, [job(i, n) for i, n in enumerate([1, 2, 3])])
    assert [reply.rows for reply in replies] == [1, 2, 3]
    assert sorted(reply.execution for reply in replies) == [-6, -6, 6]
    assert len({reply.execution_id for reply in replies}) == 1


def test_a_bad_request_gets_its_own_error_and_the_others_their_answers() -> None:
    auto = model()
    replies = run_group(auto, [job(0, 1), job(1, 2, first=-1.0), job(2, 2)])
    assert [reply.status for reply in replies] == [200, 400, 200]
    assert replies[1].body == b"model 'sums' rejected input 'x': Input contains negative values."
    assert sums(replies[0]) == [2.0] and sums(replies[2]) == [2.0, 2.0]
    # The joined predict failed: each request ran alone, each its own execution.
    assert auto.runtime.calls == [5, 1, 2, 2]
    assert [reply.execution for reply in replies] == [1, 0, 2]


def test_sklearn_answers_joined_the_same_as_alone(tmp_path: Path) -> None:
    X, y = iris_data()
    write_sklearn_model(tmp_path, LogisticRegression(max_iter=1000).fit(X, y))
    iris = load_model(ModelSettings(name="iris", folder=tmp_path))
    assert iris.batching == BatchPolicy(AUTO_BATCH_ROWS)

    def request(i: int, rows: np.ndarray) -> Job:
        document = {"id": f"r{i}", "inputs": [{"name": "input-0", "shape": list(rows.shape),
                                "datatype": "FP64", "data": rows.ravel().tolist()}]}  # fmt: skip
        if i % 2:  # these ask for another output: they join each other, not the rest
            document["outputs"] = [{"name": "predict_proba"}]
        body = orjson.dumps(document)
        header = RequestHeader(i, 1, Kind.REST, None, 0, time.monotonic_ns(), len(body))
        return Job(header, body)

    batches = [X[i : i + 1 + i % 3] for i in range(0, 60, 4)]
    joined = run_group(iris, [request(i, rows) for i, rows in enumerate(batches)])
    alone = [run_group(iris, [request(i, rows)])[0] for i, rows in enumerate(batches)]
    assert sum(reply.execution > 0 for reply in joined) == 2  # one per set of outputs
    for one, other in zip(joined, alone, strict=True):
        assert one.status == other.status == 200
        first, second = orjson.loads(one.body), orjson.loads(other.body)
        first_data = [output.pop("data") for output in first["outputs"]]
        second_data = [output.pop("data") for output in second["outputs"]]
        assert first == second  # ids, names, shapes, datatypes, parameters
        if first["outputs"][0]["name"] == "predict":
            assert first_data == second_data  # the labels: exactly
        else:
            # OpenBLAS multiplies one row and many rows with different kernels: the
            # probabilities may differ in their last bit, never more.
            np.testing.assert_allclose(first_data, second_data, rtol=1e-12, atol=0)
