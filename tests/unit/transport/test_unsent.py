"""The ledger of unsent answers (``transport/unsent.py``): which answers it refuses, and
when it says memory may have come back."""

from __future__ import annotations

from inferpool.transport.unsent import PER_CONNECTION, SMALL, TOTAL, UnsentAnswers

MIB = 1 << 20


class Peer:
    def __init__(self, held: int = 0) -> None:
        self.held = held

    def unsent(self) -> int:
        return self.held


def ledger(limit: int = 16 * MIB, per_connection: int = 4 * MIB) -> tuple[UnsentAnswers, list]:
    calls: list[None] = []
    answers = UnsentAnswers()
    answers.configure(limit, per_connection, lambda: calls.append(None))
    return answers, calls


def test_nothing_held_lets_any_answer_through_even_past_both_bounds():
    answers, _ = ledger()
    assert answers.refusal(Peer(), 100 * MIB) is None
    answers.hold(Peer(0))  # holds nothing: leaves at the next count
    assert answers.refusal(Peer(), 100 * MIB) is None
    assert not answers.holders


def test_a_connection_past_its_bound_has_its_large_answers_refused():
    answers, released = ledger()
    peer = Peer(3 * MIB)
    answers.hold(peer)
    assert answers.refusal(peer, 512 * 1024) is None  # 3.5 MiB: within 4
    limit, message = answers.refusal(peer, 2 * MIB)
    assert limit == PER_CONNECTION
    assert "this connection holds 3.0 MiB" in message
    assert "max_unsent_bytes_per_connection=4194304" in message
    assert released  # the refused answer is freed: the heap may give pages back
    assert answers.refusal(peer, SMALL - 1) is None  # small answers always pass
    assert answers.refusal(Peer(), 2 * MIB) is None  # another connection: fits the total


def test_all_connections_together_are_bounded_by_the_total():
    answers, _ = ledger()
    for _ in range(5):
        answers.hold(Peer(3 * MIB))
    assert answers.total() == 15 * MIB
    assert answers.refusal(Peer(), 512 * 1024) is None
    limit, message = answers.refusal(Peer(), 2 * MIB)
    assert limit == TOTAL
    assert "the server holds 15.0 MiB" in message and "max_unsent_bytes=16777216" in message


def test_new_requests_of_a_connection_are_refused_only_past_its_bound():
    answers, _ = ledger()
    assert answers.connection_refusal(Peer(4 * MIB)) is None
    message = answers.connection_refusal(Peer(5 * MIB))
    assert message is not None and message.startswith("this connection holds 5.0 MiB")
    answers.configure(0, 0)
    assert answers.connection_refusal(Peer(500 * MIB)) is None  # 0: no bound


def test_holders_that_sent_everything_leave_and_say_so():
    answers, released = ledger()
    peer = Peer(2 * MIB)
    answers.hold(peer)
    assert answers.total() == 2 * MIB and not released
    peer.held = 0
    assert answers.total() == 0
    assert not answers.holders and len(released) == 1
    answers.hold(peer)
    answers.release(peer)
    answers.release(peer)  # twice: said once
    assert len(released) == 2
