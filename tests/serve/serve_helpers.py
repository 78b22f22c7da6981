"""Helpers of the `vitkit serve` tests: a tiny checkpoint, an in-process client, reading metrics."""

from __future__ import annotations

import asyncio
import contextlib
import io
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import vitkit

TINY = dict(hidden_size=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8, img_size=32)
CLASSES = ["cat", "dog", "bird"]


def save_tiny_vit(directory: Path, **overrides) -> Path:
    """A tiny ViT (D=32, L=2, k=2, P=8, 32 px, 3 classes) with a random head, so images get different answers."""
    model = vitkit.create_model("vit_ti16", num_classes=3, **{**TINY, **overrides})
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
        model.head.bias.normal_(0, 0.1)
    return vitkit.save(model, directory, class_names=CLASSES)


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serving(app, *, wait_ready: bool = True, headers: dict[str, str] | None = None) -> AsyncIterator:
    """Run the app's lifespan (the model loads) and yield an httpx client talking to it in-process."""
    import httpx

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve.test", headers=headers) as client:
            if wait_ready:
                for _ in range(2400):  # a minute: loading onto a GPU of a busy machine took over 10 s
                    if (await client.get("/health")).status_code == 200:
                        break
                    await asyncio.sleep(0.025)
                else:
                    raise AssertionError("the model did not become ready within 60 s")
            yield client


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (0 when absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


def start_server(checkpoint: Path, log: Path, *flags: str, token: str | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m vitkit serve CKPT --port P FLAGS` and its base URL, once /health answers 200 (asked with
    the bearer `token` when given)."""
    import httpx

    port = free_port()
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "vitkit", "serve", str(checkpoint), "--port", str(port), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            if httpx.get(f"{url}/health", headers=headers, timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not become ready:\n{log.read_text()}")


def stop_server(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)
