"""Every refusal of `vitkit serve` in-process: 400, 401, 404/405, 413, 415, 422, 500, 503, each as
JSON {"error"}, and the server keeps answering after each."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from serve_helpers import metric, png_bytes, serving  # noqa: E402 - after the skips

from vitkit.runs import open_checkpoint  # noqa: E402
from vitkit.serve.app import create_app  # noqa: E402
from vitkit.serve.body import Upload  # noqa: E402
from vitkit.serve.config import ServeConfig  # noqa: E402
from vitkit.serve.engine import Encoded  # noqa: E402
from vitkit.serve.model import ServedModel  # noqa: E402
from vitkit.serve.worker import ModelProcessError, ProcessEngine  # noqa: E402

PNG = {"Content-Type": "image/png"}


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height pixels, followed by a tiny compressed row of zeros."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def post_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    """The ASGI scope of a POST from a client on loopback (for driving the app's receive by hand)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


def _run(checkpoint: Path, config: ServeConfig, requests, **app_options):
    """Send `requests(client)` to a fresh app, then one good request that must still succeed."""

    async def scenario():
        async with serving(create_app(checkpoint, config, **app_options)) as client:
            result = await requests(client)
            good = await client.post("/v1/predict", content=png_bytes(32, 32), headers={**PNG, **_auth(config)})
            assert good.status_code == 200 and len(good.json()["predictions"]) == 3
            return result

    return asyncio.run(scenario())


def _auth(config: ServeConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.token}"} if config.token else {}


def _assert_error(response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert all(word in message for word in words), message


def test_bad_bodies_parameters_and_routes(vit_checkpoint: Path) -> None:
    async def requests(client):
        return {
            "garbage": await client.post("/v1/predict", content=b"\x89PNG but not really", headers=PNG),
            "truncated": await client.post("/v1/predict", content=png_bytes(40, 40)[:120], headers=PNG),
            "empty": await client.post("/v1/predict", content=b"", headers=PNG),
            "text": await client.post("/v1/predict", content=b"hello", headers={"Content-Type": "text/plain"}),
            "json": await client.post("/v1/explain", content=b"{}", headers={"Content-Type": "application/json"}),
            "no type": await client.post("/v1/predict", content=png_bytes(8, 8), headers={"Content-Type": ""}),
            "top_k": await client.post("/v1/predict?top_k=0", content=png_bytes(8, 8), headers=PNG),
            "top_k text": await client.post("/v1/predict?top_k=two", content=png_bytes(8, 8), headers=PNG),
            # str.isdigit() takes a superscript two that int() refuses, and int() refuses 5,000 digits: both were 500s
            "top_k ²": await client.post("/v1/predict?top_k=%C2%B2", content=png_bytes(8, 8), headers=PNG),
            "top_k ٣": await client.post("/v1/predict?top_k=%D9%A3", content=png_bytes(8, 8), headers=PNG),
            "top_k long": await client.post("/v1/predict?top_k=" + "1" * 5000, content=png_bytes(8, 8), headers=PNG),
            "format": await client.post("/v1/explain?format=gif", content=png_bytes(8, 8), headers=PNG),
            "unknown": await client.get("/v2/predict"),
            "method": await client.get("/v1/predict"),
        }

    got = _run(vit_checkpoint, ServeConfig(), requests)
    _assert_error(got["garbage"], 400, "not a readable image")
    _assert_error(got["truncated"], 400, "corrupt or truncated")
    _assert_error(got["empty"], 400, "empty body")
    for name in ("text", "json", "no type"):
        _assert_error(got[name], 415, "unsupported content type")
    _assert_error(got["top_k"], 400, "top_k")
    for name in ("top_k text", "top_k ²", "top_k ٣", "top_k long"):
        _assert_error(got[name], 400, "top_k must be a positive integer")
    _assert_error(got["format"], 400, "format")
    _assert_error(got["unknown"], 404)
    _assert_error(got["method"], 405)


def test_multipart_mistakes(vit_checkpoint: Path) -> None:
    image = png_bytes(16, 16)

    async def requests(client):
        three = [("file", (f"{i}.png", image, "image/png")) for i in range(3)]
        return {
            "no file": await client.post("/v1/predict", files=[("image", ("a.png", image, "image/png"))]),
            "text field": await client.post("/v1/predict", data={"file": "not a file"}, files=[("other", ("a", b"x"))]),
            "too many": await client.post("/v1/predict", files=three),
            "png of two": await client.post("/v1/explain?format=png", files=three[:2]),
            "bad second": await client.post(
                "/v1/predict", files=[three[0], ("file", ("broken.png", b"junk", "image/png"))]
            ),
            "both bad": await client.post(
                "/v1/predict", files=[("file", (f"broken{i}.png", b"junk", "image/png")) for i in range(2)]
            ),
            "unclosed second": await client.post(  # the closed first part was served as the whole form
                "/v1/predict",
                content=b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n'
                + image
                + b'\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="b.png"\r\n\r\n'
                + image,
                headers={"Content-Type": "multipart/form-data; boundary=b"},
            ),
            "unclosed, named --b--": await client.post(  # the closing delimiter's text, but not on a line of its own
                "/v1/predict",
                content=b'--b\r\nContent-Disposition: form-data; name="file"; filename="--b--.png"\r\n\r\n' + image,
                headers={"Content-Type": "multipart/form-data; boundary=b"},
            ),
            "unclosed": await client.post(  # a 'file' part, but no closing boundary: the form was reported empty
                "/v1/predict",
                content=b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n' + image,
                headers={"Content-Type": "multipart/form-data; boundary=b"},
            ),
        }

    got = _run(vit_checkpoint, ServeConfig(max_files=2), requests)
    _assert_error(got["no file"], 400, "no 'file' field")
    _assert_error(got["text field"], 400, "not a file upload")
    _assert_error(got["too many"], 413, "more than 2 parts in one form: send at most 2 images a request")
    _assert_error(got["png of two"], 400, "format=png")
    # a form answers each file, as `vitkit predict` does; one bad file had failed the whole request
    assert got["bad second"].status_code == 200
    good, bad = got["bad second"].json()["results"]
    assert good["file"] == "0.png" and len(good["predictions"]) == 3 and "error" not in good  # its 3 classes
    assert bad["file"] == "broken.png" and "broken.png" in bad["error"] and "predictions" not in bad
    _assert_error(got["both bad"], 400, "broken0.png")  # no file decodes: the request fails
    for name in ("unclosed", "unclosed second", "unclosed, named --b--"):
        _assert_error(got[name], 400, "malformed multipart form", "no closing boundary")


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_body_limit_and_decompression_bombs(vit_checkpoint: Path) -> None:
    big = png_bytes(200, 200)  # ~120 KB of noise
    assert len(big) > 64 * 1024

    async def requests(client):
        return {
            "big": await client.post("/v1/predict", content=big, headers=PNG),
            "big form": await client.post("/v1/predict", files=[("file", ("big.png", big, "image/png"))]),
            "bomb": await client.post("/v1/predict", content=_bomb_png(12_000, 12_000), headers=PNG),
            "huge bomb": await client.post("/v1/predict", content=_bomb_png(100_000, 100_000), headers=PNG),
            "over max_pixels": await client.post("/v1/predict", content=png_bytes(80, 80), headers=PNG),
        }

    got = _run(vit_checkpoint, ServeConfig(max_body_mb=1 / 16, max_pixels=64 * 64), requests)
    _assert_error(got["big"], 413, "exceeds the limit of 65,536 bytes")
    _assert_error(got["big form"], 413, "exceeds the limit")
    _assert_error(got["bomb"], 413, "12000x12000", "decompression bomb")
    _assert_error(got["huge bomb"], 413, "decompression bomb")  # Pillow's own refusal, over twice its limit
    _assert_error(got["over max_pixels"], 413, "80x80")


def test_an_oversized_body_is_refused_before_it_is_read_whole(vit_checkpoint: Path) -> None:
    """No Content-Length (chunked): the app stops pulling chunks once the limit is passed."""
    chunk, limit = 4096, 64 * 1024
    pulled, sent = [], []

    async def receive():
        pulled.append(chunk)
        return {"type": "http.request", "body": b"\0" * chunk, "more_body": len(pulled) < 1000}  # a 4 MB body

    async def send(message):
        sent.append(message)

    async def scenario():
        app = create_app(vit_checkpoint, ServeConfig(max_body_mb=limit / 2**20, model_process=False))
        async with serving(app):
            await app(
                post_scope("/v1/predict", [(b"content-type", b"image/png"), (b"transfer-encoding", b"chunked")]),
                receive,
                send,
            )

    asyncio.run(scenario())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert len(pulled) == limit // chunk + 1  # 17 of the 1000 chunks: stopped at the first one past the limit


def test_a_stalled_body_gets_408_and_frees_its_place(vit_checkpoint: Path) -> None:
    sent = []

    async def receive():
        if not sent:
            await asyncio.sleep(3600)  # a client that sends its headers and then nothing
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def scenario():
        app = create_app(vit_checkpoint, ServeConfig(body_timeout_s=0.2, max_queue=1, model_process=False))
        async with serving(app) as client:
            chunked = [(b"content-type", b"image/png"), (b"transfer-encoding", b"chunked")]
            await asyncio.wait_for(app(post_scope("/v1/predict", chunked), receive, send), 10)
            return await client.post(
                "/v1/predict", content=png_bytes(32, 32), headers=PNG
            )  # the one place is free again

    after = asyncio.run(scenario())
    assert sent[0]["status"] == 408 and b"did not arrive within 0.2 s" in sent[1]["body"]
    assert (b"connection", b"close") in sent[0]["headers"]  # the rest of its body is not waited for on this connection
    assert after.status_code == 200


def test_every_answer_before_the_whole_body_closes_its_connection(vit_checkpoint: Path) -> None:
    """The token's 401, the router's 404/405 and a GET's 200 with a body kept the connection open: a body
    trickling in after them was read, and dropped, for as long as the client went on."""
    config = ServeConfig(token="s3cret", model_process=False)

    async def scenario():
        async with serving(create_app(vit_checkpoint, config), headers={"Authorization": "Bearer s3cret"}) as client:
            return [
                await client.post("/v1/predict", content=b"x", headers={**PNG, "Authorization": "Bearer no"}),  # 401
                await client.post("/nope", content=b"x"),  # 404
                await client.post("/health", content=b"x"),  # 405
                await client.post("/v1/predict?top_k=0", content=b"x", headers=PNG),  # 400
                await client.request("GET", "/health", content=b"x"),  # 200, its body never read
                await client.get("/nope"),  # no body: kept open
                await client.post("/v1/predict", content=png_bytes(8, 8), headers=PNG),  # read whole: kept open
            ]

    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [401, 404, 405, 400, 200, 404, 200]
    assert [a.headers.get("connection") for a in answers] == ["close"] * 5 + [None, None]


def test_a_declared_length_holds_no_memory_until_its_bytes_arrive(vit_checkpoint: Path) -> None:
    """Headers that declare a body and send none reserved its whole length: 32 such connections kept every
    request out with 503 for as long as the body clock ran."""
    sent = []

    async def receive():
        await asyncio.sleep(3600)  # the headers, then nothing

    async def send(message):
        sent.append(message)

    async def scenario():
        limits = dict(max_body_mb=4000 / 2**20, max_bodies_mb=8000 / 2**20, body_timeout_s=5)
        config = ServeConfig(**limits, model_process=False)
        app = create_app(vit_checkpoint, config)
        async with serving(app) as client:
            headers = [(b"content-type", b"image/png"), (b"content-length", b"4000")]
            idle = asyncio.ensure_future(app(post_scope("/v1/predict", headers), receive, send))
            await asyncio.sleep(0.05)
            held = app.state.service.bodies.held
            answer = await client.post("/v1/predict", content=png_bytes(32, 32), headers=PNG)  # about 3.1 KB
            idle.cancel()
            return held, answer

    held, answer = asyncio.run(scenario())
    assert held == 0 and answer.status_code == 200


def test_a_client_that_leaves_mid_body_is_no_internal_error(vit_checkpoint: Path, caplog) -> None:
    messages = [{"type": "http.request", "body": b"\x89PNG", "more_body": True}, {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def scenario():
        app = create_app(vit_checkpoint, ServeConfig(model_process=False))
        async with serving(app) as client:
            await app(post_scope("/v1/predict", [(b"content-type", b"image/png")]), receive, send)
            return (await client.get("/metrics")).text

    text = asyncio.run(scenario())
    assert sent[0]["status"] == 400 and b"disconnected" in sent[1]["body"]
    assert not [r for r in caplog.records if r.levelno >= 40]  # nothing logged as an error
    assert metric(text, "vitkit_requests_total", route="/v1/predict", status="500") == 0


def test_token_guards_every_route_but_the_page(vit_checkpoint: Path) -> None:
    config = ServeConfig(token="s3cret", model_process=False)

    async def requests(client):
        image = png_bytes(16, 16)
        return {
            "page": await client.get("/"),
            "health": await client.get("/health"),
            "metrics": await client.get("/metrics"),
            "predict": await client.post("/v1/predict", content=image, headers=PNG),
            "wrong": await client.post("/v1/predict", content=image, headers={**PNG, "Authorization": "Bearer s3cre"}),
            "basic": await client.post("/v1/predict", content=image, headers={**PNG, "Authorization": "Basic s3cret"}),
            "right": await client.post("/v1/predict", content=image, headers={**PNG, "Authorization": "Bearer s3cret"}),
            "right health": await client.get("/health", headers={"Authorization": "Bearer s3cret"}),
        }

    async def scenario():  # readiness is polled with the token
        app = create_app(vit_checkpoint, config)
        async with serving(app, wait_ready=False, headers={}) as client:
            for _ in range(400):
                if (await client.get("/health", headers=_auth(config))).status_code == 200:
                    break
                await asyncio.sleep(0.025)
            return await requests(client)

    got = asyncio.run(scenario())
    assert got["page"].status_code == 200 and got["page"].headers["content-type"].startswith("text/html")
    for name in ("health", "metrics", "predict", "wrong", "basic"):
        _assert_error(got[name], 401, "bearer token")
        assert got[name].headers["www-authenticate"] == "Bearer"
    assert got["right"].status_code == 200 and got["right health"].status_code == 200


def test_the_page_is_self_contained(vit_checkpoint: Path) -> None:
    async def requests(client):
        return await client.get("/")

    page = _run(vit_checkpoint, ServeConfig(model_process=False), requests)
    text = page.text
    assert "<script" in text and 'id="file"' in text and 'id="overlay"' in text
    for external in ("http://", "https://", "//cdn", "<link", 'src="/', "@import"):
        assert external not in text, external  # nothing fetched from elsewhere: works offline
    assert "default-src 'none'" in page.headers["content-security-policy"]


class _Gated(ServedModel):
    """A served model whose forwards wait for `gate` (open during the warm-up): requests stay in flight."""

    gate = threading.Event()

    def run(self, jobs):
        assert _Gated.gate.wait(timeout=30), "the test never opened the gate"
        return super().run(jobs)


def test_a_full_queue_answers_503_with_retry_after(vit_checkpoint: Path) -> None:
    _Gated.gate.set()

    def load(path, device):
        return _Gated(open_checkpoint(path), str(path), device)

    async def scenario():
        app = create_app(
            vit_checkpoint, ServeConfig(max_queue=2, max_batch=16, max_wait_ms=0, model_process=False), load=load
        )
        async with serving(app) as client:
            _Gated.gate.clear()  # loaded and warmed up: from now on the forward waits
            first = [
                asyncio.ensure_future(client.post("/v1/predict", content=png_bytes(32, 32, seed), headers=PNG))
                for seed in range(2)
            ]
            for _ in range(400):  # both admitted, held by the gated forward
                if metric((await client.get("/metrics")).text, "vitkit_requests_in_flight") == 2:
                    break
                await asyncio.sleep(0.005)
            refused = await client.post("/v1/predict", content=png_bytes(32, 32), headers=PNG)
            _Gated.gate.set()
            done = await asyncio.gather(*first)
            again = await client.post("/v1/predict", content=png_bytes(32, 32), headers=PNG)
            return refused, done, again

    try:
        refused, done, again = asyncio.run(scenario())
    finally:
        _Gated.gate.set()
    _assert_error(refused, 503, "busy")
    assert refused.headers["retry-after"] == "1"
    assert [r.status_code for r in done] == [200, 200] and again.status_code == 200


class _FailingOnce(ServedModel):
    """A served model whose next forward raises once `fail` is set (after the warm-up)."""

    fail = False

    def run(self, jobs):
        if _FailingOnce.fail:
            _FailingOnce.fail = False
            raise RuntimeError("simulated failure inside the forward")
        return super().run(jobs)


def test_request_bodies_in_memory_are_bounded_over_all_requests(vit_checkpoint: Path) -> None:
    _Gated.gate.set()
    body = png_bytes(32, 32)  # about 3.1 KB
    config = ServeConfig(
        max_body_mb=4000 / 2**20, max_bodies_mb=8000 / 2**20, max_batch=16, max_wait_ms=0, model_process=False
    )

    async def scenario():
        app = create_app(
            vit_checkpoint, config, load=lambda path, device: _Gated(open_checkpoint(path), str(path), device)
        )
        async with serving(app) as client:
            _Gated.gate.clear()
            first = [asyncio.ensure_future(client.post("/v1/predict", content=body, headers=PNG)) for _ in range(2)]
            for _ in range(400):  # both bodies held while the gated forward waits
                if app.state.service.bodies.held == 2 * len(body):
                    break
                await asyncio.sleep(0.005)
            refused = await client.post("/v1/predict", content=body, headers=PNG)
            _Gated.gate.set()
            done = await asyncio.gather(*first)
            return refused, done, app.state.service.bodies.held

    try:
        refused, done, held = asyncio.run(scenario())
    finally:
        _Gated.gate.set()
    _assert_error(refused, 503, "bytes of request bodies held in memory")
    assert refused.headers["retry-after"] == "1" and [r.status_code for r in done] == [200, 200] and held == 0
    for bodies in (4, 15):  # a form holds its body and the files parsed out of it at once: twice the body
        with pytest.raises(ValueError, match=rf"--max-bodies-mb \({bodies}\) must be at least twice --max-body-mb"):
            ServeConfig(max_body_mb=8, max_bodies_mb=bodies)
    assert ServeConfig(max_body_mb=8, max_bodies_mb=16).max_bodies_bytes == 16 * 2**20


def test_a_failing_forward_is_a_json_500_and_the_server_goes_on(vit_checkpoint: Path) -> None:
    def load(path, device):
        return _FailingOnce(open_checkpoint(path), str(path), device)

    async def requests(client):
        _FailingOnce.fail = True
        return await client.post("/v1/predict", content=png_bytes(32, 32), headers=PNG)

    failed = _run(vit_checkpoint, ServeConfig(max_wait_ms=0, model_process=False), requests, load=load)
    _assert_error(failed, 500, "internal error", "RuntimeError")


class _ExitOnArrival:
    """A payload whose unpickling ends the process that receives it: the model process dies inside a batch."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_dead_model_process_fails_only_its_batch_and_is_restarted(vit_checkpoint: Path) -> None:
    engine = ProcessEngine(vit_checkpoint, ServeConfig())
    image = Encoded(Upload("a.png", png_bytes(32, 32)))
    try:
        before = engine.run([image])[0].probabilities
        first = engine.pid
        with pytest.raises(ModelProcessError, match=r"died in this batch \(exit code 3\) and was restarted"):
            engine.run([_ExitOnArrival()])
        second = engine.pid
        # A new process times the fused dense + GELU kernel afresh (models/kernels.py): on a loaded host it may
        # choose the other path, whose answers agree to float32 rounding (~3e-7), so equal to 1e-6, not bitwise.
        assert second != first and np.allclose(engine.run([image])[0].probabilities, before, rtol=0, atol=1e-6)
        os.kill(second, signal.SIGKILL)  # killed between batches: the next batch gets a new process, no error
        while engine._process.is_alive():
            time.sleep(0.01)
        again = engine.run([image])[0].probabilities
        assert np.allclose(again, before, rtol=0, atol=1e-6) and engine.pid not in (first, second)
    finally:
        engine.close()


def test_a_dead_model_process_is_a_503_with_retry_after_and_the_server_goes_on(vit_checkpoint: Path) -> None:
    async def requests(client):
        service = client._transport.app.state.service
        service.engine._conn.send = lambda payloads: os.kill(
            service.engine.pid, signal.SIGKILL
        )  # dies with the batch in it
        # (the restarted process has a new pipe, with its own send)
        return await client.post("/v1/predict", content=png_bytes(32, 32), headers=PNG)  # then _run's good request

    failed = _run(vit_checkpoint, ServeConfig(max_wait_ms=0), requests)
    _assert_error(failed, 503, "model process died")
    assert failed.headers["retry-after"] == "1"


def test_the_decoding_limits_are_flags_of_serve() -> None:
    """--max-pixels and --decode-workers bound what decoding may take (docs/serving.md "Decoding memory");
    ServeConfig had them, the command did not."""
    from vitkit.cli import build_parser
    from vitkit.cli.serving import serve_config

    args = build_parser().parse_args(["serve", "run", "--max-pixels", "25000000", "--decode-workers", "1"])
    config = serve_config(args)
    assert (config.max_pixels, config.decode_workers) == (25_000_000, 1)
    default = serve_config(build_parser().parse_args(["serve", "run"]))
    assert (default.max_pixels, default.decode_workers) == (ServeConfig().max_pixels, 2)
    with pytest.raises(ValueError, match="--max-pixels must be at least 1, got 0"):
        serve_config(build_parser().parse_args(["serve", "run", "--max-pixels", "0"]))
    for flags, words in (  # each named every bound of several fields, two of them no flags
        (["--max-body-mb", "0"], "--max-body-mb must be above 0, got 0"),
        (["--max-wait-ms", "-1"], "--max-wait-ms must be 0 or more, got -1"),
    ):
        with pytest.raises(ValueError, match=f"^{words}$"):
            serve_config(build_parser().parse_args(["serve", "run", *flags]))
    with pytest.raises(ValueError, match="^ServeConfig.body_timeout_s must be above 0, got 0$"):
        ServeConfig(body_timeout_s=0)


def test_the_bearer_scheme_is_read_in_any_case(vit_checkpoint: Path) -> None:
    """RFC 7235: the scheme's name is case-insensitive; 'bearer TOKEN' was refused with 401."""
    config = ServeConfig(token="s3cret", model_process=False)

    async def scenario():
        async with serving(create_app(vit_checkpoint, config), headers={"Authorization": "Bearer s3cret"}) as client:
            answers = []
            for given in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret", "Basic s3cret", "Bearer s3cre", "s3cret"):
                response = await client.post(
                    "/v1/predict", content=png_bytes(8, 8), headers={**PNG, "Authorization": given}
                )
                answers.append(response.status_code)
            return answers

    assert asyncio.run(scenario()) == [200, 200, 200, 401, 401, 401]


def test_the_token_may_come_from_the_environment_where_ps_does_not_show_it(monkeypatch) -> None:
    from vitkit.cli import build_parser
    from vitkit.cli.serving import serve_config

    monkeypatch.delenv("VITKIT_SERVE_TOKEN", raising=False)
    assert serve_config(build_parser().parse_args(["serve", "run"])).token is None
    monkeypatch.setenv("VITKIT_SERVE_TOKEN", "s3cret")
    assert serve_config(build_parser().parse_args(["serve", "run"])).token == "s3cret"
    assert serve_config(build_parser().parse_args(["serve", "run", "--token", "flag"])).token == "flag"  # flag wins
    monkeypatch.setenv("VITKIT_SERVE_TOKEN", "")  # VITKIT_SERVE_TOKEN=$SECRET with SECRET unset: refused, not open
    with pytest.raises(ValueError, match="VITKIT_SERVE_TOKEN is set but empty"):
        serve_config(build_parser().parse_args(["serve", "run"]))


@pytest.mark.parametrize("token", ["", " ", "s3cr3t tök", "tab\there"])
def test_a_token_a_browser_cannot_send_or_an_empty_one_is_refused(token: str, monkeypatch) -> None:
    """--token "$TOKEN" with TOKEN unset served every route without authentication, with no word (a blank one
    was refused); a non-ASCII token worked with curl but never from the page, whose browser sends Latin-1."""
    from vitkit.cli import build_parser
    from vitkit.cli.serving import serve_config

    monkeypatch.delenv("VITKIT_SERVE_TOKEN", raising=False)
    with pytest.raises(ValueError, match="--token must"):
        serve_config(build_parser().parse_args(["serve", "run", "--token", token]))


def test_a_form_reserves_its_parsed_files_beside_its_body() -> None:
    """--max-bodies-mb counted a form's body only, while the files parsed out of it are a second copy held with
    it: 32 forms within the budget took the server process ~4x past it.  A form now reserves both."""
    from starlette.requests import Request

    from vitkit.serve.body import read_images

    image = png_bytes(32, 32)
    boundary = b"xyz"
    body = (
        b"".join(
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n'
            b"Content-Type: image/png\r\n\r\n" + image + b"\r\n"
            for _ in range(3)
        )
        + b"--"
        + boundary
        + b"--\r\n"
    )
    headers = [(b"content-type", b"multipart/form-data; boundary=" + boundary), (b"content-length", b"%d" % len(body))]
    taken = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def scenario():
        request = Request({**post_scope("/v1/predict", headers)}, receive)
        return await read_images(request, 1 << 20, 32, 5.0, taken.append)

    uploads, multipart = asyncio.run(scenario())
    assert multipart and [len(u.data) for u in uploads] == [len(image)] * 3
    assert sum(taken) == len(body) + 3 * len(image)
