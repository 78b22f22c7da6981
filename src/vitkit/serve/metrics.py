"""Prometheus metrics of one server, in its own registry (several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def batch_buckets(max_batch: int) -> tuple[float, ...]:
    """Every size up to 32 (the batch sizes formed can be read off exactly), then powers of two, then max_batch."""
    sizes = set(range(1, min(max_batch, 32) + 1)) | {2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch}
    return tuple(float(size) for size in sorted(sizes | {max_batch}))


class Metrics:
    """Requests by route and status, request latency, images per forward, queue depth, requests in flight."""

    def __init__(self, max_batch: int) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "vitkit_requests", "HTTP requests by route and status code", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "vitkit_request_seconds",
            "Time from request start to response end",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "vitkit_batch_size",
            "Images per model forward (dynamic batching)",
            buckets=batch_buckets(max_batch),
            registry=self.registry,
        )
        self.refused = Counter(
            "vitkit_refused_requests",
            "Requests answered before any route by status: malformed (400), headers too large (431) or too slow "
            "(408), a transfer coding not supported (501), more connections than allowed (503)",
            ["status"],
            registry=self.registry,
        )
        self.images = Counter("vitkit_images", "Images run through the model", registry=self.registry)
        self.queue_depth = Gauge("vitkit_queue_depth", "Images waiting for a model forward", registry=self.registry)
        self.in_flight = Gauge(
            "vitkit_requests_in_flight", "Prediction requests admitted and not yet answered", registry=self.registry
        )

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def observe_refused(self, status: int) -> None:
        self.refused.labels(status=str(status)).inc()

    def observe_batch(self, size: int) -> None:
        self.batch_size.observe(size)
        self.images.inc(size)

    def render(self) -> tuple[bytes, str]:
        """(the Prometheus text exposition, its content type)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
