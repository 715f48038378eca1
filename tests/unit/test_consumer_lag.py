"""Consumer lag as /metrics exports it: against the broker's end offset when the scrape got it,
in seconds by how old the oldest record waiting can be (the newest record read, or when the
ingester last knew it had read everything)."""

from filopy.rest.metrics import consumer_lag

NOW = 1_700_000_100.0


def test_the_broker_s_end_offset_wins_over_the_ingester_s_own_view() -> None:
    # On a slow link the ingester's last fetch said it was caught up; the broker knows better.
    stats = {"lag": 0, "next_offset": 40, "read_ts_ms": 1_700_000_070_000}
    assert consumer_lag(stats, 120, NOW) == (80, 30.0)


def test_caught_up_is_zero_in_both_however_old_the_last_record() -> None:
    stats = {"lag": 0, "next_offset": 120, "read_ts_ms": 1_600_000_000_000}
    assert consumer_lag(stats, 120, NOW) == (0, 0.0)


def test_without_the_broker_the_ingester_s_view_is_used() -> None:
    stats = {"lag": 5, "next_offset": 115, "read_ts_ms": 1_700_000_099_000}
    assert consumer_lag(stats, None, NOW) == (5, 1.0)


def test_unknown_until_known() -> None:
    assert consumer_lag({"lag": None, "next_offset": None, "read_ts_ms": None}, None, NOW) == (
        None,
        None,
    )
    # records wait but none was read yet: the offsets are known, the time is not
    assert consumer_lag({"lag": 3, "next_offset": 0, "read_ts_ms": None}, 3, NOW) == (3, None)


def test_a_shard_that_reads_nothing_while_records_wait_ages_from_when_it_was_last_current() -> None:
    # An idle shard (its newest record long ago) whose fetches stall once records arrive: its
    # lag in seconds grows from the last time it knew it had read everything (a probe).
    stats = {"lag": 0, "next_offset": 40, "read_ts_ms": 1_600_000_000_000,
             "current_ms": 1_700_000_090_000}  # fmt: skip
    assert consumer_lag(stats, 48, NOW) == (8, 10.0)
    # the later of the two bounds: a record read after the ingester was last current
    stats |= {"read_ts_ms": 1_700_000_095_000}
    assert consumer_lag(stats, 48, NOW) == (8, 5.0)
    # nothing read yet, but current at start
    assert consumer_lag({"lag": 0, "next_offset": 0, "current_ms": 1_700_000_040_000}, 8, NOW) == (
        8,
        60.0,
    )
