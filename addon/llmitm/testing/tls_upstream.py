"""A local TLS upstream that counts its connections, for tests and benchmarks of how a proxy
reaches upstreams: its own self-signed CA (made with ``cryptography`` at start-up), HTTP/1.1
keep-alive (h11) and, when asked, HTTP/2 offered by ALPN (h2).

It answers ``POST …/chat/completions`` with a Chat Completions answer — streamed as
``events`` text deltas when the request says ``"stream": true`` — and counts TLS
handshakes, the protocols negotiated, requests served and HTTP/2 streams the client reset
(``stats()``). It is small on
purpose: answers that must vary (faults, tools, Responses) are the fake upstream's job
(:mod:`llmitm.testing.fake_upstream`); this one is for what only a TLS server can show.

    with serve_in_thread(http2=True) as upstream:
        upstream.base_url, upstream.ca_file, upstream.stats()

or ``python -m llmitm.testing.tls_upstream --port-file FILE [--http2] [--events N]
[--event-delay-ms D] [--stats-file STATS]``: it writes ``port ca_file`` to the file once
listening, stops on SIGTERM and then writes ``stats()`` as JSON to ``STATS``, with the median
of :attr:`TlsUpstream.answer_times` in milliseconds as ``answer_ms``. A benchmark runs
it so, in a process of its own: an upstream on the client's event loop holds the client's
read of an event until it has written the events after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import ipaddress
import signal
import ssl
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import h11
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

READ_SIZE = 65536


def make_certificates(folder: Path, name: str = "llmitm test") -> tuple[Path, Path]:
    """A self-signed CA and a server certificate it signed for 127.0.0.1 and localhost:
    ``(ca.pem, server.pem)``, the server file holding its key too."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = folder / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_file = folder / "server.pem"
    server_file.write_bytes(
        server.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_file, server_file


def chat_answer(body: bytes, events: int) -> tuple[bool, list[bytes]]:
    """Whether the request asked for a stream, and the answer's body pieces."""
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        request = {}
    model = request.get("model", "m") if isinstance(request, dict) else "m"
    stream = isinstance(request, dict) and request.get("stream") is True
    words = [f"w{i} " for i in range(events)]
    base = {"id": "chatcmpl-tls", "created": 0, "model": model}
    usage = {"prompt_tokens": 3, "completion_tokens": events, "total_tokens": 3 + events}
    if not stream:
        message = {"role": "assistant", "content": "".join(words)}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        answer = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        return False, [orjson.dumps(answer)]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        payload = {**base, "object": "chat.completion.chunk", "choices": [choice], **extra}
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    pieces = [chunk({"role": "assistant", "content": ""})]
    pieces += [chunk({"content": word}) for word in words]
    pieces.append(chunk({}, "stop", usage=usage))
    pieces.append(b"data: [DONE]\n\n")
    return True, pieces


class TlsUpstream:
    """The server; start it on a running loop (``start``/``stop``) or in a thread."""

    def __init__(
        self,
        *,
        http2: bool = False,
        events: int = 5,
        event_delay: float = 0.0,
        max_streams: int | None = None,
    ):
        self.http2 = http2
        self.events = events
        self.event_delay = event_delay
        self.max_streams = max_streams
        """HTTP/2: the concurrent streams a connection allows (h2's default otherwise)."""
        self.heads: list[list[tuple[bytes, bytes]]] = []
        """HTTP/2: each request's header fields as received, in order (a field sent as
        never-indexed arrives as hpack's ``NeverIndexedHeaderTuple``)."""
        self._writers: set[asyncio.StreamWriter] = set()
        self._folder = tempfile.TemporaryDirectory(prefix="llmitm-tls-upstream-")
        self.ca_file, self._server_file = make_certificates(Path(self._folder.name))
        self.handshakes = 0
        self.requests = 0
        self.resets = 0
        """HTTP/2 streams the client reset (gave up on) before their end."""
        self.protocols: Counter[str] = Counter()
        self.answer_times: list[float] = []
        """Seconds from the read that completed each request to the write of its answer's
        first body piece: this server's own share of a client's time to first byte."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, Any]:
        return {
            "handshakes": self.handshakes,
            "requests": self.requests,
            "resets": self.resets,
            "protocols": dict(self.protocols),
        }

    async def start(self, port: int = 0) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._server_file)
        context.set_alpn_protocols(["h2", "http/1.1"] if self.http2 else ["http/1.1"])
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", port, ssl=context)
        self.port = self._server.sockets[0].getsockname()[1]

    def close_connections(self) -> None:
        """Close every open connection, as an upstream closes the idle ones when it likes."""
        for writer in list(self._writers):
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._folder.cleanup()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Called once the TLS handshake is done: one call, one handshake.
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.handshakes += 1
        ssl_object = writer.get_extra_info("ssl_object")
        protocol = (ssl_object.selected_alpn_protocol() if ssl_object else None) or "http/1.1"
        self.protocols[protocol] += 1
        self._writers.add(writer)
        try:
            if protocol == "h2":
                await self._serve_h2(reader, writer)
            else:
                await self._serve_h11(reader, writer)
        except (ConnectionError, OSError, ssl.SSLError, h11.ProtocolError):
            pass
        except asyncio.CancelledError:
            pass  # stopped: the connection's task ends here (asyncio reports it otherwise)
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()

    async def _serve_h11(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        body = bytearray()
        read_at = 0.0
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_SIZE)
                if not data:
                    return
                read_at = time.perf_counter()
                connection.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.requests += 1
                stream, pieces = chat_answer(bytes(body), self.events)
                body.clear()
                headers = [("content-type", "text/event-stream" if stream else "application/json")]
                if stream:
                    headers.append(("transfer-encoding", "chunked"))
                else:
                    headers.append(("content-length", str(len(pieces[0]))))
                writer.write(connection.send(h11.Response(status_code=200, headers=headers)))
                for index, piece in enumerate(pieces):
                    if index and self.event_delay:
                        await asyncio.sleep(self.event_delay)
                    writer.write(connection.send(h11.Data(data=piece)))
                    if not index:
                        self.answer_times.append(time.perf_counter() - read_at)
                    await writer.drain()
                writer.write(connection.send(h11.EndOfMessage()))
                await writer.drain()
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return

    async def _serve_h2(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        connection = h2.connection.H2Connection(config=config)
        if self.max_streams is not None:
            connection.local_settings = h2.settings.Settings(
                client=False,
                initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.max_streams},
            )
        connection.initiate_connection()
        writer.write(connection.data_to_send())
        bodies: dict[int, bytearray] = {}
        answers: dict[int, asyncio.Task[None]] = {}
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    return
                read_at = time.perf_counter()
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        bodies[event.stream_id] = bytearray()
                        self.heads.append(list(event.headers or []))
                    elif isinstance(event, h2.events.DataReceived):
                        bodies.setdefault(event.stream_id, bytearray()).extend(event.data)
                        connection.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    elif isinstance(event, h2.events.StreamEnded):
                        body = bytes(bodies.pop(event.stream_id, b""))
                        # Started at once, as the HTTP/1.1 side answers: its first write
                        # does not wait for a turn of the loop.
                        answers[event.stream_id] = asyncio.Task(
                            self._answer_h2(connection, writer, event.stream_id, body, read_at),
                            loop=loop,
                            eager_start=True,
                        )
                    elif isinstance(event, h2.events.StreamReset):
                        self.resets += 1
                        answer = answers.pop(event.stream_id, None)
                        if answer is not None:
                            answer.cancel()
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                writer.write(connection.data_to_send())
        finally:
            for answer in answers.values():
                answer.cancel()

    async def _answer_h2(
        self,
        connection: h2.connection.H2Connection,
        writer: asyncio.StreamWriter,
        stream_id: int,
        body: bytes,
        read_at: float,
    ) -> None:
        self.requests += 1
        stream, pieces = chat_answer(body, self.events)
        kind = b"text/event-stream" if stream else b"application/json"
        with contextlib.suppress(h2.exceptions.StreamClosedError, ConnectionError):
            connection.send_headers(stream_id, [(b":status", b"200"), (b"content-type", kind)])
            for index, piece in enumerate(pieces):
                if index and self.event_delay:
                    await asyncio.sleep(self.event_delay)
                connection.send_data(stream_id, piece)
                writer.write(connection.data_to_send())
                if not index:
                    self.answer_times.append(time.perf_counter() - read_at)
            connection.end_stream(stream_id)
            writer.write(connection.data_to_send())


@contextlib.contextmanager
def serve_in_thread(**options: Any) -> Iterator[TlsUpstream]:
    """A :class:`TlsUpstream` on its own loop in a thread, for synchronous code."""
    upstream = TlsUpstream(**options)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tls upstream", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(upstream.start(), loop).result(10)
    try:
        yield upstream
    finally:
        asyncio.run_coroutine_threadsafe(upstream.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _main(args: argparse.Namespace) -> None:
    upstream = TlsUpstream(
        http2=args.http2, events=args.events, event_delay=args.event_delay_ms / 1000
    )
    await upstream.start(args.port)
    Path(args.port_file).write_text(f"{upstream.port} {upstream.ca_file}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await upstream.stop()
    if args.stats_file:
        times = upstream.answer_times
        answer_ms = statistics.median(times) * 1000 if times else None
        Path(args.stats_file).write_bytes(
            orjson.dumps({**upstream.stats(), "answer_ms": answer_ms})
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--http2", action="store_true", help="offer HTTP/2 by ALPN")
    parser.add_argument("--events", type=int, default=5, help="text deltas per stream")
    parser.add_argument(
        "--event-delay-ms", type=float, default=0.0, help="wait between events (after the first)"
    )
    parser.add_argument("--stats-file", help="where to write stats() as JSON once stopped")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
