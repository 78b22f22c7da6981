"""Driving the served app in-process for its refusals: a request scope by hand, a scenario followed by a good
request, the checks of a JSON error.  Imported by test modules after their skips (it needs the serve extra)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from serve_helpers import png_bytes, serving

from vitkit.serve.app import create_app
from vitkit.serve.config import ServeConfig

PNG = {"Content-Type": "image/png"}


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


def run_then_good(checkpoint: Path, config: ServeConfig, requests, **app_options):
    """Send `requests(client)` to a fresh app, then one good request that must still succeed."""

    async def scenario():
        async with serving(create_app(checkpoint, config, **app_options)) as client:
            result = await requests(client)
            good = await client.post("/v1/predict", content=png_bytes(32, 32), headers={**PNG, **auth(config)})
            assert good.status_code == 200 and len(good.json()["predictions"]) == 3
            return result

    return asyncio.run(scenario())


def auth(config: ServeConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.token}"} if config.token else {}


def assert_error(response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert all(word in message for word in words), message
