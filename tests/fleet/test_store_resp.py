"""The lean pipelined connection of the hot scripts (fleet.store.resp) on a real Redis: replies as redis-py gives
them, error replies raised as redis-py's errors, replies kept in order when a caller is cancelled, a lost connection
failing its commands in flight and the next command reconnecting, and the URL's database selected."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from fleet.store.resp import RespConnection

pytestmark = pytest.mark.redis


async def test_replies_and_errors_are_redis_pys(redis_url: str) -> None:
    conn = RespConnection(redis_url)
    key = f"resp-test:{uuid.uuid4().hex}"
    try:
        assert await conn.call("SET", key, "v") == "OK"
        assert await conn.call("EVAL", "return {1, 'two', {3}}", 0) == [1, "two", [3]]
        replies = await conn.pipeline([("SET", key, "1"), ("INCR", key), ("HGET", key, "f"), ("GET", key)])
        assert replies[:2] == ["OK", 2]
        assert isinstance(replies[2], ResponseError)  # a wrong-type error in its place, the others answered
        assert replies[3] == "2"
        with pytest.raises(NoScriptError):
            await conn.call("EVALSHA", "0" * 40, 0)
        with pytest.raises(ResponseError):
            await conn.call("NOSUCHCOMMAND")
    finally:
        await conn.call("DEL", key)
        await conn.close()


async def test_a_cancelled_caller_leaves_the_replies_in_order(redis_url: str) -> None:
    conn = RespConnection(redis_url)
    try:
        await conn.call("PING")
        cancelled = asyncio.ensure_future(conn.call("ECHO", "mine"))
        await asyncio.sleep(0)  # written, its reply not read yet
        cancelled.cancel()
        assert await conn.call("ECHO", "next") == "next"  # not the cancelled caller's "mine"
        assert cancelled.cancelled()
    finally:
        await conn.close()


async def test_a_lost_connection_fails_in_flight_and_the_next_command_reconnects(redis_url: str) -> None:
    conn = RespConnection(redis_url)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        client_id = await conn.call("CLIENT", "ID")
        blocked = asyncio.ensure_future(conn.call("BLPOP", f"resp-test:{uuid.uuid4().hex}", 30))
        for _ in range(500):  # until Redis holds it blocked
            if int((await admin.info("clients"))["blocked_clients"]) >= 1:
                break
            await asyncio.sleep(0.01)
        assert await admin.client_kill_filter(_id=client_id) == 1
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(blocked, timeout=10)
        assert await conn.call("PING") == "PONG"  # a new connection
        assert await conn.call("CLIENT", "ID") != client_id
    finally:
        await admin.aclose()
        await conn.close()


async def test_the_urls_database_is_selected(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    conn = RespConnection(f"{base}/3")
    other = aioredis.Redis.from_url(f"{base}/3", decode_responses=True)
    key = f"resp-test:{uuid.uuid4().hex}"
    try:
        await conn.call("SET", key, "in-3")
        assert await other.get(key) == "in-3"
    finally:
        await other.delete(key)
        await other.aclose()
        await conn.close()


def test_it_runs_on_uvloop_as_the_gateway_does(redis_url: str) -> None:
    async def round_trip() -> list[object]:
        conn = RespConnection(redis_url)
        try:
            return [await conn.call("ECHO", "one"), *(await conn.pipeline([("ECHO", "two"), ("ECHO", "three")]))]
        finally:
            await conn.close()

    assert uvloop.run(round_trip()) == ["one", "two", "three"]
