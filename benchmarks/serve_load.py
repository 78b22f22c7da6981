"""Load test of `vitkit serve` against offline batched inference on the same images, model and device.

    .venv/bin/python benchmarks/serve_load.py CKPT_OR_RUN                     # Fashion-MNIST test images
    .venv/bin/python benchmarks/serve_load.py CKPT --clients 16 --seconds 10 --rounds 3 --threads 1

The script starts `vitkit serve CKPT` on a free loopback port (a subprocess), encodes the first
`--images` test images of `--data` as PNG files in memory, and alternates two measurements per round:

- offline: in this process, the same PNG bytes through `vitkit predict`'s per-image path (decode,
  resize/crop, normalise) and batched forwards of `--max-batch` images, top-5 formatted;
- served: `--clients` concurrent asyncio clients (aiohttp), each posting `--images-per-request` images
  (one: the raw PNG; more: a multipart form) to /v1/predict as soon as its previous answer arrives,
  for `--seconds`.

It prints requests/s, images/s, latency percentiles, errors, the batch sizes the server's batcher
formed (read from /metrics) and the ratio of served to offline images/s, per round and as medians,
and the CPU time per image of the server (with its model process), of the load generator and of the
offline run (the steadier figures on a shared machine).
The load generator is aiohttp's client (~0.2 CPU-ms per request here; httpx's cost 1.7 ms, more than the
server's own work, and capped what a 2-core machine could show).  Install: pip install -e ".[loadtest]".
The server and the load generator share the machine's cores, as do the offline runs and whatever
else runs there; the rounds alternate so that both sides see the same load on average.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import torch
from PIL import Image

from vitkit.bench.records import append_row
from vitkit.data.sources import load_split
from vitkit.device import pick_device
from vitkit.eval.features import resolution
from vitkit.eval.predict import class_probabilities, decode_input, model_input, top_classes
from vitkit.runs import open_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "serve_load.jsonl"
DEFAULT_DATA = f"fashion-mnist:{ROOT.parent / 'shared' / 'data' / 'fashion-mnist'}"


def encoded_images(uri: str, count: int) -> list[bytes]:
    """The first `count` test images of a data set, each encoded as a PNG file."""
    images = load_split(uri, "test")
    encoded = []
    for index in range(min(count, len(images))):
        pixels = images.read(index).permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)
        buffer = io.BytesIO()
        Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


def offline(checkpoint, images: list[bytes], batch: int, seconds: float) -> float:
    """Images/s of predict's path in batches of `batch`, looping over `images` for about `seconds`."""
    device, size = pick_device("auto"), resolution(checkpoint)
    model = checkpoint.model.to(device).eval()  # where the server puts it (CUDA when present), as predict does
    done, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds:
            for first in range(0, len(images), batch):
                chunk = images[first : first + batch]
                inputs = torch.cat(
                    [model_input(decode_input(data, checkpoint, size), checkpoint, size, device) for data in chunk]
                )
                probabilities = class_probabilities(model, inputs)
                [top_classes(row, checkpoint.class_names, 5) for row in probabilities]
                done += len(chunk)
    return done / (time.perf_counter() - start)


async def load(url: str, images: list[bytes], clients: int, seconds: float, per_request: int) -> dict[str, float]:
    """`clients` closed-loop clients posting `per_request` PNGs per request (raw body for one, else a
    multipart form, encoded once before the clock starts) for `seconds`; an answer counts only when it
    is 200 with five classes for every image."""
    latencies: list[float] = []
    errors = {"count": 0}

    def body(first: int) -> tuple[bytes, dict[str, str]]:
        if per_request == 1:
            return images[first % len(images)], {"Content-Type": "image/png"}
        files = [("file", (f"{i}.png", images[(first + i) % len(images)], "image/png")) for i in range(per_request)]
        prepared = httpx.Request("POST", url, files=files)  # httpx's own multipart encoding, done once up front
        return prepared.read(), {"Content-Type": prepared.headers["Content-Type"]}

    bodies = [body(first) for first in range(0, len(images), per_request)]  # prepared like a load tool's payloads

    def answered(status: int, content: bytes) -> bool:
        if status != 200:
            return False
        body = json.loads(content)
        results = [body] if per_request == 1 else body["results"]
        return len(results) == per_request and all(len(r["predictions"]) == 5 for r in results)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        deadline = time.perf_counter() + seconds

        async def one_client(index: int) -> None:
            while time.perf_counter() < deadline:
                content, headers = bodies[index % len(bodies)]
                start = time.perf_counter()
                try:
                    async with session.post("/v1/predict", data=content, headers=headers) as response:
                        ok = answered(response.status, await response.read())
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                latencies.append(time.perf_counter() - start)
                errors["count"] += not ok
                index += clients

        start = time.perf_counter()
        await asyncio.gather(*(one_client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
    ordered = sorted(latencies)

    def percentile(q: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "requests_per_s": len(latencies) / elapsed,
        "images_per_s": per_request * len(latencies) / elapsed,
        "errors": errors["count"],
        "p50_ms": percentile(0.50),
        "p95_ms": percentile(0.95),
        "p99_ms": percentile(0.99),
    }


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` and its children (the model process)
    from /proc (Linux)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = [
        child for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") + sum(
        cpu_seconds(int(child)) for child in children
    )


def batch_histogram(url: str) -> dict[int, int]:
    """Cumulative counts of the batcher's batch-size histogram buckets, by upper bound."""
    buckets = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vitkit_batch_size_bucket{") and "+Inf" not in line:
            bound = float(line.split('le="')[1].split('"')[0])
            buckets[int(bound)] = int(float(line.rsplit(" ", 1)[1]))
    return buckets


def formed(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """Batches formed between two readings, by size (exact up to 32, where every size is a bucket)."""
    counts, previous = {}, 0
    for bound in sorted(after):
        cumulative = after[bound] - before.get(bound, 0)
        if cumulative - previous:
            counts[bound] = cumulative - previous
        previous = cumulative
    return counts


def start_server(checkpoint: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "vitkit",
        "serve",
        checkpoint,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch",
        str(args.max_batch),
        "--max-wait-ms",
        str(args.max_wait_ms),
        "--threads",
        str(args.threads),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}: {' '.join(command)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the server did not become ready in 90 s")


def parse_args() -> argparse.Namespace:
    """The command line, with the bounds that keep the load on a shared machine in check."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", help="checkpoint or run directory (the Fashion-MNIST small-28px model for the target)"
    )
    parser.add_argument("--data", default=DEFAULT_DATA, help="data source URI whose test images are sent")
    parser.add_argument("--images", type=int, default=512, help="distinct images sent (and run offline)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (1..256)")
    parser.add_argument(
        "--images-per-request", type=int, default=1, help="images per request (above 1: a multipart form)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement (at most 120)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating offline / served rounds")
    parser.add_argument("--max-batch", type=int, default=32, help="server --max-batch and the offline batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="server --max-wait-ms")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, of the server's model and offline")
    parser.add_argument("--no-record", action="store_true", help="do not append a row to results/serve_load.jsonl")
    args = parser.parse_args()
    if not 1 <= args.clients <= 256 or not 0 < args.seconds <= 120 or not 1 <= args.rounds <= 10:
        raise SystemExit("--clients 1..256, --seconds up to 120 and --rounds 1..10 keep the load bounded")
    if not 1 <= args.images_per_request <= 32:
        raise SystemExit("--images-per-request must be 1..32 (the server's multipart limit)")
    return args


def measure_round(
    checkpoint, images: list[bytes], process: subprocess.Popen, url: str, args: argparse.Namespace
) -> dict:
    """One round: offline for `--seconds`, then served for `--seconds`, with the CPU time of each side
    and the batches the server formed."""
    cpu = cpu_seconds()
    reference = offline(checkpoint, images, args.max_batch, args.seconds)
    offline_cpu = cpu_seconds() - cpu
    before, cpu, server_cpu = batch_histogram(url), cpu_seconds(), cpu_seconds(process.pid)
    served = asyncio.run(load(url, images, args.clients, args.seconds, args.images_per_request))
    count = served["images_per_s"] * served["seconds"]
    cpu, server_cpu = cpu_seconds() - cpu, cpu_seconds(process.pid) - server_cpu
    batches = formed(before, batch_histogram(url))
    served.update(
        offline_images_per_s=reference,
        ratio=served["images_per_s"] / reference,
        batches=batches,
        offline_cpu_ms=1000 * offline_cpu / (reference * args.seconds),
        server_cpu_ms=1000 * server_cpu / count,
        client_cpu_ms=1000 * cpu / count,
        mean_batch=sum(k * v for k, v in batches.items()) / max(1, sum(batches.values())),
    )
    return served


def print_round(number: int, served: dict, args: argparse.Namespace) -> None:
    print(
        f"round {number}: served {served['requests_per_s']:.0f} requests/s = "
        f"{served['images_per_s']:.0f} images/s ({args.images_per_request} per request), "
        f"latency p50 {served['p50_ms']:.1f} / p95 {served['p95_ms']:.1f} / "
        f"p99 {served['p99_ms']:.1f} ms, errors {served['errors']} of {served['requests']}; offline "
        f"{served['offline_images_per_s']:.0f} images/s; ratio {served['ratio']:.2f}x; "
        f"mean batch {served['mean_batch']:.1f}, batches by size {dict(sorted(served['batches'].items()))}; "
        f"CPU ms per image: server {served['server_cpu_ms']:.2f} + "
        f"load generator {served['client_cpu_ms']:.2f}, offline {served['offline_cpu_ms']:.2f}"
    )


def run_rounds(checkpoint, images: list[bytes], args: argparse.Namespace) -> tuple[list[dict], int]:
    """Start the server, warm both sides up, run `--rounds` rounds (each printed), stop the server with
    SIGTERM; the rounds and the server's exit status."""
    process, url = start_server(args.checkpoint, args)
    rounds = []
    try:
        offline(checkpoint, images, args.max_batch, 1.0)  # warm-up of both sides
        asyncio.run(load(url, images, args.clients, 1.0, args.images_per_request))
        for number in range(1, args.rounds + 1):
            rounds.append(measure_round(checkpoint, images, process, url, args))
            print_round(number, rounds[-1], args)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    return rounds, code


def summarise(rounds: list[dict], code: int, args: argparse.Namespace) -> dict:
    """Medians over the rounds of the rates, latencies and CPU costs; totals of requests and errors."""
    summary = {
        key: statistics.median(r[key] for r in rounds)
        for key in (
            "requests_per_s",
            "images_per_s",
            "offline_images_per_s",
            "ratio",
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "mean_batch",
            "server_cpu_ms",
            "client_cpu_ms",
            "offline_cpu_ms",
        )
    }
    summary.update(
        errors=sum(r["errors"] for r in rounds),
        requests=sum(r["requests"] for r in rounds),
        clients=args.clients,
        images_per_request=args.images_per_request,
        server_exit=code,
        rounds=args.rounds,
    )
    return summary


def print_summary(summary: dict) -> None:
    print(
        f"median of {summary['rounds']} rounds: {summary['images_per_s']:.0f} images/s served vs "
        f"{summary['offline_images_per_s']:.0f} offline = {summary['ratio']:.2f}x; "
        f"p50/p95/p99 {summary['p50_ms']:.1f}/{summary['p95_ms']:.1f}/{summary['p99_ms']:.1f} ms; "
        f"{summary['errors']} errors in {summary['requests']} requests; "
        f"CPU ms per image: server {summary['server_cpu_ms']:.2f}, "
        f"load generator {summary['client_cpu_ms']:.2f}, offline {summary['offline_cpu_ms']:.2f}; "
        f"server exit status {summary['server_exit']} after SIGTERM"
    )
    print(json.dumps(summary))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    images = encoded_images(args.data, args.images)
    checkpoint = open_checkpoint(args.checkpoint)
    print(
        f"{len(images)} PNG images from {args.data}; {args.clients} clients; max batch {args.max_batch}, "
        f"max wait {args.max_wait_ms} ms; torch threads {args.threads}; {torch.get_num_threads()} here, cpu count "
        f"{len(__import__('os').sched_getaffinity(0))}"
    )
    rounds, code = run_rounds(checkpoint, images, args)
    summary = summarise(rounds, code, args)
    print_summary(summary)
    if not args.no_record:
        figures = {"checkpoint": args.checkpoint, "data": args.data, "max_batch": args.max_batch, **summary}
        append_row(RESULTS, figures, device=str(pick_device("auto")))


if __name__ == "__main__":
    main()
