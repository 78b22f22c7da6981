"""Mutated checkpoints of every format read back: each either reads (and its model runs) or is refused with a
CheckpointError naming the file; nothing else escapes.  A few seconds here; benchmarks/fuzz.py runs 10,000
per reader with the same targets."""

from __future__ import annotations

import collections
import random

import pytest
from checkpoint_targets import READERS, read_and_classify

MUTATIONS = 40  # per reader in the default suite


@pytest.mark.parametrize("reader", sorted(READERS))
def test_mutated_checkpoints_are_read_or_refused_by_name(tmp_path, reader):
    make_seed, fuzz_one = READERS[reader]
    seed = make_seed(tmp_path)
    assert read_and_classify(seed) == "ok"  # the seed itself is valid
    rng = random.Random(f"fuzz-{reader}")
    outcomes = collections.Counter(fuzz_one(seed, rng, tmp_path) for _ in range(MUTATIONS))
    assert set(outcomes) <= {"ok", "handled"} and outcomes["handled"] >= MUTATIONS // 4, outcomes
