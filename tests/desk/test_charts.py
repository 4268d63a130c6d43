"""The team view's charts: the queue depth over the last hours follows the records' own
times (a request counts from its request time until the label, the applied mark or the
expiry that closed it), the answers per bucket too, so a desk restarted later draws the
same; bars are scaled to the largest value and escaped."""

from __future__ import annotations

from service.desk.charts import BUCKET_SECONDS, BUCKETS, Timeline, sparkline
from service.records import Label

from .review.harness import Replica, deployment, req


def test_a_timeline_keeps_its_level_across_the_window_and_ignores_the_future_until_due() -> None:
    t = Timeline(bucket=10.0, n=4)
    t.add(0.0, 5)  # long before the window
    t.add(35.0, 1)
    t.add(100.0, 1)  # (a clock ahead: shown when its bucket comes)
    assert t.levels(now=59.0) == [5.0, 6.0, 6.0, 6.0]  # buckets 20-60 s
    assert t.counts(now=59.0) == [0.0, 1.0, 0.0, 0.0]
    assert t.levels(now=109.0) == [6.0, 6.0, 6.0, 7.0]
    t.add(0.0, -5)  # late news of something long past changes the base
    assert t.levels(now=109.0) == [1.0, 1.0, 1.0, 2.0]


def test_a_sparkline_scales_to_its_largest_value_and_escapes_its_label() -> None:
    svg = sparkline([1.0, 4.0, 0.0, -2.0], label='<a "b">', width=40, height=20)
    assert svg.count("<rect") == 3  # the axis and two bars: nothing for zero or below
    assert 'height="20.0"' in svg  # the largest value fills the height
    assert "&lt;a &quot;b&quot;&gt;" in svg
    assert "<a " not in svg


async def test_the_depth_and_the_answers_follow_the_records_times_and_a_restart_draws_the_same() -> (  # noqa: E501
    None
):
    topics, (desk,) = deployment(1)
    start = topics.clock.now = 10 * BUCKET_SECONDS * BUCKETS  # a bucket's start
    requests = [
        req(f"e{i}", at=start + i * BUCKET_SECONDS, ttl=3 * BUCKET_SECONDS) for i in range(4)
    ]
    for r in requests:
        topics.request(r)
    topics.clock.now = start + 4.5 * BUCKET_SECONDS
    topics.label(Label(requests[3].request_id, "m", 1, "ann", topics.clock.now))
    topics.clock.now = start + 5.5 * BUCKET_SECONDS
    desk.desk.tick()  # the sweep: e0, e1 and e2 expired at their own times
    row = desk.desk.team_view().models[0]
    assert row.model == "m"
    # buckets from start: e0 (expires in bucket 3), e1 (4), e2 (5), e3 (answered in 4)
    assert list(row.depth[-6:]) == [1.0, 2.0, 3.0, 3.0, 1.0, 0.0]
    assert list(row.answered[-6:]) == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    topics.clock.now += 0.5 * BUCKET_SECONDS
    again = Replica(topics, "later", desk.models)
    again.desk.tick()
    desk.desk.tick()
    later = again.desk.team_view().models[0]
    assert (later.depth, later.answered) == (
        desk.desk.team_view().models[0].depth,
        desk.desk.team_view().models[0].answered,
    )
