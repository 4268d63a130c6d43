"""The backlog follows three topics in any interleaving; the lease fold is the same on
every replica, the first claim in log order wins and no record holds a request longer than
a person's claim would."""

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


def test_the_changelog_closes_requests_but_opens_none() -> None:
    q = DeskQueue(clock=lambda: 10.0)
    a, b, c, d = request("a"), request("b"), request("c"), request("d")
    for r in (a, b, c):
        q.offer(r)
        q.on_pending(r.request_id, PendingEntry(r, 0))
    q.on_pending(a.request_id, PendingEntry(a, 0, applied=True, label=1, labelled_by="bob"))
    q.on_pending(b.request_id, None)  # dropped by the learner's cap
    # an entry whose request never came on the label-requests topic: the learner (which
    # writes entries only for requests it read) does not hold it, so it is not offered
    q.on_pending(d.request_id, PendingEntry(d, 0))
    assert [r.request_id for r in q.ordered(now=10.0)] == [c.request_id]
    q.offer(a)  # the label-requests topic read again changes nothing
    assert [r.request_id for r in q.ordered(now=10.0)] == [c.request_id]


def test_a_label_naming_another_model_read_before_its_request_does_not_close_it() -> None:
    q = DeskQueue(clock=lambda: 10.0)
    r, s = request("e", at=0.0), request("f", at=0.0)
    q.on_label(Label(r.request_id, "other", 1, "eve", 5.0), at=5.0)  # the learner refuses it
    q.on_label(Label(s.request_id, "other", 1, "eve", 5.0), at=5.0)
    q.on_label(Label(s.request_id, "m", 1, "ann", 6.0), at=6.0)  # this one the learner applies
    assert q.offer(r)
    assert not q.offer(s)
    assert [x.request_id for x in q.ordered(now=10.0)] == [r.request_id]


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
    book = LeaseBook(lease_seconds=120.0)
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
    book = LeaseBook(lease_seconds=120.0)
    book.apply(0, LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0))
    assert book.apply(1, LeaseRecord("r", "answer", "ann", at=5.0, expires_at=105.0, attempt="a"))
    assert not book.apply(
        2, LeaseRecord("r", "answer", "ann", at=6.0, expires_at=106.0, attempt="b")
    )
    assert book.apply(3, LeaseRecord("r", "release", "ann", at=7.0, attempt="a"))
    assert book.apply(4, LeaseRecord("r", "answer", "ann", at=8.0, expires_at=108.0, attempt="b"))
    assert book.answers["r"].seconds == 8.0


def test_an_answer_try_nobody_runs_blocks_its_holder_for_answer_seconds_at_most() -> None:
    """A forged ``answer`` record (or the try of a replica that died) holds no request for
    long: renewing keeps the lease, and the holder's own answer goes through once the try
    could no longer be running."""
    book = LeaseBook(lease_seconds=120.0, answer_seconds=12.0)
    book.apply(0, LeaseRecord("r", "claim", "ann", at=0.0, expires_at=120.0))
    assert book.apply(
        1, LeaseRecord("r", "answer", "ann", at=1.0, expires_at=121.0, attempt="nobody-runs-this")
    )
    assert book.apply(2, LeaseRecord("r", "claim", "ann", at=5.0, expires_at=125.0))  # renew
    assert not book.apply(
        3, LeaseRecord("r", "answer", "ann", at=6.0, expires_at=126.0, attempt="mine")
    )  # the other try might still run
    assert book.apply(
        4, LeaseRecord("r", "answer", "ann", at=13.0, expires_at=133.0, attempt="mine")
    )
    assert not book.apply(  # and "mine" now runs: the stranded one cannot come back
        5, LeaseRecord("r", "answer", "ann", at=14.0, expires_at=134.0, attempt="nobody-runs-this")
    )
    assert book.held_by("ann", now=14.0) == ["r"]


def test_folding_a_record_twice_changes_nothing() -> None:
    book = LeaseBook(lease_seconds=120.0)
    rec = LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0)
    assert book.apply(0, rec)
    assert book.apply(0, LeaseRecord("r", "release", "ann", at=1.0))  # the outcome already had
    assert book.holder("r", now=1.0) is not None


def test_a_claim_holds_for_lease_seconds_from_its_time_whatever_it_says() -> None:
    book = LeaseBook(lease_seconds=120.0)
    forged = LeaseRecord("r", "claim", "eve", at=0.0, expires_at=1e15)
    assert book.apply(0, forged, at=1000.0)  # the Kafka time, not the record's own
    assert book.holder("r", now=1100.0) is not None
    assert book.holder("r", now=1120.0) is None
    assert book.apply(1, LeaseRecord("r", "claim", "ann", at=1121.0, expires_at=1241.0))
    # renewing every minute keeps it (a person's page does that), but never beyond 120 s
    for i, t in enumerate((1180.0, 1240.0)):
        assert book.apply(2 + i, LeaseRecord("r", "claim", "ann", at=t, expires_at=t + 9e9))
        lease = book.holder("r", now=t)
        assert lease is not None
        assert lease.expires_at == t + 120.0


def test_a_record_dated_in_the_future_holds_nothing_before_its_time() -> None:
    book = LeaseBook(lease_seconds=120.0)
    assert book.apply(0, LeaseRecord("r", "claim", "eve", at=0.0), at=1e9)
    assert book.holder("r", now=1000.0) is None  # not begun: free
    assert book.apply(1, LeaseRecord("r", "claim", "ann", at=1000.0, expires_at=1120.0))
    lease = book.holder("r", now=1001.0)
    assert lease is not None
    assert lease.holder == "ann"


def test_lease_records_are_parsed_strictly() -> None:
    rec = LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0, replica="x")
    assert parse_lease_record(rec.to_json()) == rec
    for bad in (
        b"{",
        b'{"request_id": "r", "kind": "steal", "holder": "a", "at": 0}',
        b'{"request_id": "r", "kind": "claim", "at": 0}',
        b'{"request_id": "r", "kind": "claim", "holder": "<script>", "at": 0}',
        b'{"request_id": "r", "kind": "claim", "holder": "a", "at": 1e999}',
        b'{"request_id": "r", "kind": "answer", "holder": "a", "at": 0, "attempt": 7}',
        b"[" * 3000 + b"]" * 3000,
    ):
        try:
            parse_lease_record(bad)
        except BadMessage:
            continue
        raise AssertionError(bad)


def _joined(n_before: int) -> tuple[DeskQueue, LeaseBook, list[float]]:
    now = [1000.0]
    q, book = DeskQueue(clock=lambda: now[0]), LeaseBook(lease_seconds=120.0)
    book.on_answer = q.on_timing
    records = []
    for i, (who, held) in enumerate([("ann", 10.0), ("ann", 30.0), ("bob", 5.0)]):
        rid = f"r{i}"
        records.append((LeaseRecord(rid, "claim", who, at=900.0, expires_at=1020.0), None))
        answer = LeaseRecord(rid, "answer", who, at=900.0 + held, expires_at=1100.0, attempt="a")
        records.append((answer, Label(rid, "m", 1, who, 900.0 + held)))
    for i, (record, label) in enumerate(records):
        if label is not None and i < n_before:  # the label is read before its answer record
            q.on_label(label, at=label.ts or 0.0)
        book.apply(i, record)
        if label is not None and i >= n_before:
            q.on_label(label, at=label.ts or 0.0)
    return q, book, now


def test_answer_times_join_their_labels_whichever_topic_is_read_first() -> None:
    for n_before in (0, 3, 6):
        q, _, now = _joined(n_before)
        counts = q.answer_counts(now=now[0])
        assert counts.day_by_person == {"ann": 2, "bob": 1}
        assert counts.median_seconds == {"ann": 20.0, "bob": 5.0}
        assert counts.hour_by_model == {"m": 3}
        now[0] += 3600.0  # an hour later: gone from the hour, still in the day
        q.sweep()
        counts = q.answer_counts(now=now[0])
        assert (counts.hour_total, counts.day_by_person["ann"]) == (0, 2)
        now[0] += 86_400.0
        q.sweep()
        counts = q.answer_counts(now=now[0])
        assert (counts.day_by_person, counts.median_seconds) == ({}, {})


def test_expiry_and_oldest_follow_the_requests_without_walking_them() -> None:
    now = [0.0]
    q = DeskQueue(clock=lambda: now[0])
    early, late = request("a", at=0.0, ttl=60.0), request("b", at=10.0, ttl=600.0)
    q.offer(early)
    q.offer(late)
    assert q.oldest_age(now=30.0) == {"m": 30.0}
    now[0] = 61.0
    q.sweep()
    assert (q.open_counts(now=61.0), q.oldest_age(now=61.0)) == ({"m": 1}, {"m": 51.0})
    assert q.expired_last_hour(now=61.0) == {"m": 1}
    assert q.expired_last_hour(now=61.0 + 3600.0) == {}
    now[0] = 60.0 + 3601.0  # an hour after its end the expired id is forgotten
    q.sweep()
    assert early.request_id not in q.closed


def test_running_leases_are_indexed_by_holder_and_forgotten_when_over() -> None:
    book = LeaseBook(lease_seconds=120.0)
    book.apply(0, LeaseRecord("r", "claim", "ann", at=0.0, expires_at=100.0))
    book.apply(1, LeaseRecord("s", "claim", "ann", at=5.0, expires_at=105.0))
    assert book.held_by("ann", now=50.0) == ["r", "s"]
    book.apply(2, LeaseRecord("s", "release", "ann", at=6.0))
    assert book.held_by("ann", now=50.0) == ["r"]
    assert book.apply(3, LeaseRecord("r", "claim", "bob", at=101.0, expires_at=201.0))
    assert (book.held_by("ann", now=150.0), book.held_by("bob", now=150.0)) == ([], ["r"])
    assert [rid for rid, _ in book.live(150.0)] == ["r"]
    assert book.active(202.0) == 0
    book.forget(202.0 + 50.0, keep=100.0)
    assert "r" in book.leases
    book.forget(202.0 + 101.0, keep=100.0)
    assert book.leases == {}
