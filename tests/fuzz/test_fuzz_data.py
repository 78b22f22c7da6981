"""A few seconds of fuzzing the data readers in the default suite (benchmarks/fuzz.py runs 10,000 inputs each):
mutated shards and image files are read as valid or refused with an error naming the file, never otherwise."""

from __future__ import annotations

import logging
import random
from collections import Counter
from pathlib import Path

import pytest
from data_targets import READERS


@pytest.mark.filterwarnings("ignore")  # Pillow warns about the files it is made to read
@pytest.mark.parametrize("reader, count", [("shards", 250), ("images", 600)])
def test_mutated_inputs_are_read_or_refused_by_name(tmp_path: Path, reader: str, count: int) -> None:
    make_seed, fuzz_one = READERS[reader]
    seed = make_seed(tmp_path / "seed")
    logging.disable(logging.WARNING)  # every corrupt sample is named in the log: thousands of lines
    try:
        verdicts = Counter(fuzz_one(seed, random.Random(i), tmp_path / "work") for i in range(count))
    finally:
        logging.disable(logging.NOTSET)
    assert set(verdicts) == {"ok", "handled"} and verdicts["ok"] >= count // 20, verdicts  # both paths are reached


def test_the_mutations_reach_past_the_checksums(tmp_path: Path) -> None:
    from mutations import mutate_png, mutate_tar, png_chunks, tar_headers

    seed = READERS["shards"][0](tmp_path)
    tar = (seed / "train-000000.tar").read_bytes()
    mutants = [mutate_tar(tar, random.Random(i)) for i in range(50)]
    checksums_fine = sum(len(tar_headers(m)) > 0 and m[:512] != tar[:512] for m in mutants)
    assert len(tar_headers(tar)) == 12 and checksums_fine >= 5
    png = (READERS["images"][0](tmp_path) / "rgb.png").read_bytes()
    assert all(png_chunks(mutate_png(png, random.Random(i))) is not None for i in range(50))
