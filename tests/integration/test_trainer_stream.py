"""The trainer's consumer on a real redis-server: groups are delivered once, re-delivered to a
restarted consumer until acknowledged (the crash case), malformed entries go to the
dead-letter stream, entries trimmed while pending are counted as lost, a Redis restart is
survived and an unreachable Redis is a clear error."""
from __future__ import annotations

import pickle
import threading
import time

import pytest
import redis

from consolerl.errors import ConfigError, ConsoleRLError
from infra.local_cloud import free_port
from consolerl.experience import Turn
from rollout_service.experience import ExperienceStream, StreamConfig
from consolerl.experience import Group, Sample
from tests.integration.redis_server import RedisServer
from trainer.stream import ConsumerConfig, ExperienceConsumer, StreamUnavailable, redact_url


def group(i: int) -> Group:
    turn = Turn((1, 2, 3), (70000 + i, 5), (-0.25, -1.5), (1, 1), 3, "click(3)", "click(3)")
    return Group(f"g{i}", "ram-create-user-0",
                 (Sample(f"t{i}a", (turn,), 1.0, "success", "stop"),
                  Sample(f"t{i}b", (turn,), 0.0, "failure", "max_steps")), 123.0)


def setup(server: RedisServer, name: str, **kw) -> tuple[ExperienceStream, ExperienceConsumer]:
    config = StreamConfig(url=server.url, stream=f"t:{name}")
    consumer = ExperienceConsumer(config, ConsumerConfig(block_ms=0, **kw))
    consumer.ensure_group()
    consumer.ensure_group()                      # BUSYGROUP is fine
    return ExperienceStream(config), consumer


def metric(consumer: ExperienceConsumer, name: str, **labels) -> float:
    return consumer.registry.get_sample_value(f"consolerl_trainer_stream_{name}", labels)


def test_groups_are_delivered_once_and_in_order(redis_server):
    stream, consumer = setup(redis_server, "once")
    ids = [stream.push(group(i)) for i in range(3)]
    got = consumer.read(10)
    assert [d.entry_id for d in got] == ids
    assert [d.group for d in got] == [group(i) for i in range(3)]
    assert not any(d.redelivered for d in got)
    assert consumer.read(10) == []
    assert consumer.pending() == 3
    assert metric(consumer, "delivered_total", kind="new") == 3
    assert metric(consumer, "pending") == 3


def test_a_restarted_consumer_gets_its_unacknowledged_entries_again(redis_server):
    stream, first = setup(redis_server, "crash")
    ids = [stream.push(group(i)) for i in range(3)]
    assert [d.entry_id for d in first.read(10)] == ids
    # The trainer crashes before its checkpoint: nothing was acknowledged.
    stream.push(group(3))
    second = ExperienceConsumer(first.stream_config, first.config)
    got = second.read(2)
    assert [(d.entry_id, d.redelivered) for d in got] == [(ids[0], True), (ids[1], True)]
    got = second.read(10)
    assert [d.group.group_id for d in got] == ["g2", "g3"]
    assert [d.redelivered for d in got] == [True, False]
    assert second.read(10) == []                 # handed out once per consumer object
    assert metric(second, "delivered_total", kind="redelivered") == 3
    assert metric(second, "delivered_total", kind="new") == 1

    # Committed: acknowledged; a later incarnation gets nothing again.
    assert second.ack(ids + [got[1].entry_id]) == 4
    assert second.ack(ids) == 0                  # twice is harmless
    assert second.pending() == 0
    assert metric(second, "acked_total") == 4 and metric(second, "pending") == 0
    third = ExperienceConsumer(first.stream_config, first.config)
    assert third.read(10) == []


def test_read_waits_up_to_block_ms_for_new_entries(redis_server):
    stream, consumer = setup(redis_server, "block")
    t0 = time.monotonic()
    assert consumer.read(1, block_ms=300) == []
    assert 0.25 < time.monotonic() - t0 < 3
    threading.Timer(0.2, lambda: stream.push(group(7))).start()
    got = consumer.read(5, block_ms=3000)
    assert [d.group.group_id for d in got] == ["g7"]


def test_malformed_entries_go_to_the_dead_letter_stream(redis_server):
    stream, consumer = setup(redis_server, "dead")
    good = stream.push(group(1))
    bad1 = stream.redis.xadd("t:dead", {"data": b"not zlib", "group_id": "gx"}).decode()
    bad2 = stream.redis.xadd("t:dead", {"foo": "bar"}).decode()
    good2 = stream.push(group(2))
    got = consumer.read(2)
    assert [d.entry_id for d in got] == [good, good2]

    dead = stream.redis.xrange("t:dead:dead")
    assert [f[b"dead_letter_entry_id"].decode() for _, f in dead] == [bad1, bad2]
    assert b"malformed" in dead[0][1][b"dead_letter_error"]
    assert dead[0][1][b"data"] == b"not zlib" and dead[0][1][b"group_id"] == b"gx"
    assert b"no 'data' field" in dead[1][1][b"dead_letter_error"]
    assert dead[1][1][b"dead_letter_group"] == b"trainer"
    consumer.ack([d.entry_id for d in got])
    assert consumer.pending() == 0               # the bad ones were acknowledged too
    assert metric(consumer, "dead_lettered_total") == 2
    assert metric(consumer, "delivered_total", kind="new") == 2


def test_entries_trimmed_while_pending_are_lost_not_fatal(redis_server):
    stream, first = setup(redis_server, "trim")
    for i in range(3):
        stream.push(group(i))
    assert len(first.read(10)) == 3
    stream.redis.xtrim("t:trim", maxlen=0)       # MAXLEN ~ overtook the slow trainer
    late = stream.push(group(9))
    second = ExperienceConsumer(first.stream_config, first.config)
    got = second.read(10)
    assert [(d.entry_id, d.redelivered) for d in got] == [(late, False)]
    assert metric(second, "lost_total") == 3
    second.ack([late])
    assert second.pending() == 0


def test_a_redis_restart_between_reads_is_survived(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    try:
        stream, consumer = setup(server, "restart", retry_s=30.0)
        ids = [stream.push(group(i)) for i in range(3)]
        assert [d.entry_id for d in consumer.read(1)] == ids[:1]
        server.stop()                            # SIGTERM: the AOF is flushed
        restart = threading.Timer(1.0, server.start)
        restart.start()
        t0 = time.monotonic()
        got = consumer.read(10)
        restart.join()
        assert time.monotonic() - t0 >= 0.9
        assert [d.entry_id for d in got] == ids[1:]
        assert not any(d.redelivered for d in got)
        consumer.ack(ids)
        assert consumer.pending() == 0
        stream.push(group(5))
        assert [d.group.group_id for d in consumer.read(10)] == ["g5"]
    finally:
        server.stop()


def test_a_consumer_group_lost_by_the_server_is_created_again(redis_server):
    stream, consumer = setup(redis_server, "nogroup")
    stream.push(group(1))
    stream.redis.xgroup_destroy("t:nogroup", "trainer")       # as if Redis lost its data
    assert [d.group.group_id for d in consumer.read(10)] == ["g1"]


def test_entries_delivered_with_a_lost_reply_come_back_on_the_next_read(redis_server):
    stream, consumer = setup(redis_server, "lostreply")
    ids = [stream.push(group(i)) for i in range(2)]
    real = consumer.redis.xreadgroup
    calls = []

    def drop_first_reply(groupname, consumername, streams, **kw):
        reply = real(groupname, consumername, streams, **kw)   # Redis delivers the entries
        if ">" in streams.values():
            calls.append(streams)
            if len(calls) == 1:
                raise redis.ConnectionError("connection reset")   # ... the reply is lost
        return reply

    consumer.redis.xreadgroup = drop_first_reply
    assert consumer.read(10) == []              # the retry finds nothing new
    got = consumer.read(10)
    assert [(d.entry_id, d.redelivered) for d in got] == [(ids[0], True), (ids[1], True)]
    assert consumer.read(10) == []


def test_an_unreachable_redis_is_a_clear_error_after_retry_s():
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    consumer = ExperienceConsumer(StreamConfig(url=url, stream="t:none"),
                                  ConsumerConfig(retry_s=0.5))
    t0 = time.monotonic()
    with pytest.raises(StreamUnavailable) as caught:
        consumer.read(1)
    assert 0.4 < time.monotonic() - t0 < 5
    err = caught.value
    assert isinstance(err, ConnectionError) and isinstance(err, ConsoleRLError)
    assert redact_url(url) in str(err) and "hunter2" not in str(err)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


def test_a_text_client_is_refused(redis_server):
    with pytest.raises(ConfigError, match="decode_responses"):
        ExperienceConsumer(StreamConfig(url=redis_server.url), ConsumerConfig(),
                           client=redis_server.client())


@pytest.mark.parametrize("kw,field", [
    ({"group": ""}, "ConsumerConfig.group"),
    ({"consumer": " x"}, "ConsumerConfig.consumer"),
    ({"block_ms": -1}, "ConsumerConfig.block_ms"),
    ({"dead_letter_suffix": ""}, "ConsumerConfig.dead_letter_suffix"),
    ({"retry_s": -1.0}, "ConsumerConfig.retry_s"),
    ({"retry_s": float("nan")}, "ConsumerConfig.retry_s"),
])
def test_bad_consumer_config_names_the_field(kw, field):
    with pytest.raises(ConfigError, match=field):
        ConsumerConfig(**kw)

