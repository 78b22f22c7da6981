"""Mutated HTTP requests for the `vitkit serve` fuzz target (request_targets.py), as the bytes sent.

A request is a dict (method, target, headers, body).  `mutate_request` changes one to three of its parts
(method, path and query, headers, content type and length, body, multipart parts), serialises it, and
now and then damages the bytes as a whole.  Everything is drawn from the `random.Random` passed in, so
a request is reproduced from its seed.
"""

from __future__ import annotations

import io
import random

import numpy as np
from mutations import mutate_bytes, mutate_png
from PIL import Image


# ------------------------------------------------------------------------------ building blocks
def encoded_image(fmt: str, side: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def multipart_form(files: list[tuple[str, str, bytes]], boundary: str = "fuzzBoundary") -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{name}"\r\n'
        f"Content-Type: image/png\r\n\r\n".encode()
        + data
        + b"\r\n"
        for field, name, data in files
    ]
    return b"".join(parts) + f"--{boundary}--\r\n".encode()


def serialise(request: dict, length: int | None = None) -> bytes:
    head = [f"{request['method']} {request['target']} HTTP/1.1"]
    head += [f"{name}: {value}" for name, value in request["headers"]]
    body = request["body"]
    if request["method"] in ("POST", "PUT", "PATCH") or body:
        head.append(f"Content-Length: {len(body) if length is None else length}")
    return "\r\n".join(head).encode("latin-1", "replace") + b"\r\n\r\n" + body


# ------------------------------------------------------------------------------ mutations
METHODS = ["GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE", "PATCH", "TRACE", "CONNECT", "G\x00T", "POSTPOST"]
PATHS = [
    "/",
    "/health",
    "/metrics",
    "/v1/predict",
    "/v1/explain",
    "/v1/predict/",
    "//v1/predict",
    "/v1/%70redict",
    "/v1/predict/../explain",
    "*",
    "/" + "a" * 5000,
    "/%ff%fe",
    "/v1/pr\u00e9dict",
    "http://fuzz/v1/predict",
]
QUERIES = [
    "",
    "?top_k=1",
    "?top_k=0",
    "?top_k=-3",
    "?top_k=99999999999999999999",
    "?top_k=x",
    "?format=png",
    "?format=gif",
    "?top_k=1&top_k=2",
    "?" + "q=1&" * 2000,
    "?%zz",
    "?format=png&top_k=3",
]
CONTENT_TYPES = [
    "image/png",
    "image/jpeg",
    "image/",
    "IMAGE/PNG",
    "multipart/form-data",
    "text/plain",
    "application/json",
    "multipart/form-data; boundary=",
    "multipart/form-data; boundary=fuzzBoundary",
    "multipart/form-data; boundary=" + "b" * 300,
    "multipart/mixed; boundary=fuzzBoundary",
    "",
    ";;;",
    "image/png; charset=\xff",
]


def _many_parts(rng: random.Random, body: bytes) -> bytes:
    count = rng.choice([0, 1, 9, 50, 500])
    name = rng.choice(["file", "file", "other", "", 'fi"le', "x" * 300])
    filename = rng.choice(["a.png", "", "../../etc/passwd", "é.png", "x" * 2000, "a\r\nb.png"])
    files = [(name, filename, body if k % 2 == 0 else mutate_bytes(body, rng)) for k in range(count)]
    form = multipart_form(files)
    if rng.random() < 0.3:  # a text field among the files, or a damaged form
        form = b'--fuzzBoundary\r\nContent-Disposition: form-data; name="file"\r\n\r\ntext\r\n' + form
    return mutate_bytes(form, rng, 1) if rng.random() < 0.3 else form


def _mutate_body(rng: random.Random, request: dict) -> None:
    body, choice = request["body"], rng.randrange(6)
    if choice == 0 and body.startswith(b"\x89PNG"):
        request["body"] = mutate_png(body, rng)
    elif choice == 1:
        request["body"] = mutate_bytes(body, rng)
    elif choice == 2:
        image = body if body.startswith((b"\x89PNG", b"\xff\xd8")) else encoded_image("PNG", 16, 3)
        request["body"] = _many_parts(rng, image)
        request["headers"].append(("Content-Type", "multipart/form-data; boundary=fuzzBoundary"))
    elif choice == 3:
        request["body"] = rng.choice([b"", rng.randbytes(rng.randint(1, 3000)), b"\0" * (600 << 10)])
    elif choice == 4:  # a PNG claiming a huge image (a decompression bomb header)
        request["body"] = mutate_png(encoded_image("PNG", 8, 4), random.Random(rng.getrandbits(32)))


def _mutate_headers(rng: random.Random, request: dict) -> None:
    headers, choice = request["headers"], rng.randrange(7)
    if choice == 0:
        headers.append(("Content-Type", rng.choice(CONTENT_TYPES)))
    elif choice == 1 and headers:
        del headers[rng.randrange(len(headers))]
    elif choice == 2:
        headers.append(
            rng.choice(
                [
                    ("Authorization", "Bearer wrong"),
                    ("Authorization", ""),
                    ("Expect", "100-continue"),
                    ("Transfer-Encoding", "chunked"),
                    ("Connection", "close"),
                    ("Connection", "upgrade"),
                    ("Upgrade", "websocket"),
                    ("Content-Encoding", "gzip"),
                    ("X-Big", "v" * 70_000),
                    ("Content-Length", "12"),
                    ("Content-Length", "-1"),
                    ("Content-Length", "x"),
                ]
            )
        )
    elif choice == 3:
        headers.extend([("X-Many", "y")] * rng.choice([100, 3000]))
    elif choice == 4:
        headers.append((rng.choice(["X", "Bad Name", "\x7fH", ""]), rng.choice(["\x01", "v", "é", "a\rb"])))
    elif choice == 5:
        headers[:] = [
            ("Authorization", value) if name == "Authorization" else (name, value)
            for name, value in headers
            for value in [mutate_bytes(value.encode(), rng, 1).decode("latin-1")]
        ]


def mutate_request(seed: dict, rng: random.Random) -> tuple[bytes, str]:
    """The bytes of one mutated request, and its method as sent."""
    request = {**seed, "headers": list(seed["headers"])}
    for _ in range(rng.randint(1, 3)):
        part = rng.randrange(4)
        if part == 0:
            request["method"] = rng.choice(METHODS)
        elif part == 1:
            request["target"] = rng.choice(PATHS) + rng.choice(QUERIES)
        elif part == 2:
            _mutate_headers(rng, request)
        else:
            _mutate_body(rng, request)
    length = None if rng.random() < 0.85 else rng.choice([0, 1, len(request["body"]) + rng.randint(-20, 20), 1 << 40])
    data = serialise(request, length)
    return (mutate_bytes(data, rng) if rng.random() < 0.15 else data), request["method"]
