"""Publisher and subscriber drivers for the ``messages`` benchmark: SMQP, RabbitMQ, NATS
JetStream and MQTT (Mosquitto, a reference whose semantics differ: see :mod:`bench.messages`).

Both brokers are driven with the same semantics so that their figures compare:

* **Publisher with confirms.** :meth:`Publisher.publish` queues one message (a token chosen by
  the caller identifies it); :meth:`Publisher.flush` sends what was queued. The driver calls
  ``on_confirm(token, ok, detail)`` once per message when the broker confirms it: for SMQP
  the ``200-OK`` / ``200 <cmuid> <smuid>`` reply (sent only after the commit, profile §6),
  for RabbitMQ a publisher-confirm ``basic.ack`` (``basic.nack`` is ``ok=False``). How many
  messages are in flight is up to the caller (the benchmark's window ``W``).
* **Subscriber with manual ACK, one unacknowledged message.** The driver calls
  ``on_message(body, received_ns)`` for every delivery, then acknowledges it: SMQP answers
  ``NOTIFY MESSAGE`` with ``310 ACK`` and the server sends the next NOTIFY only after its own
  ``310 ACK`` (profile §6/§8); RabbitMQ consumes with ``prefetch_count=1`` and ``basic.ack``.
* **Durable.** SMQP stores every message in its database before confirming. RabbitMQ gets a
  durable queue and persistent messages (``delivery_mode=2``) on the default exchange.

The drivers are asyncio-based and run inside one event loop each; :attr:`failure` holds the
exception that broke a connection (the caller polls it).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import SMQPClient, SMQPCommandError, SMQPProtocolError

ConfirmCallback = Callable[[int, bool, str], None]
MessageCallback = Callable[[bytes, int], None]

REPLY_TIMEOUT = 30.0
CONTENT_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*(\d+)[ \t]*\r$",
                            re.IGNORECASE | re.MULTILINE)
#: Bytes asked of the socket at once by a subscriber's reader.
READ_CHUNK = 256 * 1024


def _ignore_confirm(token: int, ok: bool, detail: str) -> None:
    return None


@dataclass(frozen=True)
class BrokerSpec:
    """How a worker process reaches a broker (picklable).

    ``kind`` is ``smqp`` or ``rabbitmq``. For SMQP, ``target`` is a topic and the accounts are
    ``publisher_user_prefix + i`` and ``subscriber_user``; for RabbitMQ, ``target`` is a queue
    name and ``user`` / ``password`` are the AMQP credentials.
    """

    kind: str
    host: str
    port: int
    target: str
    password: str = "pw"
    publisher_user_prefix: str = "benchpub"
    subscriber_user: str = "benchsub"
    user: str = "guest"
    vhost: str = "/"
    #: SMQP over TLS (SMQPS): the CA file that signed the server's certificate.
    tls_ca: str = ""
    #: Deliveries a subscriber may hold unacknowledged: RabbitMQ's prefetch, the NATS pull
    #: batch, SMQP's SET NOTIFY WINDOW (1: the draft's behaviour; MQTT: the broker's in-flight
    #: limit).
    window: int = 1

    @property
    def label(self) -> str:
        return self.kind


class Publisher(ABC):
    """A publishing connection with publisher confirms."""

    def __init__(self) -> None:
        self.on_confirm: ConfirmCallback = _ignore_confirm
        self.failure: BaseException | None = None

    @abstractmethod
    async def connect(self) -> None:
        """Connect, authenticate and get ready to publish."""

    @abstractmethod
    def publish(self, token: int, body: bytes) -> None:
        """Queue one persistent message; :meth:`flush` sends it."""

    @abstractmethod
    async def flush(self) -> None:
        """Send what :meth:`publish` queued (and apply the transport's back-pressure)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection (best effort)."""


class Subscriber(ABC):
    """A consuming connection: manual ACK, one unacknowledged message at a time."""

    def __init__(self) -> None:
        #: Where deliveries go: held until :meth:`listen` names a callback.
        self.on_message: MessageCallback = self._hold
        self._held: list[tuple[bytes, int]] = []
        self.failure: BaseException | None = None
        #: ACKs the broker refused (SMQP: a reply other than ``310 ACK``).
        self.ack_errors = 0
        self.ack_error_samples: list[str] = []

    def _hold(self, body: bytes, received_ns: int) -> None:
        self._held.append((body, received_ns))

    def listen(self, callback: MessageCallback) -> None:
        """Deliveries go to ``callback`` from now on, and those that came before (after
        :meth:`connect`, while the caller was not listening yet) go to it first: each was
        ACKed when it came, so none may be dropped."""
        held, self._held = self._held, []
        self.on_message = callback
        for body, received_ns in held:
            callback(body, received_ns)

    @abstractmethod
    async def connect(self) -> None:
        """Connect, authenticate and subscribe; deliveries may start right after."""

    @abstractmethod
    async def close(self) -> None:
        """Stop consuming, undo the subscription where that is needed, close."""


# ================================================================================== SMQP


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Stop a connection's reader task and wait until it has stopped."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


class SubscriberFramer:
    """Frames what a subscribing connection receives, a chunk at a time: ``("message",
    first section's data)`` per NOTIFY MESSAGE (its header up to the empty line, its data
    sections by Content-Length, then ``.``), ``("ack", b"")`` per ``310 ACK``, ``("notify",
    b"")`` per other notification (up to its empty line), ``("reply", line)`` for any other
    line. A few ``find`` calls per message, not a ``readline`` per line: the subscriber's own
    time is part of every NOTIFY / ACK round trip."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        buffer = self._buffer
        buffer += data
        events: list[tuple[str, bytes]] = []
        start = 0
        while True:
            event, end = self._next(buffer, start)
            if event is None:
                break
            events.append(event)
            start = end
        del buffer[:start]
        return events

    @staticmethod
    def _next(buffer: bytearray, start: int) -> tuple[tuple[str, bytes] | None, int]:
        """The event that starts at ``start`` and where it ends; (None, start): incomplete."""
        eol = buffer.find(b"\r\n", start)
        if eol < 0:
            return None, start
        if eol == start:  # a stray empty line
            return ("empty", b""), eol + 2
        line = bytes(buffer[start:eol])
        if line.startswith(b"310 "):
            return ("ack", b""), eol + 2
        if not line.startswith(b"NOTIFY "):
            return ("reply", line), eol + 2
        end = buffer.find(b"\r\n\r\n", start)  # the notification's line and header
        if end < 0:
            return None, start
        pos = end + 4
        if not line.startswith(b"NOTIFY MESSAGE"):
            return ("notify", b""), pos
        first: bytes | None = None
        while True:
            if len(buffer) < pos + 3:
                return None, start
            if buffer[pos:pos + 3] == b".\r\n":
                return ("message", first if first is not None else b""), pos + 3
            end = buffer.find(b"\r\n\r\n", pos)  # a data header
            if end < 0:
                return None, start
            match = CONTENT_LENGTH.search(buffer, pos, end + 2)
            if match is None:
                raise SMQPProtocolError("data section without Content-Length")
            data_start = end + 4
            data_end = data_start + int(match[1])
            if len(buffer) < data_end + 2:
                return None, start
            if buffer[data_end:data_end + 2] != b"\r\n":
                raise SMQPProtocolError("data section not followed by CRLF")
            if first is None:
                first = bytes(buffer[data_start:data_end])
            pos = data_end + 2


class SMQPPublisher(Publisher):
    """``PUB MESSAGE <topic> <cmuid>`` with one ``application/octet-stream`` data section.

    The cmuid is ``p<index>n<token>``; the reply's cmuid is checked against it (the server
    answers pipelined publishes in order).
    """

    def __init__(self, spec: BrokerSpec, index: int) -> None:
        super().__init__()
        self.spec = spec
        self.index = index
        self.user = f"{spec.publisher_user_prefix}{index}"
        self._client: SMQPClient | None = None
        self._buffer = bytearray()
        self._pending: deque[tuple[int, str]] = deque()
        self._reader_task: asyncio.Task[None] | None = None
        self._prefix = f"PUB MESSAGE {spec.target} ".encode()

    async def connect(self) -> None:
        client = await SMQPClient.connect(self.spec.host, self.spec.port,
                                            tls_ca=self.spec.tls_ca)
        self._client = client
        await asyncio.wait_for(client.login(self.user, self.spec.password), REPLY_TIMEOUT)
        self._reader_task = asyncio.create_task(self._read_replies())

    def publish(self, token: int, body: bytes) -> None:
        cmuid = f"p{self.index}n{token}"
        self._buffer += b"%s%s\r\n\r\nContent-Type: application/octet-stream\r\n" \
                        b"Content-Length: %d\r\n\r\n%s\r\n.\r\n" % (
                            self._prefix, cmuid.encode(), len(body), body)
        self._pending.append((token, cmuid))

    async def flush(self) -> None:
        assert self._client is not None
        if self._buffer:
            self._client.writer.write(bytes(self._buffer))
            self._buffer.clear()
        await self._client.writer.drain()

    async def _read_replies(self) -> None:
        assert self._client is not None
        reader = self._client.reader
        lines: list[bytes] = []
        try:
            while True:
                line = await reader.readline()
                if not line:
                    raise SMQPProtocolError("connection closed by the server")
                if not lines and line.startswith(b"NOTIFY "):
                    await self._skip_notification(reader, line)
                    continue
                if not lines and line in (b"\r\n", b"\n"):
                    continue
                lines.append(line)
                if line[3:4] == b"-":
                    continue  # "200-OK": the reply goes on
                self._settle(lines)
                lines = []
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc

    def _settle(self, lines: list[bytes]) -> None:
        last = lines[-1].rstrip(b"\r\n").decode("utf-8", "replace")
        if not self._pending:
            self.failure = SMQPProtocolError(f"reply without a publish: {lines!r}")
            return
        token, cmuid = self._pending.popleft()
        if last.startswith("200 ") and len(lines) == 2:
            got = last[4:].split()
            if len(got) == 2 and got[0] == cmuid and got[1].isdigit():
                self.on_confirm(token, True, "")
                return
            self.on_confirm(token, False, f"unexpected confirm {last!r} for cmuid {cmuid}")
            return
        self.on_confirm(token, False, " | ".join(
            raw.rstrip(b"\r\n").decode("utf-8", "replace") for raw in lines))

    @staticmethod
    async def _skip_notification(reader: asyncio.StreamReader, first: bytes) -> None:
        """A publisher subscribes to nothing, but frame any notification correctly."""
        if first.split()[1:2] == [b"MESSAGE"]:
            raise SMQPProtocolError(f"NOTIFY MESSAGE on a publishing connection: {first!r}")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass

    async def close(self) -> None:
        await _cancel(self._reader_task)
        if self._client is not None:
            await self._client.close()


class SMQPSubscriber(Subscriber):
    """``SUB MESSAGE <topic>``; every ``NOTIFY MESSAGE`` is answered with ``310 ACK``. With a
    window above 1 (``SET NOTIFY WINDOW``, profile §9.7) the ACKs stay bare: each answers the
    oldest unacknowledged message, which is the one just received, as they come in order."""

    def __init__(self, spec: BrokerSpec) -> None:
        super().__init__()
        self.spec = spec
        self._client: SMQPClient | None = None
        self._reader_task: asyncio.Task[None] | None = None
        #: ``310 ACK`` answers of the server (each ends one delivery).
        self.acks_confirmed = 0

    async def connect(self) -> None:
        client = await SMQPClient.connect(self.spec.host, self.spec.port,
                                            tls_ca=self.spec.tls_ca)
        self._client = client
        await asyncio.wait_for(client.login(self.spec.subscriber_user, self.spec.password),
                               REPLY_TIMEOUT)
        reply = await asyncio.wait_for(client.command(f"SUB MESSAGE {self.spec.target}"),
                                       REPLY_TIMEOUT)
        if not reply.ok:
            raise SMQPCommandError(f"SUB MESSAGE {self.spec.target}", reply)
        if self.spec.window > 1:
            line = f"SET NOTIFY WINDOW {self.spec.window}"
            reply = await asyncio.wait_for(client.command(line), REPLY_TIMEOUT)
            if not reply.ok:
                raise SMQPCommandError(line, reply)
        self._reader_task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self._client is not None
        reader, writer = self._client.reader, self._client.writer
        framer = SubscriberFramer()
        try:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    raise SMQPProtocolError("connection closed by the server")
                for kind, value in framer.feed(data):
                    if kind == "message":
                        self.on_message(value, time.perf_counter_ns())
                        writer.write(b"310 ACK\r\n")
                    elif kind == "ack":
                        self.acks_confirmed += 1
                    elif kind == "reply":  # an answer to our 310 ACK that is not 310
                        self.ack_errors += 1
                        if len(self.ack_error_samples) < 5:
                            self.ack_error_samples.append(value.decode("utf-8", "replace"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc

    async def close(self) -> None:
        await _cancel(self._reader_task)
        if self._client is not None:
            client = self._client
            with contextlib.suppress(Exception):
                # Subscriptions belong to the account: leave none behind. Any NOTIFY that
                # still arrives is skipped (and so never ACKed) by read_reply.
                await asyncio.wait_for(client.command(f"UNSUB MESSAGE {self.spec.target}"), 10)
            await client.quit()


# ============================================================================== RabbitMQ


def _pika_parameters(spec: BrokerSpec) -> Any:
    import pika

    return pika.ConnectionParameters(
        host=spec.host, port=spec.port, virtual_host=spec.vhost,
        credentials=pika.PlainCredentials(spec.user, spec.password),
        heartbeat=0, blocked_connection_timeout=None,
    )


async def _pika_open(spec: BrokerSpec, on_lost: Callable[[BaseException], None]) -> Any:
    """An open pika ``AsyncioConnection`` and a channel on it, in the running loop."""
    from pika.adapters.asyncio_connection import AsyncioConnection

    loop = asyncio.get_running_loop()
    opened: asyncio.Future[Any] = loop.create_future()

    def on_open(connection: Any) -> None:
        if not opened.done():
            opened.set_result(connection)

    def on_open_error(connection: Any, error: BaseException | str) -> None:
        if not opened.done():
            opened.set_exception(
                error if isinstance(error, BaseException) else ConnectionError(str(error)))

    def on_close(connection: Any, reason: BaseException) -> None:
        on_lost(reason)

    AsyncioConnection(_pika_parameters(spec), on_open_callback=on_open,
                      on_open_error_callback=on_open_error, on_close_callback=on_close,
                      custom_ioloop=loop)
    connection = await asyncio.wait_for(opened, REPLY_TIMEOUT)
    channel_ready: asyncio.Future[Any] = loop.create_future()
    connection.channel(on_open_callback=channel_ready.set_result)
    channel = await asyncio.wait_for(channel_ready, REPLY_TIMEOUT)
    return connection, channel


async def _pika_rpc(start: Callable[[Callable[[Any], None]], None]) -> Any:
    """Call a pika method that takes ``callback=``; wait for its reply frame."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def callback(frame: Any) -> None:
        if not done.done():
            done.set_result(frame)

    start(callback)
    return await asyncio.wait_for(done, REPLY_TIMEOUT)


async def _pika_close(connection: Any) -> None:
    if connection is None or connection.is_closed:
        return
    with contextlib.suppress(Exception):
        connection.close()
        for _ in range(200):
            if connection.is_closed:
                break
            await asyncio.sleep(0.01)


class RabbitPublisher(Publisher):
    """``basic.publish`` to the default exchange, routing key = queue, ``delivery_mode=2``,
    on a channel in confirm mode."""

    def __init__(self, spec: BrokerSpec, index: int) -> None:
        super().__init__()
        self.spec = spec
        self.index = index
        self._connection: Any = None
        self._channel: Any = None
        self._tags: OrderedDict[int, int] = OrderedDict()  # delivery tag -> token
        self._next_tag = 0
        self._properties: Any = None

    def _lost(self, reason: BaseException) -> None:
        if self.failure is None:
            self.failure = ConnectionError(f"RabbitMQ connection closed: {reason!r}")

    async def connect(self) -> None:
        import pika

        self._connection, self._channel = await _pika_open(self.spec, self._lost)
        self._properties = pika.BasicProperties(delivery_mode=2,
                                                content_type="application/octet-stream")
        await _pika_rpc(lambda cb: self._channel.confirm_delivery(self._on_ack_nack,
                                                                  callback=cb))

    def publish(self, token: int, body: bytes) -> None:
        self._channel.basic_publish(exchange="", routing_key=self.spec.target, body=body,
                                    properties=self._properties)
        self._next_tag += 1
        self._tags[self._next_tag] = token

    async def flush(self) -> None:
        # pika buffers the frames and writes them when the socket is writable, i.e. as soon
        # as this task yields to the loop; yield once so a burst leaves together.
        await asyncio.sleep(0)

    def _on_ack_nack(self, frame: Any) -> None:
        import pika

        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        detail = "" if ok else f"basic.nack delivery_tag={method.delivery_tag}"
        tag = method.delivery_tag
        if method.multiple:
            while self._tags:
                first = next(iter(self._tags))
                if first > tag:
                    break
                self.on_confirm(self._tags.pop(first), ok, detail)
        else:
            token = self._tags.pop(tag, None)
            if token is not None:
                self.on_confirm(token, ok, detail)

    async def close(self) -> None:
        await _pika_close(self._connection)


class RabbitSubscriber(Subscriber):
    """``basic.qos(prefetch_count=spec.window)`` + ``basic.consume(auto_ack=False)``;
    ``basic.ack`` after each delivery was handled."""

    def __init__(self, spec: BrokerSpec) -> None:
        super().__init__()
        self.spec = spec
        self._connection: Any = None
        self._channel: Any = None
        self.redelivered = 0

    def _lost(self, reason: BaseException) -> None:
        if self.failure is None:
            self.failure = ConnectionError(f"RabbitMQ connection closed: {reason!r}")

    async def connect(self) -> None:
        self._connection, self._channel = await _pika_open(self.spec, self._lost)
        await _pika_rpc(lambda cb: self._channel.basic_qos(prefetch_count=self.spec.window,
                                                           callback=cb))
        await _pika_rpc(lambda cb: self._channel.basic_consume(
            self.spec.target, self._on_delivery, auto_ack=False, callback=cb))

    def _on_delivery(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        received = time.perf_counter_ns()
        if method.redelivered:
            self.redelivered += 1
        self.on_message(body, received)
        channel.basic_ack(method.delivery_tag)

    async def close(self) -> None:
        await _pika_close(self._connection)


# ======================================================================== NATS JetStream


def nats_names(target: str) -> tuple[str, str]:
    """(stream, subject) of a NATS target: the stream holds the one subject."""
    token = re.sub(r"[^A-Za-z0-9]", "", target)
    return f"SMQPBENCH{token}", f"smqpbench.{token}"


class NatsPublisher(Publisher):
    """``js.publish_async`` to the target's stream; a message is confirmed by the stream's
    ``PubAck`` (JetStream answers after storing it; file storage)."""

    def __init__(self, spec: BrokerSpec, index: int) -> None:
        super().__init__()
        self.spec = spec
        self.index = index
        self._nc: Any = None
        self._js: Any = None
        self._queued: list[tuple[int, bytes]] = []
        self._subject = nats_names(spec.target)[1]

    async def connect(self) -> None:
        import nats

        self._nc = await nats.connect(f"nats://{self.spec.host}:{self.spec.port}",
                                      allow_reconnect=False)
        self._js = self._nc.jetstream(publish_async_max_pending=100_000)

    def publish(self, token: int, body: bytes) -> None:
        self._queued.append((token, body))

    async def flush(self) -> None:
        queued, self._queued = self._queued, []
        for token, body in queued:
            future = await self._js.publish_async(self._subject, body)
            future.add_done_callback(lambda f, token=token: self._settle(token, f))
        await asyncio.sleep(0)

    def _settle(self, token: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            self.on_confirm(token, False, "cancelled")
        elif future.exception() is not None:
            self.on_confirm(token, False, repr(future.exception()))
        else:
            self.on_confirm(token, True, "")

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()


class NatsSubscriber(Subscriber):
    """A durable pull consumer with explicit ack on the target's work-queue stream:
    ``fetch(spec.window)``, then ``ack()`` each message (not confirmed by the server, as
    RabbitMQ's ``basic.ack`` is not)."""

    def __init__(self, spec: BrokerSpec) -> None:
        super().__init__()
        self.spec = spec
        self._nc: Any = None
        self._task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        import nats

        stream, subject = nats_names(self.spec.target)
        self._nc = await nats.connect(f"nats://{self.spec.host}:{self.spec.port}",
                                      allow_reconnect=False)
        sub = await self._nc.jetstream().pull_subscribe(subject, durable="bench",
                                                        stream=stream)
        self._task = asyncio.create_task(self._loop(sub))

    async def _loop(self, sub: Any) -> None:
        import nats

        try:
            while True:
                try:
                    messages = await sub.fetch(self.spec.window, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                for message in messages:
                    self.on_message(message.data, time.perf_counter_ns())
                    await message.ack()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failure = exc

    async def close(self) -> None:
        await _cancel(self._task)
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()


async def _nats_admin(spec: BrokerSpec, work: Callable[[Any], Any]) -> Any:
    import nats

    nc = await nats.connect(f"nats://{spec.host}:{spec.port}", allow_reconnect=False,
                            connect_timeout=5, max_reconnect_attempts=0)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def nats_declare(spec: BrokerSpec) -> None:
    """A fresh work-queue stream (file storage) and its durable pull consumer (explicit
    ack) for ``spec.target`` (blocking; from the coordinator)."""
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

    stream, subject = nats_names(spec.target)

    async def work(js: Any) -> None:
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[subject],
                            retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE)
        await js.add_consumer(stream, ConsumerConfig(
            durable_name="bench", ack_policy=AckPolicy.EXPLICIT, ack_wait=60,
            max_ack_pending=-1))

    asyncio.run(_nats_admin(spec, work))


def nats_count_and_delete(spec: BrokerSpec) -> int | None:
    """Messages left in the stream, then delete it; None on error."""
    stream = nats_names(spec.target)[0]

    async def work(js: Any) -> int:
        try:
            return (await js.stream_info(stream)).state.messages
        finally:
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)

    try:
        return asyncio.run(_nats_admin(spec, work))
    except Exception:
        return None


def nats_check(spec: BrokerSpec) -> str | None:
    """None when NATS answers with JetStream enabled; else why not."""

    async def work(js: Any) -> None:
        await js.account_info()

    try:
        asyncio.run(_nats_admin(spec, work))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ============================================================================ MQTT (QoS 1)


def _mqtt_client(client_id: str, clean: bool) -> Any:
    import paho.mqtt.client as mqtt

    return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                       clean_session=clean, protocol=mqtt.MQTTv311)


async def _mqtt_connect(client: Any, spec: BrokerSpec) -> None:
    """Connect and run paho's network loop in its thread; return once CONNACK came."""
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[None] = loop.create_future()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any,
                   properties: Any) -> None:
        def settle() -> None:
            if connected.done():
                return
            if reason.is_failure:
                connected.set_exception(ConnectionError(f"MQTT CONNACK {reason}"))
            else:
                connected.set_result(None)
        loop.call_soon_threadsafe(settle)

    client.on_connect = on_connect
    client.connect(spec.host, spec.port, keepalive=60)
    client.loop_start()
    await asyncio.wait_for(connected, REPLY_TIMEOUT)


class MqttPublisher(Publisher):
    """QoS 1 ``PUBLISH`` to the target topic; confirmed by the broker's ``PUBACK``. Paho's
    network loop runs in its own thread and hands the PUBACKs to the event loop."""

    def __init__(self, spec: BrokerSpec, index: int) -> None:
        super().__init__()
        self.spec = spec
        self._client = _mqtt_client(f"bench-pub{index}-{spec.target.replace('/', '-')}", True)
        self._tokens: dict[int, int] = {}  # mid -> token

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self._client.max_inflight_messages_set(65535)  # the caller keeps the window
        self._client.max_queued_messages_set(0)

        def on_publish(client: Any, userdata: Any, mid: int, reason: Any,
                       properties: Any) -> None:
            loop.call_soon_threadsafe(self._settle, mid)

        def on_disconnect(client: Any, userdata: Any, flags: Any, reason: Any,
                          properties: Any) -> None:
            if self.failure is None:
                self.failure = ConnectionError(f"MQTT disconnected: {reason}")

        self._client.on_publish = on_publish
        self._client.on_disconnect = on_disconnect
        await _mqtt_connect(self._client, self.spec)

    def publish(self, token: int, body: bytes) -> None:
        info = self._client.publish(self.spec.target, body, qos=1)
        self._tokens[info.mid] = token  # its PUBACK is handled in this loop, after this

    def _settle(self, mid: int) -> None:
        token = self._tokens.pop(mid, None)
        if token is not None:
            self.on_confirm(token, True, "")

    async def flush(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.on_disconnect = None
            self._client.disconnect()
            self._client.loop_stop()


class MqttSubscriber(Subscriber):
    """A persistent session (clean session off) subscribed at QoS 1; paho sends the
    ``PUBACK`` once the message callback returned."""

    def __init__(self, spec: BrokerSpec) -> None:
        super().__init__()
        self.spec = spec
        self._client = _mqtt_client(f"bench-sub-{spec.target.replace('/', '-')}", False)

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        subscribed: asyncio.Future[None] = loop.create_future()

        def on_message(client: Any, userdata: Any, message: Any) -> None:
            loop.call_soon_threadsafe(self.on_message, message.payload,
                                      time.perf_counter_ns())

        def on_subscribe(client: Any, userdata: Any, mid: int, reasons: Any,
                         properties: Any) -> None:
            loop.call_soon_threadsafe(lambda: subscribed.done() or subscribed.set_result(None))

        def on_disconnect(client: Any, userdata: Any, flags: Any, reason: Any,
                          properties: Any) -> None:
            if self.failure is None:
                self.failure = ConnectionError(f"MQTT disconnected: {reason}")

        self._client.on_message = on_message
        self._client.on_subscribe = on_subscribe
        self._client.on_disconnect = on_disconnect
        await _mqtt_connect(self._client, self.spec)
        self._client.subscribe(self.spec.target, qos=1)
        await asyncio.wait_for(subscribed, REPLY_TIMEOUT)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.on_disconnect = None
            self._client.unsubscribe(self.spec.target)
            self._client.disconnect()
            self._client.loop_stop()


# ============================================================================== factory

PUBLISHERS: dict[str, Callable[[BrokerSpec, int], Publisher]] = {
    "smqp": SMQPPublisher, "rabbitmq": RabbitPublisher, "nats": NatsPublisher,
    "mqtt": MqttPublisher}
SUBSCRIBERS: dict[str, Callable[[BrokerSpec], Subscriber]] = {
    "smqp": SMQPSubscriber, "rabbitmq": RabbitSubscriber, "nats": NatsSubscriber,
    "mqtt": MqttSubscriber}


def make_publisher(spec: BrokerSpec, index: int) -> Publisher:
    if spec.kind not in PUBLISHERS:
        raise ValueError(f"unknown broker kind {spec.kind!r}")
    return PUBLISHERS[spec.kind](spec, index)


def make_subscriber(spec: BrokerSpec) -> Subscriber:
    if spec.kind not in SUBSCRIBERS:
        raise ValueError(f"unknown broker kind {spec.kind!r}")
    return SUBSCRIBERS[spec.kind](spec)


# ======================================================= RabbitMQ queue admin (blocking)


def rabbit_declare(spec: BrokerSpec) -> None:
    """Declare ``spec.target`` as a fresh durable queue (blocking; from the coordinator)."""
    import pika

    connection = pika.BlockingConnection(_pika_parameters(spec))
    try:
        channel = connection.channel()
        channel.queue_delete(queue=spec.target)
        channel.queue_declare(queue=spec.target, durable=True)
    finally:
        connection.close()


def rabbit_count_and_delete(spec: BrokerSpec) -> int | None:
    """Messages left in the queue (ready + unacknowledged), then delete it; None on error."""
    import pika

    count: int | None = None
    try:
        connection = pika.BlockingConnection(_pika_parameters(spec))
    except Exception:
        return None
    try:
        channel = connection.channel()
        with contextlib.suppress(Exception):
            ok = channel.queue_declare(queue=spec.target, passive=True)
            count = ok.method.message_count
        with contextlib.suppress(Exception):
            channel.queue_delete(queue=spec.target)
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    return count


def rabbit_check(spec: BrokerSpec) -> str | None:
    """None when RabbitMQ accepts a connection with ``spec``'s credentials; else why not."""
    import pika

    try:
        connection = pika.BlockingConnection(_pika_parameters(spec))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):
        connection.close()
    return None
