"""Dynamic batching: batches form up to max_batch / max_wait, every caller gets its own row back, a
failing batch fails only its callers, and concurrent HTTP requests really share forwards (metrics)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="vitkit serve needs the serve extra: pip install -e '.[serve]'")
pytest.importorskip("httpx", reason="the serve tests need httpx (in the test extra)")

from serve_helpers import metric, png_bytes, serving  # noqa: E402 - after the skips

from vitkit.serve.app import create_app  # noqa: E402
from vitkit.serve.batcher import Batcher, BatcherClosed  # noqa: E402
from vitkit.serve.config import ServeConfig  # noqa: E402


def _batcher(sizes: list[int], **options) -> Batcher:
    def run(payloads):
        sizes.append(len(payloads))
        if any(p == "boom" for p in payloads):
            raise ValueError("boom in the batch")
        return [p * 10 for p in payloads]

    return Batcher(run, **{"max_batch": 4, "max_wait_s": 0.05, **options})


def test_batches_fill_up_to_max_batch_and_answers_go_to_their_callers() -> None:
    sizes: list[int] = []

    async def scenario():
        batcher = _batcher(sizes)
        batcher.start()
        single = [batcher.submit([i]) for i in range(7)]
        results = await asyncio.gather(*single, batcher.submit([7, 8, 9]))  # seven callers of one, one of three
        await batcher.close()
        return results

    assert asyncio.run(scenario()) == [[i * 10] for i in range(7)] + [[70, 80, 90]]
    assert sizes == [4, 4, 2]


def test_close_does_not_wait_past_its_limit_for_a_batch_that_hangs() -> None:
    release = threading.Event()

    def run(payloads):
        release.wait(30)
        return payloads

    async def scenario():
        batcher = Batcher(run, max_batch=1, max_wait_s=0.0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(["first"]))
        queued = asyncio.ensure_future(batcher.submit(["second"]))
        await asyncio.sleep(0.1)  # the first is in the hung forward, the second waits behind it
        await batcher.close(timeout_s=0.2)
        outcome = await asyncio.gather(queued, return_exceptions=True)
        release.set()
        return outcome, await running

    (queued,), running = asyncio.run(scenario())
    assert isinstance(queued, BatcherClosed) and running == ["first"]


def test_a_batch_that_ends_after_the_loop_closed_ends_quietly(monkeypatch) -> None:
    """The thread close() stopped waiting for delivered to a closed loop: "Exception in thread vitkit-model"."""
    release, crashed = threading.Event(), []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))

    async def scenario():
        batcher = Batcher(lambda payloads: release.wait(30) and payloads, max_batch=1, max_wait_s=0.0)
        batcher.start()
        asyncio.ensure_future(batcher.submit(["hung"]))
        await asyncio.sleep(0.1)
        await batcher.close(timeout_s=0.05)
        return batcher._thread

    thread = asyncio.run(scenario())
    release.set()
    thread.join(5)
    assert not thread.is_alive() and crashed == []


def test_a_full_batch_does_not_wait_and_a_lone_one_waits_max_wait() -> None:
    sizes: list[int] = []

    async def scenario():
        full = _batcher(sizes, max_batch=2, max_wait_s=30.0)
        full.start()
        start = time.perf_counter()
        await asyncio.gather(full.submit([1]), full.submit([2]))
        full_wait = time.perf_counter() - start
        await full.close()
        lone = _batcher(sizes, max_batch=8, max_wait_s=0.3)
        lone.start()
        start = time.perf_counter()
        await lone.submit([3])
        lone_wait = time.perf_counter() - start
        await lone.close()
        return full_wait, lone_wait

    full_wait, lone_wait = asyncio.run(scenario())
    assert full_wait < 5.0  # did not sit out the 30 s wait
    assert lone_wait >= 0.3  # waited for company the whole max_wait
    assert sizes == [2, 1]


def test_a_failing_batch_fails_its_callers_only_and_closing_refuses_new_work() -> None:
    sizes: list[int] = []

    async def scenario():
        batcher = _batcher(sizes, max_batch=2, max_wait_s=0.2)
        batcher.start()
        failed = await asyncio.gather(batcher.submit(["boom"]), batcher.submit([1]), return_exceptions=True)
        after = await batcher.submit([5])
        await batcher.close()
        with pytest.raises(BatcherClosed):
            await batcher.submit([6])
        return failed, after

    failed, after = asyncio.run(scenario())
    assert all(isinstance(error, ValueError) and "boom" in str(error) for error in failed)
    assert after == [50] and sizes == [2, 1]


def test_concurrent_http_requests_share_forwards(vit_checkpoint: Path) -> None:
    count = 12

    async def scenario() -> str:
        app = create_app(vit_checkpoint, ServeConfig(max_batch=8, max_wait_ms=300, model_process=False))
        async with serving(app) as client:
            posts = [
                client.post("/v1/predict", content=png_bytes(32, 32, seed), headers={"Content-Type": "image/png"})
                for seed in range(count)
            ]
            assert all(r.status_code == 200 for r in await asyncio.gather(*posts))
            return (await client.get("/metrics")).text

    text = asyncio.run(scenario())
    forwards = metric(text, "vitkit_batch_size_count")
    assert metric(text, "vitkit_batch_size_sum") == count and metric(text, "vitkit_images_total") == count
    # How the 12 split depends on when each request got in (8 + 4 on a quiet machine; two forwards of 5-7 in a
    # loaded CI run), so the test holds what does not: no forward above max_batch, and forwards really shared.
    assert metric(text, "vitkit_batch_size_bucket", le="8.0") == forwards  # every forward held at most 8
    assert 2 <= forwards <= count // 2  # at least ceil(12 / 8); on average two or more images per forward


def test_an_exception_as_output_fails_its_caller_alone() -> None:
    def run(payloads):  # the model thread's answer for an undecodable image is its error, in its slot
        return [ValueError(f"bad {p}") if p < 0 else p * 10 for p in payloads]

    async def scenario():
        batcher = Batcher(run, max_batch=8, max_wait_s=0.05)
        batcher.start()
        results = await asyncio.gather(
            batcher.submit([1]),
            batcher.submit([-2]),
            batcher.submit([3, -4]),
            batcher.submit([5, 6]),
            return_exceptions=True,
        )
        await batcher.close()
        return results

    good, bad, mixed, pair = asyncio.run(scenario())
    assert good == [10] and pair == [50, 60]
    assert isinstance(bad, ValueError) and str(bad) == "bad -2"
    assert isinstance(mixed, ValueError) and str(mixed) == "bad -4"


def test_with_nobody_else_on_the_way_a_batch_runs_at_once() -> None:
    sizes: list[int] = []
    on_the_way = {"count": 2}  # requests admitted but not yet submitted, as the service counts them

    async def scenario():
        batcher = _batcher(sizes, max_batch=8, max_wait_s=30.0, others=lambda inside: on_the_way["count"])
        batcher.start()
        first = asyncio.ensure_future(batcher.submit([1]))
        await asyncio.sleep(0.2)
        waited = not first.done()  # two more on the way: it waits for them
        on_the_way["count"] = 0  # the last of them arrives: nobody else to wait for
        start = time.perf_counter()
        results = await asyncio.gather(first, batcher.submit([2]))
        elapsed = time.perf_counter() - start
        await batcher.close()
        return waited, results, elapsed

    waited, results, elapsed = asyncio.run(scenario())
    assert waited and results == [[10], [20]] and sizes == [2]
    assert elapsed < 5  # far under max_wait_s = 30
