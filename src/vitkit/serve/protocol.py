"""The HTTP/1.1 connection of `vitkit serve`: uvicorn's httptools protocol plus the limits it lacks.

uvicorn with httptools puts no bound on a request's headers (a 200 MB header value or five million
header lines are read whole, the URL by quadratic concatenation), starts no clock before the first
request (an idle or trickling connection is held for ever: slowloris), and answers its own errors
(a request that does not parse, the concurrency limit) in plain text.  `GuardedProtocol` adds:

  - `max_header_bytes`: the request line and headers of one request; more is a 431, and the bytes
    beyond the limit are never handed to the parser.  A chunked body's trailer fields count against the
    same limit, and are discarded (RFC 9110 section 6.5.1 allows it): uvicorn kept every one.  So do the
    bytes after the headers that are not body (a trailer field still without its CRLF, chunk-size lines
    beyond 64 bytes a chunk), since the parser holds a field whole until it ends;
  - `header_timeout_s`: from the connection (or the first byte of a next request) to the end of the
    headers; a request still incomplete then gets 408 and the connection closes (one that sent
    nothing is closed silently; uvicorn's keep-alive timeout closes idle ones between requests);
  - `max_connections`: open connections; a request on a connection beyond them gets 503 + Retry-After;
  - `max_pipelined`: requests parsed ahead of their answers on one connection (uvicorn parses every
    request of a read, so a client that pipelines and never reads would grow the server without bound):
    bytes go to the parser in slices of SLICE_BYTES, and those beyond the limit wait, reading paused,
    until answers make room;
  - every error it answers is JSON `{"error": ...}` with its status, like the app's own.

The body is the app's business: read within `max_body_mb` and `body_timeout_s` (vitkit.serve.body).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Limits:
    """What one connection may claim before the app sees a request."""

    max_header_bytes: int = 64 * 1024  # request line + headers of one request
    header_timeout_s: float = 10.0  # connection (or a next request's first byte) -> end of its headers
    max_connections: int = 512  # open connections served at once; beyond: 503
    max_pipelined: int = 64  # requests parsed on one connection ahead of their answers; beyond, bytes wait


SLICE_BYTES = 4096  # fed to the parser at a time: what one slice may parse beyond max_pipelined or a header limit


def error_bytes(status: int, message: str, extra: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 response `{"error": message}` with `status` that closes the connection."""
    body = json.dumps({"error": message}).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        **(extra or {}),
    }
    head = f"HTTP/1.1 {status} {REASONS[status]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("ascii") + b"\r\n" + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded headers, a header clock, a connection limit and JSON errors."""

    limits = Limits()  # replaced by `protocol_class`
    on_refused: Callable[[int], None] = staticmethod(lambda status: None)  # the status of each request refused here

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # our own limit answers in JSON (on_headers_complete)
        self._in_headers, self._header_bytes, self._trailer_bytes = True, 0, 0
        self._beyond_body, self._chunks = 0, 0  # bytes after the headers that are not body; chunks seen
        self._messages = 0  # requests parsed whole on this connection
        self._held = b""  # received, not yet parsed: max_pipelined requests wait for their answers
        self._header_clock: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------------ the connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        self._held = b""
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """`data` to the parser a slice at a time while fewer than max_pipelined requests wait for their answers;
        the rest is held, and reading paused, until `on_response_complete` makes room."""
        data, self._held = self._held + data, b""
        for start in range(0, len(data), SLICE_BYTES):
            if len(self.pipeline) >= self.limits.max_pipelined and not self.transport.is_closing():
                self._held = data[start:]
                self.flow.pause_reading()
                return
            self._receive(data[start : start + SLICE_BYTES])

    def on_response_complete(self) -> None:
        super().on_response_complete()  # the next pipelined request starts; reading resumes
        if len(self.pipeline) >= self.limits.max_pipelined:  # still full: the held bytes wait
            self.flow.pause_reading()
        elif self._held and not self.transport.is_closing():
            self.data_received(b"")

    def _receive(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_headers:
            self._start_clock()
            room = self.limits.max_header_bytes - self._header_bytes
            if len(data) > room:  # only the bytes within the limit reach the parser
                ended = self._messages
                self._feed(data[:room])
                if self._messages != ended and not self.transport.is_closing():  # pipelined: the next one afresh
                    self._receive(data[room:])
                    return
                if self._in_headers and not self.transport.is_closing():
                    self._refuse(431, f"request headers exceed {self.limits.max_header_bytes:,} bytes")
                    return
                data = data[room:]
            else:
                self._header_bytes += len(data)
        if not self._in_headers:
            self._beyond_body += len(data)  # on_body takes the body's bytes back out
        self._feed(data)
        self._check_framing()

    def _check_framing(self) -> None:
        """431 once the bytes after the headers that are not body pass the header limit (plus a chunk-size line a
        chunk): the parser holds a trailer field whole until its CRLF, so on_header alone sees it too late."""
        allowed = self.limits.max_header_bytes + 64 * self._chunks
        if not self._in_headers and self._beyond_body > allowed and not self.transport.is_closing():
            self._refuse(431, f"request trailers or chunk framing exceed {self.limits.max_header_bytes:,} bytes")

    def _feed(self, data: bytes) -> None:
        """uvicorn's data_received, answering a request that does not parse with a JSON 400 naming the problem."""
        if not data or self.transport.is_closing() or self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:  # no WebSockets here: the request is served as plain HTTP
            self._unsupported_upgrade_warning()
            self._feed(data[upgrade.args[0] :] if upgrade.args else b"")  # and the requests after it are read
        except httptools.HttpParserError as error:
            self._refuse(400, f"invalid HTTP request ({error})")

    def _unsupported_upgrade_warning(self) -> None:  # uvicorn's advises installing WebSocket libraries
        log.debug("%s: an Upgrade header is ignored (no WebSockets here): the request is served as HTTP", self.client)

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, msg)

    def _refuse(self, status: int, message: str, extra: dict[str, str] | None = None) -> None:
        """Answer `status` with {"error": message} and close (the connection's state is not to be trusted)."""
        if self.transport.is_closing():
            return
        log.info("refused a request from %s with %d: %s", self.client, status, message)
        self.on_refused(status)
        self.transport.write(error_bytes(status, message, extra))
        self.transport.close()

    # ------------------------------------------------------------------------------ the header clock
    def _start_clock(self) -> None:
        if self._header_clock is None:
            self._header_clock = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _stop_clock(self) -> None:
        if self._header_clock is not None:
            self._header_clock.cancel()
            self._header_clock = None

    def _headers_too_slow(self) -> None:
        self._header_clock = None
        if not self._in_headers or self.transport.is_closing():
            return
        if self._header_bytes:
            self._refuse(408, f"the request headers did not arrive within {self.limits.header_timeout_s:g} s")
        else:
            self.transport.close()  # nothing sent: nobody to answer

    # ------------------------------------------------------------------------------ parser callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_headers:
            super().on_header(name, value)
            return
        self._trailer_bytes += len(name) + len(value) + 4  # "name: value\r\n"
        if self._trailer_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"request trailers exceed {self.limits.max_header_bytes:,} bytes")

    def on_body(self, body: bytes) -> None:
        self._beyond_body = max(self._beyond_body - len(body), 0)  # body bytes of the headers' packet: not counted
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._stop_clock()
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                f"server busy: more than {self.limits.max_connections} connections open; retry shortly",
                {"retry-after": "1"},
            )
            return
        hosts = sum(name.lower() == b"host" for name, _ in self.headers)
        if hosts > 1 or (hosts == 0 and self.parser.get_http_version() != "1.0"):  # RFC 9112 section 3.2
            self._refuse(400, "a request needs one Host header (HTTP/1.0: at most one)")
            return
        if self.parser.should_upgrade() and self._upgrade_with_body():  # the parser would read its body as requests
            self._refuse(400, "a request with Upgrade and a body is not served here: send it without Upgrade")
            return
        codings = [v.decode("latin-1").lower() for k, v in self.headers if k.lower() == b"transfer-encoding"]
        unknown = {c.strip() for coding in codings for c in coding.split(",")} - {"chunked", ""}
        if unknown:  # RFC 9112: a transfer coding the server does not know is 501, not read as the body
            self._refuse(501, f"transfer coding {', '.join(sorted(unknown))} is not supported: send the body plainly")
            return
        super().on_headers_complete()

    def _upgrade_with_body(self) -> bool:
        """Whether a request the parser takes for an upgrade (which it reads no body of) has one, or is CONNECT."""
        if self.parser.get_method() == b"CONNECT":
            return True
        framing = {k.lower(): v.strip() for k, v in self.headers}
        return b"transfer-encoding" in framing or framing.get(b"content-length", b"0") != b"0"

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers, self._header_bytes, self._trailer_bytes = True, 0, 0  # a next request may follow
        self._beyond_body, self._chunks, self._messages = 0, 0, self._messages + 1


def protocol_class(limits: Limits, on_refused: Callable[[int], None] | None = None) -> type[GuardedProtocol]:
    """GuardedProtocol with `limits`, for uvicorn.Config(http=...); `on_refused(status)` counts the requests it
    answers itself (the app's metrics never see them)."""
    fields: dict[str, Any] = {"limits": limits}
    if on_refused is not None:
        fields["on_refused"] = staticmethod(on_refused)
    return type("GuardedProtocol", (GuardedProtocol,), fields)
