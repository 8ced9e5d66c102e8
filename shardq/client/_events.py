"""Queue events: a dedicated subscription connection, as an iterator and as callbacks.

    async with AsyncQueue("emails") as queue:
        async for event in queue.events():
            print(event.name, event.job_id)

    queue = Queue("emails")
    queue.on("completed", lambda event: print(event.job_id, event.data))

A subscription is a connection in event mode (`Connection.events`, which `Queue.events` uses):
a link of its own (bunqueue's TS `QueueEvents` does the same), opened by the connection's
`Transports` with the same address and security, because the server pushes event frames there
without a `reqId`, which would only be noise among a connection's replies. The blocking and
asyncio streams share the sans-IO `_Feed` (hello, replies, events, last id, gap) and differ
only in their link's I/O (the asyncio ones are in `shardq.client._async_events`: a blocking
client imports no asyncio). A stream sends `Auth` (with a token) and `SubscribeEvents`, then
reads events. When its link breaks it reconnects and resubscribes with `since` set to the last
event id it saw, so the server replays what the ring still holds (docs/protocol.md §18);
`gap` on the first event after that says some events were lost in between.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from shardq.client._errors import ConnectionLost, error_from_reply
from shardq.client._factory import EventLink, Transports
from shardq.client._url import ClientSecurity, Endpoint, client_security

if TYPE_CHECKING:
    import ssl

__all__ = [
    "EventCallbacks",
    "EventStream",
    "Listener",
    "Listeners",
    "QueueEvent",
    "parse_event",
    "stream_transports",
]

# bunqueue's wire names -> the names BullMQ's (and bunqueue's TS) QueueEvents emit.
BULLMQ_NAMES: Final = {"pushed": "waiting", "pulled": "active"}
RECONNECT_ATTEMPTS: Final = 10  # then the iterator raises ConnectionLost
RECONNECT_FIRST_S: Final = 0.1
RECONNECT_MAX_S: Final = 2.0
_SUBSCRIBE_REQ: Final = "subscribe"


@dataclass(frozen=True, slots=True)
class QueueEvent:
    """One job event. `type` is bunqueue's `eventType` (`pushed`, `pulled`, `completed` ...),
    `name` the BullMQ name (`waiting`, `active`, `completed` ...); `data` is the result of a
    completed job, `{progress, message}` for progress; `error` and `terminal` come with failed
    (terminal False: the job is retried), `prev` with removed and retried, `delay` with delayed.
    `id` is the server's event id; `gap` is True on the first event after a reconnect whose
    missed events the server no longer held."""

    type: str
    queue: str
    job_id: str
    timestamp: float
    id: int | None = None
    data: Any = None
    error: str | None = None
    progress: Any = None
    prev: str | None = None
    delay: int | None = None
    terminal: bool | None = None
    gap: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return BULLMQ_NAMES.get(self.type, self.type)

    def matches(self, name: str) -> bool:
        """Whether a listener registered for `name` (either naming, or "*") wants this."""
        return name in ("*", self.type, self.name)


def parse_event(frame: Mapping[str, Any], gap: bool = False) -> QueueEvent | None:
    """The event a server frame carries, or None for a frame that is not a valid event."""
    event = frame.get("event")
    if frame.get("type") != "event" or not isinstance(event, dict):
        return None
    kind, queue, job_id = event.get("eventType"), event.get("queue"), event.get("jobId")
    if not (isinstance(kind, str) and isinstance(queue, str) and isinstance(job_id, str)):
        return None
    event_id = frame.get("id")
    if isinstance(event_id, float) and event_id.is_integer():
        event_id = int(event_id)  # the TCP port sends ids beyond 32 bits as floats (§21.5)
    return QueueEvent(
        type=kind,
        queue=queue,
        job_id=job_id,
        timestamp=float(event.get("timestamp") or 0),
        id=event_id if isinstance(event_id, int) else None,
        data=event.get("data"),
        error=event.get("error"),
        progress=event.get("progress"),
        prev=event.get("prev"),
        delay=event.get("delay"),
        terminal=event.get("terminal"),
        gap=gap,
        raw=event,
    )


class _Feed:
    """The sans-IO part of a subscription: the commands it sends and what frames mean."""

    def __init__(self, queue: str | None, token: str | None, since: int | None) -> None:
        self.queue = queue
        self.token = token
        self.last_id = since
        self.subscribed = False
        self._gap = False
        self.ready: deque[QueueEvent] = deque()
        """Events read and not handed out yet (they outlive a reconnect)."""

    def take_all(self, frames: Iterable[object]) -> None:
        """Queue the events among `frames` in `ready`. Raises as `take`."""
        for frame in frames:
            event = self.take(frame)
            if event is not None:
                self.ready.append(event)

    def hello(self) -> list[dict[str, Any]]:
        """What a (re)connect sends: Auth, then SubscribeEvents (from the last id seen)."""
        self.subscribed = False
        out: list[dict[str, Any]] = []
        if self.token:
            out.append({"cmd": "Auth", "token": self.token, "reqId": "auth"})
        sub: dict[str, Any] = {"cmd": "SubscribeEvents", "reqId": _SUBSCRIBE_REQ}
        if self.queue is None:
            sub["all"] = True
        else:
            sub["queue"] = self.queue
        if self.last_id is not None:
            sub["since"] = self.last_id
        out.append(sub)
        return out

    def take(self, frame: object) -> QueueEvent | None:
        """An event, or None (a reply). Raises the server's error if the subscription or
        its Auth was refused."""
        if not isinstance(frame, dict):
            return None
        if "reqId" in frame:
            if not frame.get("ok"):
                raise error_from_reply(frame)
            if frame["reqId"] == _SUBSCRIBE_REQ:
                self.subscribed = True
                self._gap = bool(frame.get("gap"))
            return None
        event = parse_event(frame, self._gap)
        if event is not None:
            self._gap = False
            if event.id is not None:
                self.last_id = event.id
        return event


def stream_transports(
    endpoint: Endpoint,
    connect_timeout: float,
    security: ClientSecurity | None,
    tls_context: ssl.SSLContext | None,
    zmq_server_key: str | None,
    tls_ca_file: str | None,
) -> Transports:
    """Where a stream's links come from: its connection's `security` (a queue's streams), else
    the settings given here, the environment's for those not given."""
    if security is None:
        security = client_security(
            zmq_server_key=zmq_server_key, tls_ca_file=tls_ca_file, tls_context=tls_context
        )
    return Transports(endpoint, security, connect_timeout)


# -- blocking -------------------------------------------------------------------------------


class EventStream:
    """A blocking iterator over a queue's events (`Queue.events()`); `queue=None` follows
    every queue. Iterating blocks until an event comes; `get(timeout)` returns None instead
    once `timeout` seconds pass. Raises `ConnectionLost` after `RECONNECT_ATTEMPTS` failed
    reconnects, and the server's error if it refuses the subscription.

    Its link is secured as `security` says (a queue's streams pass their connection's), else
    by `zmq_server_key`, `tls_ca_file` and `tls_context` as for `Connection`."""

    def __init__(
        self,
        endpoint: Endpoint,
        queue: str | None,
        token: str | None = None,
        *,
        connect_timeout: float = 5.0,
        since: int | None = None,
        tls_context: ssl.SSLContext | None = None,
        zmq_server_key: str | None = None,
        tls_ca_file: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._feed = _Feed(queue, token, since)
        self._connect_timeout = connect_timeout
        self._transports = stream_transports(
            endpoint, connect_timeout, security, tls_context, zmq_server_key, tls_ca_file
        )
        self._link: EventLink | None = None
        self.closed = False

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[QueueEvent]:
        return self

    def __next__(self) -> QueueEvent:
        while True:
            if self.closed:
                raise StopIteration
            event = self.get(1.0)
            if event is not None:
                return event

    @property
    def last_id(self) -> int | None:
        return self._feed.last_id

    def subscribe(self) -> None:
        """Connect and subscribe now (iteration does it on first use). Raises as `get`."""
        link = self._ensure()
        deadline = time.monotonic() + self._connect_timeout
        while not self._feed.subscribed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionLost(f"no SubscribeEvents reply from {self.endpoint}")
            self._feed.take_all(link.read(left))

    def get(self, timeout: float | None = None) -> QueueEvent | None:
        """The next event, or None after `timeout` seconds (None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = self._feed.ready
        while not ready:
            if self.closed:
                return None
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                link = self._ensure()
                self._feed.take_all(link.read(1.0 if left is None else min(left, 1.0)))
            except (OSError, ConnectionLost):  # a ZeroMQ link raises ConnectionLost
                self._reconnect()
        return ready.popleft()

    def _ensure(self) -> EventLink:
        if self._link is None:
            self._link = self._transports.open_events(self._feed.hello())
        return self._link

    def _reconnect(self) -> None:
        self._drop()
        delay = RECONNECT_FIRST_S
        for _ in range(RECONNECT_ATTEMPTS):
            if self.closed:
                return
            time.sleep(delay)
            try:
                self.subscribe()
                return
            except (OSError, ConnectionLost):  # a ZeroMQ link raises ConnectionLost
                self._drop()
                delay = min(delay * 2, RECONNECT_MAX_S)
        raise ConnectionLost(f"cannot resubscribe to events at {self.endpoint}")

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def close(self) -> None:
        """Close the subscription connection. Idempotent."""
        self.closed = True
        self._drop()


Listener = Callable[[QueueEvent], object]


class Listeners:
    """The listeners `on` and `off` keep, by event name, for both kinds of callbacks; a
    listener's error is kept in `errors` (the last 100)."""

    def __init__(self) -> None:
        self._listeners: list[tuple[str, Listener]] = []
        self._lock = threading.Lock()  # the blocking kind calls them from its own thread
        self.errors: deque[BaseException] = deque(maxlen=100)

    def off(self, name: str, listener: Listener) -> None:
        with self._lock:
            if (name, listener) in self._listeners:
                self._listeners.remove((name, listener))

    def _for(self, event: QueueEvent) -> list[Listener]:
        with self._lock:
            return [fn for name, fn in self._listeners if event.matches(name)]


class EventCallbacks(Listeners):
    """`Queue.on(name, fn)`: a thread reads an `EventStream` and calls the listeners of each
    event, in order. A listener that raises is skipped for that event (and the error kept in
    `errors`, the last 100), never stops the others."""

    def __init__(self, make_stream: Callable[[], EventStream]) -> None:
        super().__init__()
        self._make_stream = make_stream
        self._thread: threading.Thread | None = None
        self._stream: EventStream | None = None

    def on(self, name: str, listener: Listener) -> None:
        with self._lock:
            self._listeners.append((name, listener))
            if self._thread is None:
                self._stream = self._make_stream()
                self._stream.subscribe()  # events from now on are seen: raises here if refused
                self._thread = threading.Thread(target=self._run, daemon=True, name="events")
                self._thread.start()

    def _run(self) -> None:
        stream = self._stream
        assert stream is not None
        while not stream.closed:
            try:
                event = stream.get(0.2)
            except Exception as e:  # the stream gave up: keep why, stop
                self.errors.append(e)
                return
            if event is None:
                continue
            for fn in self._for(event):
                try:
                    fn(event)
                except Exception as e:
                    self.errors.append(e)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
