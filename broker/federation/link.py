"""One federation link's session with its peer (profile §9.5): an SMQP client, speaking
through the project's sans-IO client (:class:`broker.smqp.ClientConnection`) over asyncio
streams, plain or SMQPS.

Per session: the greeting, ``LOGIN <account> CLEAR/1.0`` and ``PASS``; then, side by side,
the interest (SUBSCRIBE / UNSUBSCRIBE MESSAGE on the peer for what subscribers here want
below ``/<link-name>/``, :func:`broker.services.federation.interest`), the incoming
messages (stored or dropped by :func:`~broker.services.federation.accept_forwarded_batch`
before their ``310 ACK``: the peer counts them forwarded only then), and a NOOP when the
line has been quiet, to find a peer that vanished without closing.

Up to ``SMQP_LINK_WINDOW`` messages are in flight (``SET NOTIFY WINDOW``, profile §9.7, when
the login reply names a ``Max-Window``): what has arrived when the link is free is stored
in one transaction, in the order the peer sent it, then each is ACKed by its smuid. A copy
the peer sends again (its ACK lost with a session) is dropped as a duplicate by its origin.
A session that fails is started again after a backoff that doubles up to
``SMQP_LINK_BACKOFF_MAX`` seconds.

The peer answers each ``310 ACK`` in turn with the commands' replies. An ACK it refuses for
that message alone (409: it holds no such message any more, given up or its lock ended; 404)
is counted and the session goes on: a restart would only send the rest of the window again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections import deque
from dataclasses import dataclass

from django.conf import settings

from broker.domain.values import parse_topic_pattern
from broker.models import Link
from broker.services import ServiceError
from broker.services import federation as rules
from broker.smqp import (
    CLOSED,
    NEED_DATA,
    ClientConnection,
    Greeting,
    NotifyMessage,
    NotifyServer,
    ProtocolError,
    Reply,
    ServerAck,
)
from broker.smqp.commands import (
    Ack,
    Login,
    Noop,
    Pass,
    Quit,
    SetNotifyWindow,
    Subscribe,
    Unsubscribe,
)
from broker.store import dbthread

logger = logging.getLogger("broker.federation")

#: How often the link looks at the subscriptions here for a change of interest.
INTEREST_POLL_SECONDS = 0.5
#: A subscription the peer refused is asked for again after this long (a right granted
#: there meanwhile).
REFUSED_RETRY_SECONDS = 5.0
#: A reply not come by then: the peer is taken for gone.
REPLY_TIMEOUT_SECONDS = 30.0


async def _db(fn, *args):
    """``fn(*args)`` on the database thread (the listener's: one connection, one thread)."""
    return await dbthread.run(fn, *args)


class LinkError(Exception):
    """The session cannot go on (refused login, broken framing, a peer gone quiet)."""


#: Answers to a link's ``310 ACK`` about that message alone (profile §9.7): nothing to
#: acknowledge for it any more on the peer, which has already let it go.
ACK_REFUSALS = frozenset({404, 409})


@dataclass(frozen=True)
class _AckSent:
    """A ``310 ACK`` waiting for its answer in the reply order (``smuid`` None: bare)."""

    smuid: int | None


@dataclass(frozen=True)
class LinkConfig:
    """A link's row as the supervisor read it; a change of any field restarts the session."""

    id: int
    name: str
    host: str
    port: int
    tls: bool
    tls_ca: str
    tls_server_name: str
    account: str
    password: str
    imports: str
    subscribed: str

    @classmethod
    def of(cls, link: Link) -> LinkConfig:
        return cls(link.pk, link.name, link.host, link.port, link.tls, link.tls_ca,
                   link.tls_server_name, link.account, link.password, link.imports,
                   link.subscribed)

    def same_settings(self, other: LinkConfig) -> bool:
        """Equal but for what the session itself writes (``subscribed``)."""
        return self == LinkConfig(**{**other.__dict__, "subscribed": self.subscribed})


class LinkSession:
    """Keeps one link's session up, for as long as :meth:`run` is not cancelled."""

    def __init__(self, config: LinkConfig) -> None:
        self.config = config
        self.imports = rules.parse_imports(config.imports)
        # What the peer holds for us: durable subscriptions outlive the session, so this is
        # remembered in the link's row (what to withdraw after a restart).
        self.subscribed: set[str] = {s for s in config.subscribed.split("\n") if s}
        self.stored = 0
        self.dropped = 0
        self.acks_refused = 0  # over the link's life, in its log lines
        self._conn: ClientConnection | None = None
        self._writer: asyncio.StreamWriter | None = None
        # What waits for the peer's next reply, in the order sent: a command's future, or
        # an ACK (answered ``310 ACK``, or refused).
        self._replies: deque[asyncio.Future[Reply] | _AckSent] = deque()
        self._incoming: asyncio.Queue[NotifyMessage] = asyncio.Queue()
        self._greeting: asyncio.Future[Greeting] | None = None
        self._quiet_since = 0.0
        self.window = 1  # messages the peer may have in flight to this session
        self._logged_in = False
        self._withdrawing = False
        # Patterns the peer refused (no right there, say), and when to ask again.
        self._refused: dict[str, float] = {}

    # ------------------------------------------------------------------- supervision

    async def run(self) -> None:
        attempt = 0
        await _db(rules.prepare_link_topics, self.config.name, self.imports)
        while True:
            await self._state(Link.State.CONNECTING)
            try:
                await self._session()
                error = "the peer closed the connection"
            except asyncio.CancelledError:
                raise
            except (OSError, LinkError, ProtocolError, TimeoutError, ServiceError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug: said in the log, and the link tries again
                logger.exception("link %s failed", self.config.name)
                error = f"{type(exc).__name__}: {exc}"
            finally:
                await self._flush_counts()
            if self._logged_in:
                attempt = 0
            attempt += 1
            delay = min(settings.SMQP_LINK_BACKOFF_MAX, 0.25 * 2 ** min(attempt, 10))
            delay *= random.uniform(0.5, 1.0)  # peers restarted together do not retry in step
            logger.warning("link %s: %s; again in %.1fs", self.config.name, error, delay)
            await self._state(Link.State.DOWN, error)
            await asyncio.sleep(delay)

    async def _state(self, state: str, error: str | None = None) -> None:
        await _db(rules.record_state, self.config.id, state, error)

    async def _flush_counts(self) -> None:
        stored, dropped, self.stored, self.dropped = self.stored, self.dropped, 0, 0
        await _db(rules.record_counts, self.config.id, stored, dropped,
                  sorted(self.subscribed, key=str.casefold))

    # ------------------------------------------------------------------- one session

    async def _session(self) -> None:
        cfg = self.config
        self._logged_in = False
        context = None
        if cfg.tls:
            context = ssl.create_default_context(cafile=cfg.tls_ca or None)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            cfg.host, cfg.port, ssl=context,
            server_hostname=(cfg.tls_server_name or cfg.host) if context else None),
            REPLY_TIMEOUT_SECONDS)
        self._conn = ClientConnection()
        self._writer = writer
        self._replies.clear()
        self._incoming = asyncio.Queue()
        self._greeting = asyncio.get_running_loop().create_future()
        pump = asyncio.create_task(self._pump(reader))
        tasks: list[asyncio.Task] = [pump]
        try:
            greeting = await asyncio.wait_for(self._greeting, REPLY_TIMEOUT_SECONDS)
            if not greeting.ready:
                raise LinkError("the peer is not available")
            await self._expect(Login(cfg.account, "CLEAR", "1.0"), "LOGIN")
            logged_in = await self._expect(Pass(cfg.account, cfg.password), "PASS")
            self._logged_in = True
            await self._ask_window(logged_in)
            await self._state(Link.State.UP, "")
            logger.info("link %s up (%s:%s)", cfg.name, cfg.host, cfg.port)
            tasks += [asyncio.create_task(self._receive()),
                      asyncio.create_task(self._interest())]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # raise what ended it
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            for fut in self._replies:
                if isinstance(fut, asyncio.Future):
                    fut.cancel()
            self._replies.clear()
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)

    async def withdraw(self) -> None:
        """The link was removed: UNSUBSCRIBE on the peer what it holds there, so the peer
        stops keeping messages for it (best-effort, while the session is up)."""
        self._withdrawing = True
        if not self._logged_in or self._writer is None or self._writer.is_closing():
            return
        for pattern in sorted(self.subscribed):
            with contextlib.suppress(Exception):
                reply = await self._command(
                    Unsubscribe("MESSAGE", parse_topic_pattern(pattern)))
                if reply.code in (200, 404):
                    self.subscribed.discard(pattern)

    async def stop(self) -> None:
        """Say QUIT on the way out (best-effort: the peer keeps our subscriptions anyway)."""
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(Exception):
                self._writer.write(self._conn.send(Quit()))  # type: ignore[union-attr]
                await asyncio.wait_for(self._writer.drain(), 1)

    # ------------------------------------------------------------------- wire

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        """Read what the peer sends; replies go to the commands waiting for them, messages to
        :meth:`_receive`. Returns when the peer closes."""
        loop = asyncio.get_running_loop()
        conn = self._conn
        assert conn is not None
        try:
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    data = await reader.read(65536)
                    conn.receive_data(data)
                    continue
                if event is CLOSED:
                    return
                self._quiet_since = loop.time()
                if isinstance(event, Greeting):
                    assert self._greeting is not None
                    self._greeting.set_result(event)
                elif isinstance(event, Reply | ServerAck):
                    if not self._replies:
                        raise LinkError(f"a reply nobody asked for: {_code(event)}")
                    waiting = self._replies.popleft()
                    if isinstance(waiting, _AckSent):
                        self._ack_answered(waiting, event)
                    elif isinstance(event, ServerAck):
                        raise LinkError("310 ACK in answer to a command")
                    elif not waiting.done():
                        waiting.set_result(event)
                elif isinstance(event, NotifyMessage):
                    self._incoming.put_nowait(event)
                elif isinstance(event, NotifyServer) and event.kind == "BYE":
                    logger.info("link %s: the peer says BYE", self.config.name)
                # NOTIFY TOPIC / SUB need nothing from a link.
        finally:
            if self._greeting is not None and not self._greeting.done():
                self._greeting.set_exception(LinkError("closed before the greeting"))
            for fut in self._replies:
                if isinstance(fut, asyncio.Future) and not fut.done():
                    fut.set_exception(LinkError("the peer closed the connection"))

    def _ack_answered(self, ack: _AckSent, answer: Reply | ServerAck) -> None:
        """The peer's answer to one of our ACKs. Refused for that message alone, the
        message has left the peer's window already (profile §9.7): it is counted and the
        session goes on. Anything else is a protocol failure, and ends the session."""
        if isinstance(answer, ServerAck):
            return
        text = " ".join(answer.lines)
        if answer.code in ACK_REFUSALS or (answer.code == 400 and ack.smuid is None):
            # 400 to a bare ACK: nothing waited for one (the message given up meanwhile).
            self.acks_refused += 1
            logger.info("link %s: 310 ACK %s refused by the peer: %d %s (%d so far)",
                        self.config.name, "" if ack.smuid is None else ack.smuid,
                        answer.code, text, self.acks_refused)
            return
        raise LinkError(f"310 ACK {ack.smuid or ''} answered {answer.code} {text}".strip())

    async def _command(self, cmd) -> Reply:
        assert self._conn is not None and self._writer is not None
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._replies.append(fut)
        self._writer.write(self._conn.send(cmd))
        await self._writer.drain()
        try:
            return await asyncio.wait_for(fut, REPLY_TIMEOUT_SECONDS)
        except TimeoutError:
            raise LinkError(f"no reply to {cmd.name} in {REPLY_TIMEOUT_SECONDS:.0f}s") from None

    async def _ask_window(self, logged_in: Reply) -> None:
        """SET NOTIFY WINDOW on a peer whose login reply names its Max-Window; a peer
        without one (or refusing) sends one message at a time."""
        self.window = 1
        most = _max_window(logged_in)
        wanted = min(settings.SMQP_LINK_WINDOW, most or 1)
        if wanted <= 1:
            return
        reply = await self._command(SetNotifyWindow(wanted))
        if reply.code == 200:
            self.window = wanted
            logger.info("link %s: window %d", self.config.name, wanted)
        else:
            logger.warning("link %s: SET NOTIFY WINDOW %d refused (%d %s); one at a time",
                           self.config.name, wanted, reply.code, " ".join(reply.lines))

    async def _expect(self, cmd, what: str) -> Reply:
        reply = await self._command(cmd)
        if reply.code != 200:
            raise LinkError(f"{what} refused: {reply.code} {' '.join(reply.lines)}")
        return reply

    # ------------------------------------------------------------------- the work

    async def _receive(self) -> None:
        """Store (or drop) what has arrived (up to the window), in one transaction and in
        the order the peer sent it, then ACK each: with a window of one the peer sends the
        next only after that; with more, it keeps the window full meanwhile."""
        cfg = self.config
        while True:
            events = [await self._incoming.get()]
            while len(events) < self.window and not self._incoming.empty():
                events.append(self._incoming.get_nowait())
            results = await _db(rules.accept_forwarded_batch, cfg.name, self.imports,
                                [(e.topic, e.message) for e in events], f"link:{cfg.name}")
            acks = []
            for event, result in zip(events, results, strict=True):
                smuid = event.message.get("Smuid")
                if isinstance(result, ServiceError):
                    # Not ACKed: the peer sends it again after its retry timeout.
                    logger.warning("link %s: %s on %s refused here: %s", cfg.name, smuid,
                                   event.topic, result)
                    await self._state(Link.State.UP, f"refused {smuid}: {result}")
                    continue
                if result.smuid is not None:
                    self.stored += 1
                    logger.debug("link %s: stored %s as %s", cfg.name, result.origin,
                                 result.smuid)
                else:
                    self.dropped += 1
                    logger.debug("link %s: dropped %s (%s)", cfg.name, result.origin,
                                 result.dropped)
                # A window's ACKs name their message: one refused above stays unacknowledged
                # without shifting the others. One at a time, the draft's bare ACK.
                acks.append(Ack() if self.window == 1 else Ack(_peer_smuid(smuid)))
            if not acks:
                continue
            assert self._writer is not None and self._conn is not None
            # Their answers come in the order of what is written (no await in between).
            self._replies.extend(_AckSent(ack.smuid) for ack in acks)
            self._writer.write(b"".join(self._conn.send(ack) for ack in acks))
            await self._writer.drain()

    async def _interest(self) -> None:
        """Keep the peer's subscriptions equal to what is wanted here; flush the counters;
        NOOP a quiet line."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        first = True
        while not self._withdrawing:
            wanted = await _db(rules.interest, cfg.name, self.imports)
            want = {p.casefold(): p for p in wanted}
            have = {p.casefold(): p for p in self.subscribed}
            # After a login every wanted pattern is subscribed again: idempotent on the peer,
            # and it brings back what the peer holds for us from before.
            now = loop.time()
            adding = [p for k, p in want.items() if (first or k not in have)
                      and self._refused.get(k, 0.0) <= now]
            errors = []
            for pattern in adding:
                reply = await self._command(Subscribe("MESSAGE", parse_topic_pattern(pattern)))
                if reply.code == 200:
                    self.subscribed.add(pattern)
                    self._refused.pop(pattern.casefold(), None)
                else:
                    self._refused[pattern.casefold()] = now + REFUSED_RETRY_SECONDS
                    errors.append(f"SUBSCRIBE MESSAGE {pattern}: {reply.code} "
                                  f"{' '.join(reply.lines)}")
            for key, pattern in have.items():
                if key in want:
                    continue
                reply = await self._command(Unsubscribe("MESSAGE", parse_topic_pattern(pattern)))
                if reply.code in (200, 404):
                    self.subscribed.discard(pattern)
            if errors:
                await self._state(Link.State.UP, "; ".join(errors))
            if adding or errors or first or self.stored or self.dropped or len(have) != len(
                    self.subscribed):
                await self._flush_counts()
            first = False
            if loop.time() - self._quiet_since > REPLY_TIMEOUT_SECONDS / 2:
                await self._expect(Noop(), "NOOP")
            await asyncio.sleep(INTEREST_POLL_SECONDS)


def _code(event: Reply | ServerAck) -> int:
    return 310 if isinstance(event, ServerAck) else event.code


def _max_window(reply: Reply) -> int | None:
    """The peer's ``Max-Window: n`` from its login reply (profile §9.7); None without."""
    for line in reply.lines:
        name, _, value = line.partition(":")
        if name.strip().casefold() == "max-window" and value.strip().isdigit():
            return int(value.strip())
    return None


def _peer_smuid(header: str | None) -> int | None:
    """The number of a delivered message's ``Smuid: <context>/<n>`` (what ``310 ACK <n>``
    names); None (a bare ACK: the oldest) when it has none."""
    number = (header or "").strip().rpartition("/")[2]
    return int(number) if number.isdigit() else None
