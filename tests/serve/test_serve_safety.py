"""Every refusal of `vitkit serve` in-process: 400, 401, 404/405, 413, 415, 422, 500, 503, each as
JSON {"error"}, and the server keeps answering after each."""

from __future__ import annotations

import asyncio
import gzip
import struct
import zlib
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from refusals import PNG, assert_error, auth, post_scope, run_then_good  # noqa: E402
from serve_helpers import metric, png_bytes, serving  # noqa: E402 - after the skips

from vitkit.serve.app import create_app  # noqa: E402
from vitkit.serve.config import ServeConfig  # noqa: E402


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height pixels, followed by a tiny compressed row of zeros."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def test_bad_bodies_parameters_and_routes(vit_checkpoint: Path) -> None:
    async def requests(client):
        return {
            "garbage": await client.post("/v1/predict", content=b"\x89PNG but not really", headers=PNG),
            "truncated": await client.post("/v1/predict", content=png_bytes(40, 40)[:120], headers=PNG),
            "empty": await client.post("/v1/predict", content=b"", headers=PNG),
            "text": await client.post("/v1/predict", content=b"hello", headers={"Content-Type": "text/plain"}),
            "json": await client.post("/v1/explain", content=b"{}", headers={"Content-Type": "application/json"}),
            "no type": await client.post("/v1/predict", content=png_bytes(8, 8), headers={"Content-Type": ""}),
            # a coded body was decoded as it came: "not a readable image", where the coding was the trouble
            "gzip": await client.post(
                "/v1/predict", content=gzip.compress(png_bytes(8, 8)), headers={**PNG, "Content-Encoding": "gzip"}
            ),
            "identity": await client.post(
                "/v1/predict?top_k=1", content=png_bytes(8, 8), headers={**PNG, "Content-Encoding": "identity"}
            ),
            "top_k": await client.post("/v1/predict?top_k=0", content=png_bytes(8, 8), headers=PNG),
            "top_k text": await client.post("/v1/predict?top_k=two", content=png_bytes(8, 8), headers=PNG),
            # str.isdigit() takes a superscript two that int() refuses, and int() refuses 5,000 digits: both were 500s
            "top_k ²": await client.post("/v1/predict?top_k=%C2%B2", content=png_bytes(8, 8), headers=PNG),
            "top_k ٣": await client.post("/v1/predict?top_k=%D9%A3", content=png_bytes(8, 8), headers=PNG),
            "top_k long": await client.post("/v1/predict?top_k=" + "1" * 5000, content=png_bytes(8, 8), headers=PNG),
            "format": await client.post("/v1/explain?format=gif", content=png_bytes(8, 8), headers=PNG),
            # a misspelt parameter was passed over: 200 with 5 classes where the client asked for 2
            "topk": await client.post("/v1/predict?topk=2", content=png_bytes(8, 8), headers=PNG),
            "twice": await client.post("/v1/predict?top_k=2&top_k=3", content=png_bytes(8, 8), headers=PNG),
            "stray": await client.post("/v1/explain?top_k=2&verbose=1", content=png_bytes(8, 8), headers=PNG),
            "format json": await client.post("/v1/predict?format=json&top_k=1", content=png_bytes(8, 8), headers=PNG),
            "unknown": await client.get("/v2/predict"),
            "method": await client.get("/v1/predict"),
            # a 307 with an empty body, its Location built from the client's Host header
            "slash": await client.post("/v1/predict/", content=png_bytes(8, 8), headers={**PNG, "Host": "evil:666"}),
        }

    got = run_then_good(vit_checkpoint, ServeConfig(), requests)
    assert_error(got["garbage"], 400, "not a readable image")
    assert_error(got["truncated"], 400, "corrupt or truncated")
    assert_error(got["empty"], 400, "empty body")
    for name in ("text", "json"):
        assert_error(got[name], 415, "unsupported content type")
    assert_error(got["no type"], 415, "no Content-Type: send one image with Content-Type image/*")
    assert_error(got["gzip"], 415, "unsupported Content-Encoding 'gzip'")
    assert got["identity"].status_code == 200 and len(got["identity"].json()["predictions"]) == 1
    assert_error(got["top_k"], 400, "top_k")
    for name in ("top_k text", "top_k ²", "top_k ٣", "top_k long"):
        assert_error(got[name], 400, "top_k must be a positive integer")
    assert_error(got["format"], 400, "format")
    assert_error(
        got["topk"], 400, "unknown query parameter 'topk': /v1/predict takes top_k, format; did you mean 'top_k'?"
    )
    assert_error(got["stray"], 400, "unknown query parameter 'verbose': /v1/explain takes top_k, format")
    assert_error(got["twice"], 400, "query parameter 'top_k' given more than once")  # 3 was taken, unsaid
    assert got["format json"].status_code == 200 and len(got["format json"].json()["predictions"]) == 1
    assert_error(got["unknown"], 404)
    assert_error(got["method"], 405)
    assert_error(got["slash"], 404)


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

    got = run_then_good(vit_checkpoint, ServeConfig(max_files=2), requests)
    assert_error(got["no file"], 400, "no 'file' field")
    assert_error(got["text field"], 400, "not a file upload")
    assert_error(got["too many"], 413, "more than 2 parts in one form: send at most 2 a request ('file' fields)")
    assert_error(got["png of two"], 400, "format=png")
    # a form answers each file, as `vitkit predict` does; one bad file had failed the whole request
    assert got["bad second"].status_code == 200
    good, bad = got["bad second"].json()["results"]
    assert good["file"] == "0.png" and len(good["predictions"]) == 3 and "error" not in good  # its 3 classes
    assert bad["file"] == "broken.png" and "broken.png" in bad["error"] and "predictions" not in bad
    assert_error(got["both bad"], 400, "broken0.png")  # no file decodes: the request fails
    for name in ("unclosed", "unclosed second", "unclosed, named --b--"):
        assert_error(got[name], 400, "malformed multipart form", "no closing boundary")


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

    got = run_then_good(vit_checkpoint, ServeConfig(max_body_mb=1 / 16, max_pixels=64 * 64), requests)
    assert_error(got["big"], 413, "exceeds the limit of 65,536 bytes")
    assert_error(got["big form"], 413, "exceeds the limit")
    assert_error(got["bomb"], 413, "12000x12000", "decompression bomb")
    assert_error(got["huge bomb"], 413, "decompression bomb")  # Pillow's own refusal, over twice its limit
    assert_error(got["over max_pixels"], 413, "80x80")


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
                if (await client.get("/health", headers=auth(config))).status_code == 200:
                    break
                await asyncio.sleep(0.025)
            return await requests(client)

    got = asyncio.run(scenario())
    assert got["page"].status_code == 200 and got["page"].headers["content-type"].startswith("text/html")
    for name in ("health", "metrics", "predict", "wrong", "basic"):
        assert_error(got[name], 401, "bearer token")
        assert got[name].headers["www-authenticate"] == "Bearer"
    assert got["right"].status_code == 200 and got["right health"].status_code == 200


def test_the_page_is_self_contained(vit_checkpoint: Path) -> None:
    async def requests(client):
        return await client.get("/")

    page = run_then_good(vit_checkpoint, ServeConfig(model_process=False), requests)
    text = page.text
    assert "<script" in text and 'id="file"' in text and 'id="overlay"' in text
    for external in ("http://", "https://", "//cdn", "<link", 'src="/', "@import"):
        assert external not in text, external  # nothing fetched from elsewhere: works offline
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_a_request_cut_by_the_drain_timeout_is_a_json_503_and_counted() -> None:
    """After SIGTERM, uvicorn cancels what is still running when the drain timeout passes: its own answer was a
    text/plain 500 with two tracebacks in the log, which then said "drained and stopped"."""
    from types import SimpleNamespace

    from starlette.requests import Request

    from vitkit.serve.app import _json_errors

    async def slow(request):
        raise asyncio.CancelledError("timeout graceful shutdown exceeded")

    service = SimpleNamespace(cut=0)
    scope = {"type": "http", "method": "POST", "path": "/v1/predict", "headers": [], "app": None}
    request = Request({**scope, "app": SimpleNamespace(state=SimpleNamespace(service=service))})
    answer = asyncio.run(_json_errors(slow)(request))
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1" and service.cut == 1
    assert b"drain timeout passed" in answer.body and answer.media_type == "application/json"
