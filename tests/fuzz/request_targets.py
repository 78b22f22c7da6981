"""Fuzz target of `vitkit serve`: mutated HTTP requests sent as raw bytes to a live server.

The server is the real one (vitkit.serve.server.uvicorn_config: our protocol, the Starlette app, the
in-process engine with a tiny ViT) running in a thread of this process, with short clocks so a stalled
request is answered within a second.  A request is built from a seed (predict, explain, multipart,
health, ...) by changing its parts (method, path, query, headers, content type and length, body,
multipart parts) or its bytes (request_mutations.py); now and then it is sent slowly, abandoned
half-way, or sent as a burst of concurrent requests.  Every answer must be a proper HTTP response, every
error JSON `{"error"}` with a 4xx or 503 status; a 500, a non-JSON error, a hang, a connection closed
without an answer, or an ERROR in the server's log is unhandled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from data_targets import Unhandled
from request_mutations import encoded_image, multipart_form, mutate_request, serialise

TOKEN = "fuzz-token"
CLOCK_S = 0.5  # the server's header and body clocks
DEADLINE_S = 4 * CLOCK_S + 2.0  # an answer later than this is a hang
SEEDS = ("predict_png", "predict_jpeg", "explain", "explain_png", "multipart", "health", "metrics", "page")


# ------------------------------------------------------------------------------ seeds
def _request(method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"") -> dict:
    return {
        "method": method,
        "target": target,
        "headers": [("Host", "fuzz"), ("Authorization", f"Bearer {TOKEN}"), *headers],
        "body": body,
    }


def make_request_seed(workdir: Path) -> Path:
    """A tiny ViT checkpoint (D=32, L=2, P=8, 32 px, 3 classes) and one JSON file per seed request."""
    import torch

    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model(
        "vit_ti16", num_classes=3, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8, img_size=32
    )
    vitkit.save(model, workdir / "checkpoint", class_names=["cat", "dog", "bird"])
    png, jpeg = encoded_image("PNG", 40, 0), encoded_image("JPEG", 33, 1)
    form = multipart_form([("file", "a.png", png), ("file", "b.png", encoded_image("PNG", 20, 2))])
    seeds = {
        "predict_png": _request("POST", "/v1/predict?top_k=2", [("Content-Type", "image/png")], png),
        "predict_jpeg": _request("POST", "/v1/predict", [("Content-Type", "image/jpeg")], jpeg),
        "explain": _request("POST", "/v1/explain", [("Content-Type", "image/png")], png),
        "explain_png": _request("POST", "/v1/explain?format=png", [("Content-Type", "image/png")], png),
        "multipart": _request(
            "POST", "/v1/predict", [("Content-Type", "multipart/form-data; boundary=fuzzBoundary")], form
        ),
        "health": _request("GET", "/health", []),
        "metrics": _request("GET", "/metrics", []),
        "page": _request("GET", "/", []),
    }
    folder = workdir / "requests"
    folder.mkdir(parents=True, exist_ok=True)
    for name, seed in seeds.items():
        (folder / f"{name}.json").write_text(json.dumps({**seed, "body": seed["body"].hex()}))
    return folder


# ------------------------------------------------------------------------------ the server
class _ErrorLog(logging.Handler):
    """Collects ERROR records of the server's loggers (a request must never cause one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}"[:400])


class _Server:
    """`vitkit serve` of the seed's checkpoint in a thread of this process, on a free port."""

    def __init__(self, checkpoint: Path) -> None:
        import uvicorn

        from vitkit.serve.app import create_app
        from vitkit.serve.config import ServeConfig
        from vitkit.serve.server import uvicorn_config

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        config = ServeConfig(
            port=self.port,
            model_process=False,
            max_body_mb=0.5,
            max_files=8,
            max_queue=8,
            header_timeout_s=CLOCK_S,
            body_timeout_s=CLOCK_S,
            max_connections=48,
            max_wait_ms=1,
            token=TOKEN,
            decode_workers=1,
            threads=1,
        )
        self.server = uvicorn.Server(uvicorn_config(create_app(checkpoint, config), config))
        self.errors = _ErrorLog()
        for name in ("", "uvicorn", "uvicorn.error", "asyncio", "vitkit"):
            logging.getLogger(name).addHandler(self.errors)
        logging.getLogger("uvicorn").setLevel(logging.ERROR)
        self.thread = threading.Thread(target=asyncio.run, args=(self.server.serve(),), daemon=True, name="fuzz-serve")
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self._ready():
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the fuzzed server did not start: {self.errors.records}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        if not self.server.started:
            return False
        answer = exchange(self.port, serialise(_request("GET", "/health", [])), [])
        return answer is not None and answer[0] == 200

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        for name in ("", "uvicorn", "uvicorn.error", "asyncio", "vitkit"):
            logging.getLogger(name).removeHandler(self.errors)


_servers: dict[Path, _Server] = {}


def server_for(seed: Path) -> _Server:
    if seed not in _servers:
        _servers[seed] = _Server(seed.parent / "checkpoint")
    return _servers[seed]


def close() -> None:
    """Stop the servers this process started (the fuzz harness calls it when a reader is done)."""
    while _servers:
        _servers.popitem()[1].stop()


# ------------------------------------------------------------------------------ the wire
def exchange(port: int, data: bytes, pauses: list[float]) -> tuple[int, dict, bytes] | None:
    """Send `data` (split at len(pauses) places, pausing between), read the first final answer; None if the
    connection closed without one; raises Unhandled when none came within DEADLINE_S."""
    pieces = np.array_split(np.frombuffer(data, np.uint8), len(pauses) + 1) if data else [np.empty(0, np.uint8)]
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        try:
            for piece, pause in zip(pieces, [*pauses, 0.0], strict=False):
                sock.sendall(piece.tobytes())
                time.sleep(pause)
        except OSError:
            pass  # the server answered and closed early (431, 413): read what it said
        return _read_answer(sock, time.monotonic() + DEADLINE_S, data.startswith(b"HEAD "))


def _read_answer(sock: socket.socket, deadline: float, head: bool = False) -> tuple[int, dict, bytes] | None:
    """The first final answer on `sock` (no body after the headers of an answer to HEAD)."""
    received = b""
    while True:
        top, found, rest = received.partition(b"\r\n\r\n")
        if found:
            lines = top.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines[1:])}
            if 100 <= status < 200:  # 100 Continue: the final answer follows
                received = rest
                continue
            if head:
                return status, headers, b""
            if len(rest) >= int(headers.get("content-length", 0)):
                return status, headers, rest[: int(headers.get("content-length", 0))]
        if time.monotonic() > deadline:
            raise Unhandled(f"no complete answer within {DEADLINE_S} s (received {received[:120]!r})")
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            continue
        if not chunk:
            if received:
                raise Unhandled(f"the connection closed inside an answer: {received[:200]!r}")
            return None
        received += chunk


# ------------------------------------------------------------------------------ judging an answer
def judge(answer: tuple[int, dict, bytes] | None, method: str) -> str:
    """ "ok" for a 2xx/3xx answer, "handled" for a JSON 4xx or 503 + Retry-After; Unhandled otherwise."""
    if answer is None:
        raise Unhandled("the server closed the connection without an answer")
    status, headers, body = answer
    if status < 400:
        return "ok"
    if status >= 500 and status != 503:
        raise Unhandled(f"status {status}: {body[:300]!r}")
    if status == 503 and "retry-after" not in headers:
        raise Unhandled(f"503 without Retry-After: {body[:200]!r}")
    if method == "HEAD" and not body:
        return "handled"
    try:
        error = json.loads(body)["error"] if headers.get("content-type") == "application/json" else None
    except (ValueError, KeyError, TypeError):
        error = None
    if not isinstance(error, str) or not error:
        raise Unhandled(f"status {status} without a JSON error ({headers.get('content-type')}): {body[:200]!r}")
    return "handled"


def _abandon(port: int, data: bytes, rng: random.Random) -> str:
    """Send part of a request and leave without reading (the server must take it calmly)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as sock:
        sock.sendall(data[: rng.randrange(len(data) + 1)])
        time.sleep(rng.choice([0.0, 0.02]))
    return "handled"


def _one(server: _Server, seed: dict, rng: random.Random) -> str:
    data, method = mutate_request(seed, rng)
    if rng.random() < 0.03:
        return _abandon(server.port, data, rng)
    slow = rng.random() < 0.03
    pauses = [rng.uniform(0.05, 0.4) for _ in range(rng.randint(1, 3))] if slow else []
    answer = exchange(server.port, data, pauses)
    if not data and answer is None:  # nothing sent: the header clock closes the connection without a word
        return "handled"
    return judge(answer, method)


def fuzz_request(seed: Path, rng: random.Random, workdir: Path) -> str:
    """One mutated request (now and then sent slowly), or a burst of 24 at once; then the server's log is checked."""
    server = server_for(seed)
    seeds = [json.loads(path.read_text()) for path in sorted(seed.glob("*.json"))]
    seeds = [{**s, "body": bytes.fromhex(s["body"]), "headers": [tuple(h) for h in s["headers"]]} for s in seeds]
    before = len(server.errors.records)
    if rng.random() < 0.02:  # a flood: more requests at once than the server admits
        rngs = [random.Random(rng.getrandbits(64)) for _ in range(24)]
        with ThreadPoolExecutor(24) as pool:
            verdicts = list(pool.map(lambda r: _one(server, r.choice(seeds), r), rngs))
        verdict = "handled" if "handled" in verdicts else "ok"
    else:
        verdict = _one(server, rng.choice(seeds), rng)
    if len(server.errors.records) > before:
        raise Unhandled(f"the server logged an error: {server.errors.records[before]}")
    if not server.thread.is_alive():
        raise Unhandled("the server thread died")
    return verdict


READERS: dict[str, tuple[Callable[[Path], Path], Callable[[Path, random.Random, Path], str]]] = {
    "requests": (make_request_seed, fuzz_request),
}
