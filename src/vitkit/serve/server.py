"""Running the app under uvicorn: SIGTERM (or Ctrl-C) stops accepting connections, lets the requests
in flight finish (up to `drain_timeout_s`), finishes the queued batches (again up to `drain_timeout_s`), and exits 0."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from vitkit.serve.app import create_app
from vitkit.serve.config import ServeConfig
from vitkit.serve.protocol import Limits, protocol_class

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def uvicorn_config(app: Any, config: ServeConfig) -> Any:
    """uvicorn's settings for `app`: our protocol (bounded headers, header clock, connection limit, JSON errors:
    serve/protocol.py), no WebSockets, and idle keep-alive connections closed after 5 s."""
    import uvicorn

    limits = Limits(
        max_header_bytes=config.max_header_bytes,
        header_timeout_s=config.header_timeout_s,
        max_connections=config.max_connections,
    )
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        lifespan="on",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=config.drain_timeout_s,
        log_level="info",
        ws="none",
        http=protocol_class(limits, on_refused=app.state.service.metrics.observe_refused),
        timeout_keep_alive=5,
    )


BIND_HINTS = {
    errno.EADDRINUSE: "another process holds that port: choose another --port, or stop it",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: see --host",
    errno.EACCES: "ports below 1024 need privileges here: choose a --port of 1024 or above",
}


def check_address(host: str, port: int) -> None:
    """Refuses an address the server could not bind, before the model loads: uvicorn binds after its
    start-up and says only the socket error.  Binds each address `host` resolves to, as asyncio does."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ValueError(
            f"--host {host}: {error.strerror}; give an address or name of this machine "
            "(127.0.0.1 for this machine only, 0.0.0.0 for every interface)"
        ) from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                hint = BIND_HINTS.get(error.errno, "see --host and --port")
                raise ValueError(f"cannot serve on {host} port {port}: {error.strerror}; {hint}") from None


def run_server(path: str | os.PathLike, config: ServeConfig) -> int:
    """Serve `path` until SIGTERM/SIGINT; returns the exit status (0 after a drain, 1 if the model failed to load)."""
    import uvicorn

    if not Path(path).exists():
        raise FileNotFoundError(f"{path} does not exist (expected a checkpoint or a run directory)")
    check_address(config.host, config.port)
    failures: list[str] = []
    server: uvicorn.Server | None = None

    def stop_on_load_failure(message: str) -> None:
        failures.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(path, config, on_load_failure=stop_on_load_failure)
    server = uvicorn.Server(uvicorn_config(app, config))
    # With --in-process the model thread releases the GIL inside every torch op and must win it back after
    # each one; with Python's default 5 ms switch interval it can wait that long behind the event loop.
    # Measured with 16 clients on the Fashion-MNIST model: 0.5 ms gave more images/s than 5 ms in 3 of 3
    # alternating rounds at one image per request (+10-90%), no difference at eight.  (The default model
    # process has its own interpreter; here only the batcher's thread waits on its pipe.)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(config.switch_interval_ms / 1000)
    # uvicorn re-raises the signal that stopped it once it has drained; with a no-op handler in place
    # that replay is harmless and the process exits 0 instead of dying by the signal.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in STOP_SIGNALS}
    try:
        server.run()
    except SystemExit as stop:  # uvicorn exits 1 itself when it cannot bind (port in use, bad host)
        return int(stop.code or 0) or 1
    finally:
        sys.setswitchinterval(interval)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failures:
        return 1
    cut = app.state.service.cut
    log.info(f"stopped: {cut} request(s) cut short when the drain timeout passed" if cut else "drained and stopped")
    return 0
