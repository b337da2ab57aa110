"""The site's two ways through a poll (consumers.site.Site._parse): the whole poll at once
(``_parse_poll``) and message by message (``_parse_each``) make the same batch, and the whole
poll is only taken when it can be. Real confluent_kafka Message objects; no broker needed."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

from confluent_kafka import Message

from consumers.ledger import Batch
from consumers.site import Site, SiteOptions
from settlement.contract import CLOSE_HEADERS, TRADE_HEADERS
from settlement.simulator.gateway import Amend, DayGenerator, SimulationSpec

DATE = "2026-11-23"


def _site(partitions: range) -> Site:
    site = Site.__new__(Site)  # only what parsing reads: no consumer, no ledger
    site.expected = {p: 0 for p in partitions}
    site.opts = SiteOptions("a", "separate")
    site.settings = SimpleNamespace(max_message_bytes=16384)  # type: ignore[assignment]
    site.stalled, site.needs_resync, site.retry_at = {}, False, 0.0
    return site


def _poll() -> list[Message]:
    """A day's end on four partitions: trades, cancels and corrections, a replayed trade,
    and each partition's close marker as soon as its last trade is out (so markers sit
    between other partitions' trades, as in a real poll)."""
    spec = SimulationSpec(DATE, 400, seed=3, cancel_rate=0.05, correct_rate=0.05)
    events = list(DayGenerator(spec, 4).events())
    last = {e.partition: i for i, e in enumerate(events)}
    offsets: dict[int, int] = defaultdict(int)
    msgs: list[Message] = []

    def add(p: int, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        msgs.append(Message(topic="trades", partition=p, offset=offsets[p], value=value,
                            headers=headers))
        offsets[p] += 1

    for i, e in enumerate(events):
        add(e.partition, e.value(), e.headers if isinstance(e, Amend) else TRADE_HEADERS)
        if i == 50:
            add(events[10].partition, events[10].value(), TRADE_HEADERS)  # a replay
        if last[e.partition] == i:
            add(e.partition, json.dumps({"trade_date": DATE, "partition": e.partition,
                                         "last_seq": 999}).encode(), CLOSE_HEADERS)
    return msgs


def _each(site: Site, msgs: list[Message]) -> Batch:
    batch = Batch()
    batch.messages = site._parse_each(msgs, batch)
    return batch


def _same(a: Batch, b: Batch) -> None:
    assert a.copy_lines == b.copy_lines
    assert [id(m) for m in a.trade_messages] == [id(m) for m in b.trade_messages]
    assert (a.dead_letters, a.close_markers, a.amendments) == \
        (b.dead_letters, b.close_markers, b.amendments)
    assert a.next_offsets == b.next_offsets and a.messages == b.messages


def test_a_day_end_poll_is_parsed_whole_into_the_batch_of_the_message_by_message_path() -> None:
    msgs = _poll()
    site = _site(range(4))
    whole = site._parse_poll(msgs)
    assert whole is not None
    _same(whole, _each(site, msgs))
    assert len(whole.close_markers) == 4 and whole.amendments and not whole.dead_letters
    assert len(whole.copy_lines) == 401  # the replay is staged too: the ledger judges it
    assert whole.next_offsets == {p: max(m.offset() for m in msgs if m.partition() == p) + 1
                                  for p in range(4)}


def test_a_poll_the_whole_path_cannot_take_goes_message_by_message() -> None:
    msgs = _poll()
    site = _site(range(4))
    bad = json.loads(msgs[20].value())
    for change in (
        lambda: Message(topic="trades", partition=msgs[20].partition(),
                        offset=msgs[20].offset(), headers=TRADE_HEADERS,
                        value=json.dumps({**bad, "seller": bad["buyer"]}).encode()),
        # a trade in another header form: parsed in its place among the trades
        lambda: Message(topic="trades", partition=msgs[20].partition(),
                        offset=msgs[20].offset(), value=msgs[20].value(), headers=None),
    ):
        poll = msgs[:20] + [change()] + msgs[21:]
        assert site._parse_poll(poll) is None
        batch = site._parse(poll)
        _same(batch, _each(site, poll))
    dead = site._parse(msgs[:20] + [Message(topic="trades", partition=msgs[20].partition(),
                                            offset=msgs[20].offset(), headers=TRADE_HEADERS,
                                            value=json.dumps({**bad, "seller": bad["buyer"]})
                                            .encode())] + msgs[21:])
    assert [d["offset"] for d in dead.dead_letters] == [msgs[20].offset()]
    assert "buyer equals seller" in dead.dead_letters[0]["reason"]
    assert len(dead.copy_lines) == 400


def test_a_poll_with_a_partition_no_longer_ours_goes_message_by_message() -> None:
    msgs = _poll()
    site = _site(range(3))  # partition 3 was revoked while the poll was on its way
    assert site._parse_poll(msgs) is None
    batch = site._parse(msgs)
    assert 3 not in batch.next_offsets
    assert all(m.partition() != 3 for m in batch.trade_messages)
    assert batch.messages == sum(m.partition() != 3 for m in msgs)


def test_the_hot_loop_settings_hold_while_a_loop_runs_and_come_back_after_the_last() -> None:
    import gc
    import sys

    from consumers.runtime import GC_THRESHOLD_0, hot_loop

    before = (sys.getswitchinterval(), gc.get_threshold(), gc.get_freeze_count())
    with hot_loop(0.0005):
        assert sys.getswitchinterval() == 0.0005
        assert gc.get_threshold()[0] == GC_THRESHOLD_0 and gc.get_freeze_count() > 0

        def worker() -> object:
            with hot_loop():
                yield 1
                yield 2

        gen = worker()
        next(gen)
        gen.close()  # a Spark task stopped early: its loop ends, this one still runs
        assert gc.get_threshold()[0] == GC_THRESHOLD_0 and sys.getswitchinterval() == 0.0005
    assert (sys.getswitchinterval(), gc.get_threshold()) == before[:2]
    assert gc.get_freeze_count() == before[2] == 0


def test_a_poll_with_an_error_event_goes_message_by_message() -> None:
    from confluent_kafka import KafkaError

    msgs = _poll()
    site = _site(range(4))
    eof = Message(topic="trades", partition=1, offset=7,
                  error=KafkaError(KafkaError._PARTITION_EOF))
    poll = msgs[:30] + [eof] + msgs[30:]
    assert site._parse_poll(poll) is None
    batch = site._parse(poll)
    _same(batch, site._parse_poll(msgs))  # the event is skipped, the rest is the same batch


def _markers(day: str, partitions: list[int]) -> Batch:
    return Batch(close_markers=[{"trade_date": day, "partition": p, "last_seq": 1,
                                 "offset": 9, "raw": b"{}"} for p in partitions])


def test_the_site_drains_to_look_for_the_close_only_when_its_markers_may_complete_it() -> None:
    """A backlog read meets its partitions' markers one poll at a time: only the poll that
    marks the last partition this site owns drains the pipeline to look (Site._may_close)."""
    site = _site(range(4))
    site.owned, site.marked = {0, 1, 2, 3}, {}
    assert site._may_close(Batch(), DATE) is False  # no markers: the periodic look only
    assert site._may_close(_markers(DATE, [0, 1]), DATE) is False
    assert site._may_close(_markers("2026-11-20", [2, 3]), DATE) is False  # another day's
    assert site._may_close(_markers(DATE, [1]), DATE) is False  # a replayed marker
    assert site._may_close(_markers(DATE, [2, 3]), DATE) is True
    assert site._may_close(_markers(DATE, [3]), DATE) is True  # still complete
    # A member owning two partitions looks once its own two are marked.
    member = _site(range(4))
    member.owned, member.marked = {1, 3}, {}
    assert member._may_close(_markers(DATE, [0, 1, 2]), DATE) is False
    assert member._may_close(_markers(DATE, [3]), DATE) is True
    # The day not known yet (no --date, nothing in the ledger): any marker looks, as before.
    fresh = _site(range(4))
    fresh.owned, fresh.marked = {0, 1, 2, 3}, {}
    assert fresh._may_close(_markers(DATE, [0]), None) is True


def test_the_last_batch_written_is_freed_whole_in_slices() -> None:
    """Site._release, which the loop calls once the next batch is handed to the writer."""
    from concurrent.futures import Future

    from consumers.site import FREE_SLICE, InFlight

    msgs = _poll()
    site = _site(range(4))
    written = site._parse_poll(msgs)
    assert written is not None
    written.copy_lines *= 5  # more lines than a slice
    written.trade_messages *= 5
    assert len(written.copy_lines) > 2 * FREE_SLICE
    site.spent = InFlight(written, {}, Future())
    site._release()
    assert site.spent is None
    assert written.copy_lines == [] and written.trade_messages == []
    site._release()  # nothing spent: nothing to do
    assert site.spent is None
