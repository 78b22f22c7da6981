"""`ServeConfig`: every knob of `vitkit serve`, with the safe defaults (loopback only, bounded bodies,
bounded queue)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vitkit.data.images import MAX_PIXELS

MAX_BATCH = 1024  # --max-batch at most: a batch this size is run to warm up, memory and all


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How `vitkit serve` listens, batches and protects itself."""

    host: str = "127.0.0.1"  # loopback only unless asked otherwise
    port: int = 8000
    device: str = "auto"  # "auto" = CUDA when available
    max_batch: int = 32  # images per model forward at most
    max_wait_ms: float = 5.0  # how long the first image of a batch waits for company
    max_body_mb: float = 8.0  # request body limit (MiB), enforced while the body streams in
    # request bodies held at once, all requests (MiB; None: max(256, 4 x max_body_mb)); more: 503
    max_bodies_mb: float | None = None
    token: str | None = None  # when set, every route but the page needs "Authorization: Bearer TOKEN"
    max_queue: int = 256  # requests admitted at once (reading, decoding, waiting, running); more get 503 + Retry-After
    max_files: int = 32  # images in one multipart request
    max_pixels: int = MAX_PIXELS  # decompression-bomb guard: larger images are refused from their header
    body_timeout_s: float = 30.0  # a body not fully received by then gets 408 (a stalled client frees its place)
    max_header_bytes: int = 64 * 1024  # request line + headers of one request; more gets 431 (serve/protocol.py)
    header_timeout_s: float = 10.0  # a request whose headers take longer gets 408 (slow senders free their connection)
    max_connections: int = 512  # open connections served at once; a request on one beyond gets 503 + Retry-After
    threads: int | None = None  # torch intra-op threads of the model forward; None = torch's default
    decode_workers: int = 2  # threads that decode images off the event loop
    drain_timeout_s: float = 30.0  # SIGTERM: the longest wait for requests in flight before exiting
    model_process: bool = True  # the model (decoding, forward, rollout) in a child process; False: a thread of this one
    switch_interval_ms: float = 0.5  # Python's GIL switch interval in the server process (default 5 ms)

    def __post_init__(self) -> None:
        at_least_one = ("max_batch", "max_queue", "max_files", "max_pixels", "decode_workers", "max_header_bytes")
        for name in (*at_least_one, "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{_named(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("max_body_mb", "switch_interval_ms", "body_timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{_named(name)} must be above 0, got {getattr(self, name):g}")
        for name in ("max_wait_ms", "drain_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{_named(name)} must be 0 or more, got {getattr(self, name):g}")
        if self.max_bodies_mb is not None and self.max_bodies_mb < 2 * self.max_body_mb:  # a form: body + files
            raise ValueError(
                f"--max-bodies-mb ({self.max_bodies_mb:g}) must be at least twice --max-body-mb "
                f"({self.max_body_mb:g}): a form is held with the files parsed out of it, and one of the largest "
                "must fit"
            )
        if self.max_batch > MAX_BATCH:  # a full batch is warmed up before /health says ready
            raise ValueError(
                f"--max-batch must be at most {MAX_BATCH}, got {self.max_batch}: one forward of that many images "
                f"runs at start-up (a form brings at most {self.max_files})"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")
        if self.token is not None and not re.fullmatch(r"[\x21-\x7e]+", self.token):  # what a browser sends as is
            raise ValueError("--token must be one or more visible ASCII characters (no spaces), and not empty")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)

    @property
    def max_bodies_bytes(self) -> int:
        megabytes = self.max_bodies_mb if self.max_bodies_mb is not None else max(256.0, 4 * self.max_body_mb)
        return int(megabytes * 1024 * 1024)


FLAGS = frozenset({"max_batch", "max_wait_ms", "max_body_mb", "max_bodies_mb", "max_queue", "max_pixels", "threads"})
FLAGS |= {"decode_workers", "port", "token"}  # the fields `vitkit serve` sets by a flag of the same name


def _named(field: str) -> str:
    """A field as the user set it: `vitkit serve`'s flag, or the ServeConfig field where no flag sets it."""
    return f"--{field.replace('_', '-')}" if field in FLAGS else f"ServeConfig.{field}"
