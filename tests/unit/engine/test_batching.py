"""Adaptive batching: when groups are due, concatenation, splitting and fallbacks."""

from __future__ import annotations

import time

import numpy as np
import orjson

from inferpool import Runtime
from inferpool.engine.ipc.messages import Kind, RequestHeader
from inferpool.engine.worker.batching import DEFAULT_RANK, Batcher
from inferpool.engine.worker.model import LoadedModel
from inferpool.engine.worker.path import Job, run_group
from tests.support.runtimes import loaded_sums_model


class RowSums(Runtime):
    """Sums each row; ``scalar`` makes it answer one number per call (not per row)."""

    scalar = False

    def load(self) -> None:
        self.calls: list[int] = []

    def predict(self, payload, outputs):
        self.calls.append(len(payload))
        value = float(payload.sum()) if self.scalar else payload.sum(axis=1)
        return {outputs[0]: value}


def make_model(max_batch_size: int = 8, max_batch_time: float = 0.05) -> LoadedModel:
    return loaded_sums_model(RowSums, max_batch_size, max_batch_time)


def job(request_id: int, rows, deadline_ns: int = 0, body: bytes | None = None) -> Job:
    if body is None:
        array = np.asarray(rows, dtype=float)
        document = {"id": f"r{request_id}", "inputs": [
            {"name": "x", "shape": list(array.shape), "datatype": "FP64",
             "data": array.ravel().tolist()}]}  # fmt: skip
        body = orjson.dumps(document)
    header = RequestHeader(
        request_id, 1, Kind.REST, None, deadline_ns, time.monotonic_ns(), len(body)
    )
    return Job(header, body)


def outputs(reply) -> list[float]:
    assert reply.status == 200, reply.body
    return orjson.loads(reply.body)["outputs"][0]["data"]


def test_group_due_when_full_or_when_the_oldest_waited_long_enough() -> None:
    model = make_model(max_batch_size=3, max_batch_time=10.0)
    batcher = Batcher()
    for i in range(4):
        batcher.add(model, job(i, [[i, i]]))
    now = time.monotonic_ns()
    groups = batcher.due(now)
    assert [[j.request_id for j in jobs] for _, jobs in groups] == [[0, 1, 2]]
    assert len(batcher) == 1 and 9 < batcher.timeout(now) <= 10
    assert batcher.due(now + int(11e9)) and len(batcher) == 0
    assert batcher.timeout(now) is None


def test_without_batching_one_job_is_due_at_a_time_in_order() -> None:
    # One per call: the worker reads its ring before the next, so a request of a higher
    # priority that arrived meanwhile runs before the rest (``Batcher.add``).
    model = make_model(max_batch_size=0)
    batcher = Batcher()
    for i in range(3):
        batcher.add(model, job(i, [[i, i]]))
    replies = []
    for _ in range(3):
        [(_, jobs)] = batcher.due(time.monotonic_ns())
        assert len(jobs) == 1
        replies += run_group(model, jobs)
    assert not batcher.due(time.monotonic_ns()) and len(batcher) == 0
    assert [outputs(r) for r in replies] == [[0.0], [2.0], [4.0]]
    assert model.runtime.calls == [1, 1, 1]


def test_the_queue_is_kept_in_priority_order_first_come_first_served_within_a_level() -> None:
    model = make_model(max_batch_size=0)
    batcher = Batcher()
    ranks = [DEFAULT_RANK, 5, DEFAULT_RANK, 1, 5, 1, DEFAULT_RANK]
    for i, rank in enumerate(ranks):
        queued = job(i, [[i, i]])
        queued.rank = rank
        batcher.add(model, queued)
    order = []
    while len(batcher):
        [(_, jobs)] = batcher.due(time.monotonic_ns())
        order += [queued.request_id for queued in jobs]
    assert order == [3, 5, 1, 4, 0, 2, 6]
    assert batcher.due(time.monotonic_ns(), flush=True) == []


def test_a_model_that_joins_gets_one_execution_of_rows_per_call() -> None:
    model = make_model(max_batch_size=2, max_batch_time=0)
    batcher = Batcher()
    for i in range(5):
        queued = job(i, [[i, i]])
        queued.rank = DEFAULT_RANK if i < 4 else 1  # the last one asks for priority
        batcher.add(model, queued)
    groups = []
    while len(batcher):
        [(_, jobs)] = batcher.due(time.monotonic_ns())
        groups.append([queued.request_id for queued in jobs])
    assert groups == [[4, 0], [1, 2], [3]]


def test_batch_predicts_once_and_each_caller_gets_its_rows() -> None:
    model = make_model()
    jobs = [job(0, [[1, 2]]), job(1, [[3, 4], [5, 6]]), job(2, [[7, 8], [9, 10], [1, 1]])]
    replies = run_group(model, jobs)
    assert model.runtime.calls == [6]
    assert [outputs(r) for r in replies] == [[3.0], [7.0, 11.0], [15.0, 19.0, 2.0]]
    assert [orjson.loads(r.body)["id"] for r in replies] == ["r0", "r1", "r2"]
    assert all(r.times.compute_infer > 0 and r.times.queue >= 0 for r in replies)


def test_bad_and_expired_requests_do_not_spoil_the_batch() -> None:
    model = make_model()
    jobs = [
        job(0, [[1, 1]]),
        job(1, None, body=b"{not json"),
        job(2, [[2, 2]], deadline_ns=time.monotonic_ns() - 1),
        job(3, [[1, 2, 3]]),  # another width: predicted alone
        job(4, [[4, 4]]),
    ]
    replies = run_group(model, jobs)
    assert [r.status for r in replies] == [200, 400, 504, 200, 200]
    assert outputs(replies[0]) == [2.0] and outputs(replies[4]) == [8.0]
    assert outputs(replies[3]) == [6.0]
    assert sorted(model.runtime.calls) == [1, 2]


def test_results_that_are_not_per_row_fall_back_to_one_call_each() -> None:
    model = make_model()
    model.runtime.scalar = True
    replies = run_group(model, [job(0, [[1, 1]]), job(1, [[2, 2]])])
    assert [outputs(r) for r in replies] == [[2.0], [4.0]]
    assert model.runtime.calls == [2, 1, 1]


def test_cancel_takes_a_queued_job_out() -> None:
    model = make_model(max_batch_size=4, max_batch_time=10.0)
    batcher = Batcher()
    for i in range(2):
        batcher.add(model, job(i, [[i, i]]))
    assert batcher.cancel(0).request_id == 0
    assert batcher.cancel(0) is None
    assert batcher.cancel(1).request_id == 1
    assert len(batcher) == 0 and batcher.timeout(time.monotonic_ns()) is None


class PickyRowSums(RowSums):
    """Refuses negative values as a library's input check would (``input_errors``), and
    fails on a 13 as a model bug would."""

    input_errors = (ValueError,)

    def predict(self, payload, outputs):
        self.calls.append(len(payload))
        if (payload < 0).any():
            raise ValueError("Input contains negative values.")
        if (payload == 13).any():
            raise ZeroDivisionError("division by zero")
        return {outputs[0]: payload.sum(axis=1)}


def test_a_request_the_library_refuses_is_400_and_the_rest_of_its_batch_is_answered() -> None:
    model = make_model()
    model.runtime = PickyRowSums(model.settings)
    model.runtime.load()
    jobs = [job(0, [[1, 1]]), job(1, [[-1, 2]]), job(2, [[13, 0]]), job(3, [[3, 3], [4, 4]])]
    replies = run_group(model, jobs)
    assert [r.status for r in replies] == [200, 400, 500, 200]
    assert replies[1].body == b"model 'sums' rejected input 'x': Input contains negative values."
    assert replies[2].body == b"model 'sums' raised ZeroDivisionError: division by zero"
    assert outputs(replies[0]) == [2.0] and outputs(replies[3]) == [6.0, 8.0]
    # The whole batch once, then each request alone (one bad request must not fail others).
    assert model.runtime.calls == [5, 1, 1, 1, 2]


def test_duplicate_inputs_in_a_batch_are_400_for_that_request_only() -> None:
    model = make_model()
    tensor = {"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1, 1]}
    twice = orjson.dumps({"inputs": [tensor, tensor]})
    replies = run_group(model, [job(0, [[1, 1]]), job(1, None, body=twice), job(2, [[2, 2]])])
    assert [r.status for r in replies] == [200, 400, 200]
    assert replies[1].body == b"input 'x' appears twice"
    assert model.runtime.calls == [2]


def test_holding_hides_the_queue_of_a_model_waiting_in_a_call_and_gives_it_back() -> None:
    """While a model's predict waits in a call (``worker/calls.py``), the other models'
    requests run; its own stay queued, in order, for after."""
    waiting = make_model(max_batch_size=3, max_batch_time=0)
    other = make_model(max_batch_size=1, max_batch_time=0)
    batcher = Batcher()
    held = [job(0, [[1, 1]]), job(1, [[2, 2]])]  # model index 1
    for queued in held:
        batcher.add(waiting, queued)
    free = job(2, [[3, 3]])
    free.model_index = 2
    batcher.add(other, free)
    now = time.monotonic_ns()
    with batcher.holding([1]):
        assert batcher.timeout(now) == 0
        groups = batcher.due(now)
    assert [(model, jobs) for model, jobs in groups] == [(other, [free])]
    assert len(batcher) == 2
    assert batcher.due(now) == [(waiting, held)]
