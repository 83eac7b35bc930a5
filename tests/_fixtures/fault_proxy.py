"""The ``fault_proxy`` fixture: a fault-injecting TCP proxy to put between a client and a server.

:class:`FaultProxy` listens on a free loopback port and forwards every connection
to one target (an emulator, moto, Azurite). A test switches it between modes, from
its own thread, while clients are connected:

``pass``
    Forward bytes both ways, each chunk after :attr:`FaultProxy.latency` seconds.
``drop``
    Reset every open connection (``SO_LINGER`` 0, then close: the peer gets an RST,
    i.e. ``ConnectionResetError``) and reset each new one as soon as it is accepted.
``blackhole``
    Accept new connections and never answer. Nothing is forwarded and neither side
    is read any more (reading is paused on both sockets, so what a client sends stays
    in the kernel's buffers and its request just hangs). When the mode goes back to
    ``pass``, held connections carry on with what was held, as TCP retransmission would
    after a short partition; a connection whose client gave up and closed meanwhile
    (its FIN arrived: the socket is in ``CLOSE_WAIT``, checked through ``TCP_INFO`` on
    Linux) is closed instead, so a request its client abandoned never reaches the server.

The proxy runs its own asyncio event loop in a daemon thread, so tests stay
synchronous; :meth:`FaultProxy.set_mode` has taken effect (connections reset or
paused) when it returns. Standard library only.

Usage::

    def test_x(fault_proxy, mns_server):
        proxy = fault_proxy(port_of(mns_server))     # started; stopped after the test
        q = leasekit.open("aliyun-mns", endpoint=proxy.endpoint(), ...)
        proxy.blackhole(); ...; proxy.pass_()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

import pytest

__all__ = ["MODES", "FaultProxy", "MakeProxy"]

#: The modes :meth:`FaultProxy.set_mode` accepts.
MODES = ("pass", "drop", "blackhole")

#: Bytes read per forwarded chunk; latency is added once per chunk.
_CHUNK = 64 * 1024
#: Seconds a caller waits for the proxy's loop to carry out a start, mode change or stop.
_CALL_TIMEOUT = 10.0
#: Linux's ``TCP_CLOSE_WAIT`` (include/net/tcp_states.h): the peer has sent its FIN.
_TCP_CLOSE_WAIT = 8

T = TypeVar("T")


def _peer_closed(writer: asyncio.StreamWriter) -> bool:
    """Whether the peer of ``writer``'s socket has closed its side (Linux; else False)."""
    sock = writer.get_extra_info("socket")
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None:
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
    except OSError:
        return True  # already gone
    return bool(state == _TCP_CLOSE_WAIT)


def _abort(writer: asyncio.StreamWriter | None, *, reset: bool) -> None:
    """Close ``writer``'s socket at once; with ``reset``, make the peer get an RST."""
    if writer is None or writer.transport.is_closing():
        return
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One accepted client connection and, once forwarding began, its target connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.client = (reader, writer)
        self.target: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.task: asyncio.Task[None] | None = None

    def writers(self) -> list[asyncio.StreamWriter]:
        return [self.client[1]] + ([self.target[1]] if self.target else [])

    def transports(self) -> list[asyncio.Transport]:
        """The open sockets' transports (a stream's transport reads too)."""
        return [
            cast(asyncio.Transport, writer.transport)
            for writer in self.writers()
            if not writer.transport.is_closing()
        ]

    def pause(self) -> None:
        """Stop reading from both sockets (the kernel buffers fill up, then TCP pushes back)."""
        for transport in self.transports():
            transport.pause_reading()

    def resume(self) -> None:
        for transport in self.transports():
            transport.resume_reading()


class FaultProxy:
    """A TCP proxy from a free loopback port to ``target_host:target_port``, with faults.

    Parameters:
        target_host: where connections are forwarded.
        target_port: the target's port.
        name: a label for the thread and the repr.

    :meth:`start` it (or use it as a context manager), point the client at
    :attr:`port` (or :meth:`endpoint`), then switch :attr:`mode` with
    :meth:`set_mode` or the shorthands :meth:`pass_`, :meth:`drop` and
    :meth:`blackhole`; :attr:`latency` delays every forwarded chunk in ``pass``
    mode. All methods may be called from any thread except the proxy's own.
    """

    def __init__(self, target_host: str, target_port: int, *, name: str = "proxy") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.name = name
        self.host = "127.0.0.1"
        self.port = 0
        self._mode = "pass"
        self._latency = 0.0
        self._stats = {"accepted": 0, "resets": 0, "bytes_to_target": 0, "bytes_to_client": 0}
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None  # set in pass mode; made on the loop

    def __repr__(self) -> str:
        return (
            f"<FaultProxy {self.name} {self.host}:{self.port} -> "
            f"{self.target_host}:{self.target_port} {self._mode}>"
        )

    # ------------------------------------------------------------- lifecycle

    def start(self) -> FaultProxy:
        """Listen on a free loopback port and start forwarding; return self."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name=f"fault-proxy-{self.name}", daemon=True
        )
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and join its thread."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CALL_TIMEOUT)
        self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def endpoint(self, scheme: str = "http") -> str:
        """The URL clients use: ``f"{scheme}://127.0.0.1:{port}"``."""
        return f"{scheme}://{self.host}:{self.port}"

    # ----------------------------------------------------------------- modes

    @property
    def mode(self) -> str:
        """The current mode: ``"pass"``, ``"drop"`` or ``"blackhole"``."""
        return self._mode

    def set_mode(self, mode: str) -> None:
        """Switch to ``mode``; open connections are reset, paused or resumed before it returns."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if self._loop is None:
            self._mode = mode  # applied to connections once started
            return
        self._call(self._apply(mode))

    def pass_(self) -> None:
        """Forward again (held connections carry on)."""
        self.set_mode("pass")

    def drop(self) -> None:
        """Reset every connection, open or new, until the mode changes."""
        self.set_mode("drop")

    def blackhole(self) -> None:
        """Accept but never answer; forward nothing either way until the mode changes."""
        self.set_mode("blackhole")

    @property
    def latency(self) -> float:
        """Seconds added before each forwarded chunk, in both directions (pass mode)."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"latency must be >= 0 seconds, not {seconds!r}")
        self._latency = float(seconds)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``accepted``, ``resets`` (sent to clients), ``bytes_to_target``,
        ``bytes_to_client``, and ``open`` (connections open now).
        """
        return {**self._stats, "open": len(self._connections)}

    # ------------------------------------------------------- loop-side code

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the proxy's loop and wait for its result."""
        assert self._loop is not None
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("FaultProxy methods must not be called from the proxy's own thread")
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("the proxy is stopped")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        if self._mode == "pass":
            self._flowing.set()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            self._close(conn, reset=False)
        await asyncio.sleep(0)  # let the sockets' close callbacks run

    async def _apply(self, mode: str) -> None:
        assert self._flowing is not None
        previous, self._mode = self._mode, mode
        if mode == "pass":
            for conn in list(self._connections):
                if previous == "blackhole" and _peer_closed(conn.client[1]):
                    self._close(conn, reset=False)  # its client gave up: do not replay it
                else:
                    conn.resume()
            self._flowing.set()
            return
        self._flowing.clear()
        for conn in list(self._connections):
            if mode == "drop":
                self._close(conn, reset=True)
            else:
                conn.pause()
        await asyncio.sleep(0)  # let the reset sockets' close callbacks run

    def _close(self, conn: _Connection, *, reset: bool) -> None:
        """Close both sides of ``conn`` now (with an RST if ``reset``) and end its task."""
        if reset and not conn.client[1].transport.is_closing():
            self._stats["resets"] += 1
        for writer in conn.writers():
            _abort(writer, reset=reset)
        self._connections.discard(conn)
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handle one accepted connection until either side ends it."""
        assert self._flowing is not None
        self._stats["accepted"] += 1
        conn = _Connection(reader, writer)
        if self._mode == "drop":
            self._close(conn, reset=True)
            return
        conn.task = asyncio.current_task()
        self._connections.add(conn)
        if self._mode == "blackhole":
            conn.pause()
        try:
            # A connection accepted in a blackhole reaches the target only once it lifts.
            await self._flowing.wait()
            try:
                conn.target = await asyncio.open_connection(self.target_host, self.target_port)
            except OSError:
                self._close(conn, reset=True)  # target down: the client sees a reset
                return
            if self._mode == "blackhole":  # switched while connecting
                conn.pause()
            up = asyncio.ensure_future(self._pump(conn, reader, conn.target[1], "bytes_to_target"))
            down = asyncio.ensure_future(
                self._pump(conn, conn.target[0], writer, "bytes_to_client")
            )
            try:
                await asyncio.gather(up, down)
            finally:
                up.cancel()
                down.cancel()
        except asyncio.CancelledError:
            pass  # closed by a mode change or stop
        finally:
            if conn in self._connections:
                self._close(conn, reset=False)

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counter: str,
    ) -> None:
        """Copy ``reader`` to ``writer`` chunk by chunk, holding chunks while not in pass mode."""
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if self._latency > 0:
                    await asyncio.sleep(self._latency)
                await self._flowing.wait()  # a chunk read just before a blackhole is held
                self._stats[counter] += len(data)  # before the write: a reader sees it counted
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()  # pass a half-close on
        except OSError:  # reset or broken pipe on one side: reset the other side too
            self._close(conn, reset=True)


class MakeProxy(Protocol):
    """The ``fault_proxy`` fixture's factory."""

    def __call__(self, target_port: int, target_host: str = "127.0.0.1") -> FaultProxy: ...


@pytest.fixture
def fault_proxy() -> Iterator[MakeProxy]:
    """A factory of started :class:`FaultProxy` objects; every one is stopped after the test.

    ``fault_proxy(target_port, target_host="127.0.0.1")`` returns a proxy in pass mode.
    """
    made: list[FaultProxy] = []

    def make(target_port: int, target_host: str = "127.0.0.1") -> FaultProxy:
        proxy = FaultProxy(target_host, target_port, name=f"proxy-{len(made)}").start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()
