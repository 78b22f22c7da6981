"""A few seconds of fuzzing `vitkit serve` in the default suite (benchmarks/fuzz.py runs 10,000 requests): every
mutated request gets a proper answer, every error is JSON with a 4xx or 503 status, and nothing is logged as an
error."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httptools", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")

import request_targets  # noqa: E402 - after the skips


@pytest.fixture(scope="module")
def seed(tmp_path_factory) -> Path:
    path = request_targets.make_request_seed(tmp_path_factory.mktemp("fuzz-serve"))
    yield path
    request_targets.close()


def test_mutated_requests_get_json_errors_and_no_crash(seed: Path, tmp_path: Path) -> None:
    verdicts = Counter(request_targets.fuzz_request(seed, random.Random(i), tmp_path) for i in range(80))
    assert set(verdicts) == {"ok", "handled"} and verdicts["ok"] >= 5, verdicts


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),  # a TLS hello on the plain port
        (b"GET /health HTTP/1.1\r\nAuthorization: Bearer fuzz-token\r\n" + b"X: y\r\n" * 20_000 + b"\r\n", 431),
        (
            b"POST /v1/predict HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer fuzz-token\r\nContent-Type: image/png\r\n"
            b"Content-Length: 900000\r\n\r\n",
            413,
        ),
        (
            b"POST /v1/predict HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer fuzz-token\r\nContent-Type: image/png\r\n"
            b"Content-Length: 10\r\n\r\n12345",
            408,
        ),
    ],
)
def test_hostile_requests_are_refused_in_json(seed: Path, raw: bytes, status: int) -> None:
    server = request_targets.server_for(seed)
    answer = request_targets.exchange(server.port, raw, [])
    assert answer is not None and answer[0] == status and request_targets.judge(answer, "POST") == "handled"
