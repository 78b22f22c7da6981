"""`vitkit serve`: an HTTP inference server for any checkpoint vitkit reads, with dynamic batching,
Prometheus metrics, attention-rollout explanations and a self-contained web page.

Needs the optional extra: `pip install "vitkit[serve]"` (Starlette, uvicorn, prometheus-client,
python-multipart).

    app.py      routes, token check, request metrics, JSON errors      create_app(path, config)
    service.py  starting the engine, admission (queue bound), answers
    batcher.py  dynamic batching into one model thread
    engine.py   one batch: decode (small inline, large in a pool), forward, rollout + overlay
    worker.py   the engine in a model process of its own (the default), restarted if it dies
    model.py    the model: predict's per-image path, batched forward, rollout + PNG overlay
    body.py     request bodies: byte limit while streaming, raw image or multipart form
    metrics.py  Prometheus registry
    server.py   uvicorn, SIGTERM drain                                  run_server(path, config)
    page/       the web page (one HTML file, no external resources)
"""

from vitkit.serve.config import ServeConfig  # no ASGI import here: vitkit.serve.app / .server need the extra

__all__ = ["ServeConfig"]
