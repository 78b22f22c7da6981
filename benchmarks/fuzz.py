"""Fuzz every reader of untrusted input with N mutated inputs each, and record what it ran.

    nice -n 19 python benchmarks/fuzz.py                      # 10,000 inputs per reader, all readers
    python benchmarks/fuzz.py --inputs 500 --readers shards images

The readers come from every tests/fuzz/*_targets.py, loaded by path: each module's
`READERS = {name: (make_seed, fuzz_one)}` (data_targets: shards, images; request_targets: requests to
a live `vitkit serve`; checkpoint_targets: each checkpoint format).  `fuzz_one(seed, rng, workdir)`
returns "ok" or "handled" and raises on an unhandled input.

Each reader runs in a child process of its own that reports after every input; the parent counts,
and kills the child when one input takes over --timeout seconds (a hang, counted; the child is
started again at the next input), or notices it died (a crash, counted likewise).  Peak memory is
the child's ru_maxrss (itself and its own children).  One row per reader goes to
benchmarks/results/fuzz.jsonl: reader, inputs, ok, handled, unhandled, hangs, crashes, peak_rss_mb,
seconds, and the first few failing inputs (their index: `random.Random(seed * 1_000_003 + index)`
reproduces each).  Target: 0 unhandled, 0 hangs, 0 crashes, peak under 2 GB per reader.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import random
import resource
import select
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from vitkit.bench.records import append_row  # at start: a row names the commit the process began with

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "tests" / "fuzz"
RESULTS = ROOT / "benchmarks" / "results" / "fuzz.jsonl"
EXAMPLES = 5  # failing inputs kept in a row
STARTUP_S = 180.0  # a child's imports and seed (the request reader starts a server) before its first input


def load_readers() -> dict[str, tuple[Path, Any]]:
    """{reader: (its module's path, (make_seed, fuzz_one))} of every tests/fuzz/*_targets.py."""
    for path in (TARGETS, TARGETS.parent):  # the targets import their helpers (mutations, shardkit) by name
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    readers = {}
    for path in sorted(TARGETS.glob("*_targets.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # one copy, whether loaded here or imported by a sibling
        spec.loader.exec_module(module)
        readers.update({name: (path, entry) for name, entry in module.READERS.items()})
    return readers


# ------------------------------------------------------------------------------ the child
def child(reader: str, start: int, stop: int, seed: int) -> None:
    """Run inputs start..stop-1 of `reader`, one JSON line per input on stdout."""
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)  # corrupt samples and refused requests are named in the log: millions of lines
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # libraries that print (libtiff) stay out of the protocol
    path, (make_seed, fuzz_one) = load_readers()[reader]
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{reader}-") as work:
        for folder in ("seed", "run"):  # both exist, as pytest's tmp_path does for the tests
            (Path(work) / folder).mkdir()
        seed_path = make_seed(Path(work) / "seed")
        for index in range(start, stop):
            began = time.perf_counter()
            try:
                verdict, error = fuzz_one(seed_path, random.Random(seed * 1_000_003 + index), Path(work) / "run"), ""
            except Exception as failure:  # noqa: BLE001 - this is what is being counted
                verdict = "unhandled"
                error = (
                    f"{type(failure).__name__}: {failure}"[:300]
                    + " | "
                    + " < ".join(f"{f.name}:{f.lineno}" for f in traceback.extract_tb(failure.__traceback__)[-3:])
                )
            rss = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
            out.write(
                json.dumps(
                    {
                        "index": index,
                        "verdict": verdict,
                        "error": error,
                        "rss_kb": rss,
                        "seconds": round(time.perf_counter() - began, 4),
                    }
                )
                + "\n"
            )
        closing = getattr(sys.modules.get(path.stem), "close", None)
        if closing is not None:
            closing()


# ------------------------------------------------------------------------------ the parent
class _Lines:
    """Lines of a child's stdout, each waited for at most a given time (None: none came; "": the child ended)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.fd, self.buffer = process.stdout.fileno(), b""

    def next(self, wait: float) -> str | None:
        deadline = time.monotonic() + wait
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return ""
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


def run_reader(reader: str, inputs: int, seed: int, timeout: float) -> dict[str, Any]:
    """Run `inputs` inputs of `reader` in child processes (a new one after a hang or a crash); the row's figures."""
    counts = {"ok": 0, "handled": 0, "unhandled": 0, "hangs": 0, "crashes": 0}
    examples, peak_kb, slowest, began, index = [], 0, 0.0, time.perf_counter(), 0
    while index < inputs:
        process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                reader,
                "--start",
                str(index),
                "--stop",
                str(inputs),
                "--seed",
                str(seed),
            ],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        lines, wait, first = _Lines(process), STARTUP_S, True
        while index < inputs:
            line, wait = lines.next(wait), timeout
            if not line and first:
                process.kill()
                raise RuntimeError(f"{reader}: the child ended or stalled before its first input (see its stderr)")
            first = False
            if not line:
                kind = "hangs" if line is None else "crashes"
                counts[kind] += 1
                ended = f"killed after {timeout:g} s" if line is None else f"exit code {process.wait(30)}"
                verdict = {"hangs": "hang", "crashes": "crash"}[kind]
                examples.append({"index": index, "verdict": verdict, "error": ended})
                index += 1
                break
            record = json.loads(line)
            counts[record["verdict"]] += 1
            peak_kb, slowest = max(peak_kb, record["rss_kb"]), max(slowest, record["seconds"])
            if record["verdict"] == "unhandled":
                examples.append({key: record[key] for key in ("index", "verdict", "error")})
            index = record["index"] + 1
        process.kill()
        process.wait()
    return {
        "reader": reader,
        "inputs": inputs,
        **counts,
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "seconds": round(time.perf_counter() - began, 1),
        "slowest_input_s": round(slowest, 3),
        "timeout_s": timeout,
        "seed": seed,
        "examples": examples[:EXAMPLES],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=10_000, help="mutated inputs per reader")
    parser.add_argument("--readers", nargs="*", default=None, help="reader names (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="input i of a reader is random.Random(seed * 1000003 + i)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds one input may take before it is a hang")
    parser.add_argument("--no-record", action="store_true", help=f"print the rows without appending to {RESULTS.name}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stop", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.start, args.stop, args.seed)
        return 0
    names = args.readers or list(load_readers())
    for name in names:
        try:
            row = run_reader(name, args.inputs, args.seed, args.timeout)
        except RuntimeError as error:
            print(f"fuzz: {error}", file=sys.stderr)
            continue
        if not args.no_record:
            append_row(RESULTS, row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
