"""Refusals of `vitkit serve` under load and failure, in-process: a full queue, the bodies held over all
requests, a failing forward, a dead model process; and the flags that guard the server (decoding limits, the
token)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from refusals import PNG, assert_error, post_scope, run_then_good  # noqa: E402
from serve_helpers import metric, png_bytes, serving  # noqa: E402 - after the skips

from vitkit.runs import open_checkpoint  # noqa: E402
from vitkit.serve.app import create_app  # noqa: E402
from vitkit.serve.body import Upload  # noqa: E402
from vitkit.serve.config import ServeConfig  # noqa: E402
from vitkit.serve.engine import Encoded  # noqa: E402
from vitkit.serve.model import ServedModel  # noqa: E402
from vitkit.serve.worker import ModelProcessError, ProcessEngine  # noqa: E402


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
    assert_error(refused, 503, "busy")
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
    assert_error(refused, 503, "bytes of request bodies held in memory")
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

    failed = run_then_good(vit_checkpoint, ServeConfig(max_wait_ms=0, model_process=False), requests, load=load)
    assert_error(failed, 500, "internal error", "RuntimeError")


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


def test_a_dead_model_process_is_a_503_with_retry_after_and_the_server_goes_on(vit_checkpoint: Path, caplog) -> None:
    """The death is logged in lines that say it, without the two chained tracebacks of an unforeseen error."""

    async def requests(client):
        service = client._transport.app.state.service
        service.engine._conn.send = lambda payloads: os.kill(
            service.engine.pid, signal.SIGKILL
        )  # dies with the batch in it
        # (the restarted process has a new pipe, with its own send)
        return await client.post(
            "/v1/predict", content=png_bytes(32, 32), headers=PNG
        )  # then run_then_good's good request

    with caplog.at_level(logging.INFO, logger="vitkit"):
        failed = run_then_good(vit_checkpoint, ServeConfig(max_wait_ms=0), requests)
    assert_error(failed, 503, "model process died")
    assert failed.headers["retry-after"] == "1"
    assert "a batch of 1 failed: the model process died in this batch (exit code -9)" in caplog.text
    assert not [record for record in caplog.records if record.exc_info]


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
    with pytest.raises(SystemExit):  # refused by its flag, as predict's (vitkit.cli.flags.add_max_pixels)
        build_parser().parse_args(["serve", "run", "--max-pixels", "0"])
    with pytest.raises(ValueError, match="--max-pixels must be at least 1, got 0"):
        ServeConfig(max_pixels=0)
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


def test_a_model_process_still_loading_is_ended_by_cancel(vit_checkpoint: Path) -> None:
    """A server stopped while its model process loaded (or warmed up a large --max-batch) waited for the load,
    however long, before it exited."""
    engine = ProcessEngine(vit_checkpoint, ServeConfig(), start=False)
    failure: list[BaseException] = []
    starting = threading.Thread(target=lambda: _record_failure(engine.start, failure))
    starting.start()
    while engine._process is None or not engine._process.is_alive():  # spawned: it still imports torch
        time.sleep(0.005)
    child = engine._process
    engine.cancel()
    starting.join(60)
    assert not starting.is_alive() and engine.description is None
    assert isinstance(failure[0], ModelProcessError) and "was stopped while loading" in str(failure[0])
    assert not child.is_alive() and child.exitcode == -signal.SIGKILL


def test_stopping_the_service_while_it_loads_is_no_load_failure(vit_checkpoint: Path) -> None:
    from vitkit.serve.service import Service

    failures: list[str] = []
    service = Service(vit_checkpoint, ServeConfig(), on_load_failure=failures.append)

    async def start_then_stop() -> None:
        loading = asyncio.get_running_loop().create_task(service.start())
        while service._starting is None or service._starting._process is None:
            await asyncio.sleep(0.005)
        child = service._starting._process
        await service.stop()
        await loading
        assert not child.is_alive()

    asyncio.run(start_then_stop())
    assert failures == [] and service.load_error is None and service.engine is None


def _record_failure(call, failures: list[BaseException]) -> None:
    try:
        call()
    except BaseException as error:  # noqa: BLE001 - the test reads it
        failures.append(error)


def test_max_batch_is_bounded_before_anything_loads(tmp_path: Path, capsys) -> None:
    """`--max-batch 100000` was taken, and the warm-up's one batch of that size grew the model process to 16 GB
    for a 205k-parameter model."""
    from vitkit.cli import main
    from vitkit.serve.config import MAX_BATCH

    assert ServeConfig(max_batch=MAX_BATCH).max_batch == 1024
    assert main(["serve", str(tmp_path / "nowhere"), "--max-batch", "100000"]) == 2
    assert "--max-batch must be at most 1024, got 100000" in capsys.readouterr().err


def test_a_stop_signal_to_the_group_while_the_model_process_starts_leaves_it_to_the_server(
    vit_checkpoint: Path,
) -> None:
    """Ctrl-C or a group's SIGTERM reached the model process while it imported torch, before it ignored them: it
    died, and the server reported a load failure and exited 1 where it had been asked to stop."""
    engine = ProcessEngine(vit_checkpoint, ServeConfig(), start=False)
    failure: list[BaseException] = []
    starting = threading.Thread(target=lambda: _record_failure(engine.start, failure))
    starting.start()
    while engine._process is None or not engine._process.is_alive():
        time.sleep(0.005)
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(engine._process.pid, sig)
    starting.join(120)
    try:
        assert failure == [] and engine.description is not None and engine._process.is_alive()
    finally:
        engine.close()
