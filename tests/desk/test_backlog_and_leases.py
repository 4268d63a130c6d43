"""The backlog follows three topics in any interleaving; the lease fold is the same on
every replica and the first claim in log order wins."""

from __future__ import annotations

from service.desk.backlog import DeskQueue
from service.desk.leases import LeaseBook, LeaseRecord, parse_lease_record
from service.records import BadMessage, Label, PendingEntry

from .fakes import request


def test_a_label_read_before_its_request_still_closes_it() -> None:
    q = DeskQueue(clock=lambda: 10.0)
    r = request("e", at=0.0)
    q.on_label(Label(r.request_id, "m", 1, "ann", 5.0), at=5.0)
    assert not q.offer(r)
    assert list(q.ordered(now=10.0)) == []
    assert q.answered_by[r.request_id] == "ann"


def test_the_changelog_opens_applies_and_removes() -> None:
    q = DeskQueue(clock=lambda: 10.0)
    a, b, c = request("a"), request("b"), request("c")
    q.on_pending(a.request_id, PendingEntry(a, 0))
    q.on_pending(b.request_id, PendingEntry(b, 0))
    q.on_pending(c.request_id, PendingEntry(c, 0))
    q.on_pending(a.request_id, PendingEntry(a, 0, applied=True, label=1, labelled_by="bob"))
    q.on_pending(b.request_id, None)  # dropped by the learner's cap
    assert [r.request_id for r in q.ordered(now=10.0)] == [c.request_id]
    q.offer(a)  # the label-requests topic read later changes nothing
    assert [r.request_id for r in q.ordered(now=10.0)] == [c.request_id]


def test_a_label_for_another_model_does_not_close_the_request() -> None:
    q = DeskQueue(clock=lambda: 0.0)
    r = request("e")
    q.offer(r)
    q.on_label(Label(r.request_id, "other", 1, "x", 1.0), at=1.0)
    assert q.is_open(r.request_id, now=1.0)


def test_expired_requests_are_counted_once_in_the_last_hour() -> None:
    now = [0.0]
    q = DeskQueue(clock=lambda: now[0])
    r = request("e", ttl=60.0)
    q.offer(r)
    now[0] = 100.0
    q.sweep()
    q.on_pending(r.request_id, None)  # the learner's sweep, read later
    assert q.expired_last_hour(now=100.0) == {"m": 1}
    assert q.open_counts(now=100.0) == {}


def test_the_first_claim_in_log_order_wins_and_renewals_keep_it() -> None:
    book = LeaseBook()
    assert book.apply(0, LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0))
    assert not book.apply(1, LeaseRecord("r", "claim", "bob", at=1.0, expires_at=101.0))
    assert book.apply(2, LeaseRecord("r", "claim", "ann", at=90.0, expires_at=190.0))
    assert not book.apply(3, LeaseRecord("r", "claim", "bob", at=150.0, expires_at=250.0))
    lease = book.holder("r", now=150.0)
    assert lease is not None
    assert (lease.holder, lease.since) == ("ann", 0.0)
    assert book.apply(4, LeaseRecord("r", "release", "ann", at=151.0))
    assert book.apply(5, LeaseRecord("r", "claim", "bob", at=152.0, expires_at=252.0))


def test_one_answer_try_at_a_time_and_a_failed_try_can_be_retried() -> None:
    book = LeaseBook()
    book.apply(0, LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0))
    assert book.apply(1, LeaseRecord("r", "answer", "ann", at=5.0, expires_at=105.0, attempt="a"))
    assert not book.apply(
        2, LeaseRecord("r", "answer", "ann", at=6.0, expires_at=106.0, attempt="b")
    )
    assert book.apply(3, LeaseRecord("r", "release", "ann", at=7.0, attempt="a"))
    assert book.apply(4, LeaseRecord("r", "answer", "ann", at=8.0, expires_at=108.0, attempt="b"))
    assert book.answers["r"].seconds == 8.0


def test_folding_a_record_twice_changes_nothing() -> None:
    book = LeaseBook()
    rec = LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0)
    assert book.apply(0, rec)
    assert book.apply(0, LeaseRecord("r", "release", "ann", at=1.0))  # the outcome already had
    assert book.holder("r", now=1.0) is not None


def test_lease_records_are_parsed_strictly() -> None:
    rec = LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0, replica="x")
    assert parse_lease_record(rec.to_json()) == rec
    for bad in (
        b"{",
        b'{"request_id": "r", "kind": "steal", "holder": "a", "at": 0}',
        b'{"request_id": "r", "kind": "claim", "at": 0}',
    ):
        try:
            parse_lease_record(bad)
        except BadMessage:
            continue
        raise AssertionError(bad)
