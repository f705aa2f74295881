"""The experience stream on a real redis-server: groups round-trip token-exactly, the stream is
trimmed to its max length, the trainer version is shared, malformed entries are refused."""
from __future__ import annotations

import pytest

from consolerl.errors import ConfigError
from consolerl.experience import Turn
from rollout_service.experience import ExperienceStream, StreamConfig
from consolerl.experience import Group, Sample, decode_group


def group(i: int) -> Group:
    turn = Turn((1, 2, 3), (70000 + i, 5, 2), (-0.25, -1.5, -0.0001), (1, 1, 1), 4,
                "click(3)", "click(3)")
    return Group(f"g{i}", "ram-create-user-0",
                 (Sample(f"t{i}a", (turn,), 1.0, "success", "stop"),
                  Sample(f"t{i}b", (turn, turn), 0.0, "failure", "max_steps")), 123.0)


def test_groups_round_trip_exactly_and_the_stream_is_bounded(redis_server):
    stream = ExperienceStream(StreamConfig(url=redis_server.url, stream="t:exp", max_len=5))
    for i in range(300):
        stream.push(group(i))
    assert stream.length() < 300            # approximate trimming keeps about max_len
    entries = stream.redis.xrange("t:exp", count=1000)
    last_id, fields = entries[-1]
    assert fields[b"task_id"] == b"ram-create-user-0" and fields[b"min_version"] == b"4"
    assert decode_group(fields) == group(299)
    stream.set_trainer_version(9)
    assert ExperienceStream(stream.config).trainer_version() == 9


@pytest.mark.parametrize("fields,message", [
    ({}, "no 'data' field"),
    ({b"data": b"not zlib"}, "malformed"),
])
def test_malformed_entries_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        decode_group(fields)


def test_bad_stream_config():
    with pytest.raises(ConfigError, match="redis:// URL"):
        StreamConfig(url="http://x")
    with pytest.raises(ConfigError, match="max_len"):
        StreamConfig(max_len=0)
