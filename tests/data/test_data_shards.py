"""wds: sources and `vitkit shard`: round trips, splits, foreign shards, corrupt samples, stream order and resume."""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_data_hostile_images import png_claiming

from shardkit import image_ids, numbered_npz, numbered_shards, png, write_tar
from vitkit.data.images import BadImageError
from vitkit.data.shard import write_shards
from vitkit.data.sources import describe, load_split, mirror_keeps_label
from vitkit.data.stream import ShardBatches, ShardSet, lane_samples, read_all
from vitkit.data.tarshards import expand_braces

CPU = torch.device("cpu")


def _batches(
    data: ShardSet, workers: int = 0, seed: int = 0, batch: int = 8, micro: int = 4, world: int = 1, rank: int = 0
) -> ShardBatches:
    return ShardBatches(
        data,
        seed=seed,
        global_batch=batch,
        rank=rank,
        world=world,
        micro_batch=micro,
        device=CPU,
        workers=workers,
        strict=False,
        window=16,
    )


def _ids(steps: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> list[int]:
    return [i for step in steps for images, _ in step for i in image_ids(images)]


def _take(batches: ShardBatches, count: int) -> list:
    iterator = iter(batches)
    return [next(iterator) for _ in range(count)]


def test_brace_patterns_expand_like_bash() -> None:
    assert expand_braces("t-{000..002}.tar") == ["t-000.tar", "t-001.tar", "t-002.tar"]
    assert expand_braces("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    assert expand_braces("x{1,{2,3}}y") == ["x1y", "x2y", "x3y"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_braces("a{1..2")


def test_shard_round_trip_keeps_every_image_and_label(tmp_path: Path) -> None:
    source = f"npz:{numbered_npz(tmp_path / 'n.npz', 50)}"
    summary = write_shards(source, tmp_path / "wds", 12)
    assert summary["splits"] == {
        "train": {"shards": 4, "samples": 40, "skipped": 0},
        "test": {"shards": 1, "samples": 10, "skipped": 0},
    }
    index = json.loads((tmp_path / "wds" / "dataset.json").read_text())
    assert [e["count"] for e in index["splits"]["train"]] == [12, 12, 12, 4] and index["channels"] == 1
    assert index["classes"] == [f"c{k}" for k in range(10)] and index["image_size"] == 8
    for split in ("train", "test"):
        ours = load_split(f"wds:{tmp_path / 'wds'}", split, image_size=8)  # small: decoded into memory
        theirs = load_split(source, split)
        assert ours.access == "memory" and ours.class_names == theirs.class_names
        order = image_ids(ours.images)  # written in a fixed random order (seed 0) of the source split
        position = {i: k for k, i in enumerate(image_ids(theirs.images))}
        rows = torch.tensor([position[i] for i in order])
        assert sorted(order) == sorted(position) and order != sorted(order)
        assert torch.equal(ours.images, theirs.images[rows]) and torch.equal(ours.labels, theirs.labels[rows])
    assert rows.tolist() == torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()


def test_class_names_the_reader_refuses_are_refused_before_any_shard_is_written(tmp_path: Path) -> None:
    """A class folder "a<VT>b" sharded, then wds: refused its dataset.json; a tab (words.txt's separator) is a
    name's character both ways."""
    for name, ok in (("a\tb", True), ("a\x0bb", False)):
        root = tmp_path / repr(name)
        for cls in (name, "plain"):
            (root / "photos" / cls).mkdir(parents=True)
            for i in range(5):
                Image.new("L", (8, 8), 40 * i).save(root / "photos" / cls / f"{i}.png")
        if ok:
            write_shards(f"folder:{root / 'photos'}", root / "wds", 4)
            assert load_split(f"wds:{root / 'wds'}", "train", image_size=8).class_names == [name, "plain"]
            continue
        with pytest.raises(ValueError, match="class 1's name holds a control character"):
            write_shards(f"folder:{root / 'photos'}", root / "wds", 4)
        assert not (root / "wds").exists()


def test_shards_are_deterministic_and_keep_file_bytes(tmp_path: Path) -> None:
    for k, cls in enumerate(("cat", "dog")):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        for i in range(3):
            noise = np.random.default_rng(10 * k + i).integers(0, 256, (30 + i, 40, 3), dtype=np.uint8)
            Image.fromarray(noise).save(tmp_path / "photos" / cls / f"{i}.jpg", quality=80)
    (tmp_path / "photos" / "dog" / "bad.jpg").write_bytes(b"not an image")
    digests = []
    for out in ("a", "b"):
        summary = write_shards(f"folder:{tmp_path / 'photos'}", tmp_path / out, 4)
        digests.append([hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((tmp_path / out).iterdir())])
    totals = {key: sum(split[key] for split in summary["splits"].values()) for key in ("samples", "skipped")}
    assert digests[0] == digests[1] and set(summary["splits"]) == {"train", "test"}  # test: the fixed hold-out
    assert totals == {"samples": 6, "skipped": 1}

    def stored(out: str) -> list[bytes]:
        return [
            s.image
            for split in ("train", "test")
            for s in read_all(load_split(f"wds:{tmp_path / out}", split, max_in_memory_bytes=0))
        ]

    files = sorted((tmp_path / "photos").rglob("[0-9].jpg"))
    assert sorted(stored("a")) == sorted(p.read_bytes() for p in files)  # the original bytes, not re-encoded
    write_shards(f"folder:{tmp_path / 'photos'}", tmp_path / "small", 10, max_side=20)
    sizes = sorted(Image.open(io.BytesIO(data)).size for data in stored("small"))
    assert sizes == [(20, 15)] * 2 + [(20, 16)] * 4
    with pytest.raises(ValueError, match="already holds shards"):
        write_shards(f"folder:{tmp_path / 'photos'}", tmp_path / "a", 4)


def test_splits_by_prefix_index_and_pattern(tmp_path: Path) -> None:
    numbered_shards(tmp_path / "d", [5, 5, 5])
    numbered_shards(tmp_path / "d", [4], prefix="val", start=15)
    uri = f"wds:{tmp_path / 'd'}"
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.channels, info.image_size) == (15, 10, 1, 8)
    assert (info.access, describe(uri, max_in_memory_bytes=0).access) == ("memory", "stream")
    test = load_split(uri, "test", image_size=8)  # no test-* shards: val-* stands in, as for folders
    assert sorted(image_ids(test.images)) == [15, 16, 17, 18]
    pattern = load_split(f"wds:{tmp_path / 'd'}/train-{{000000..000001}}.tar", "train", image_size=8)
    assert sorted(image_ids(pattern.images)) == list(range(10))
    held = load_split(uri, "val", image_size=8, val_fraction=0.34, seed=1)  # whole shards held out
    kept = load_split(uri, "train", image_size=8, val_fraction=0.34, seed=1)
    assert len(held) == 5 and sorted(image_ids(held.images) + image_ids(kept.images)) == list(range(15))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_split(f"wds:{tmp_path / 'd'}/train-{{000000..000009}}.tar", "train")


def test_webdataset_shardwriter_shards_are_read(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (7, 6, 6, 3), dtype=np.uint8)
    with wds.ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=3) as sink:
        for i in range(7):
            label = {"cls": i % 2} if i % 3 else {"json": {"label": i % 2, "note": "x"}}
            sink.write({"__key__": f"sample{i:04d}", "input.png": png(pixels[i]), **label})
    data = load_split(f"wds:{tmp_path}", "train", image_size=6)  # no prefix: every shard is train ...
    test = load_split(f"wds:{tmp_path}", "test", image_size=6)  # ... less the fixed test hold-out
    assert (
        len(list(tmp_path.glob("*.tar"))) == 3 and data.class_names == ["0", "1"] and (len(data), len(test)) == (5, 2)
    )
    stored = torch.from_numpy(pixels).permute(0, 3, 1, 2).flatten(1)
    found = [int((stored == image.flatten()).all(1).nonzero()) for image in torch.cat([data.images, test.images])]
    assert sorted(found) == list(range(7))
    assert torch.cat([data.labels, test.labels]).tolist() == [i % 2 for i in found]


def test_a_decompression_bomb_is_left_out_of_the_shards_before_decoding(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A header claiming more pixels than the readers accept is refused from the header, with vitkit's message
    naming the file and without Pillow's warning, whether the bytes would be copied or shrunk."""
    for cls in ("cat", "dog"):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (30, 24), (40 * i, 90, 9)).save(tmp_path / "photos" / cls / f"{i}.png")
    (tmp_path / "photos" / "dog" / "bomb.png").write_bytes(png_claiming(10_000, 9_000))
    for out, max_side in (("copied", None), ("shrunk", 20)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary = write_shards(f"folder:{tmp_path / 'photos'}", tmp_path / out, 8, max_side=max_side)
        assert sum(split["samples"] for split in summary["splits"].values()) == 4
        assert sum(split["skipped"] for split in summary["splits"].values()) == 1
        assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    assert caplog.text.count("bomb.png: refusing to decode a 10000x9000 image") == 2


def test_corrupt_members_are_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = numbered_shards(tmp_path, [6])
    numbered_shards(tmp_path, [2], prefix="test", start=6)  # a test split of its own: train is every train shard
    members = [
        ("a.png", b"\x89PNG garbage"),
        ("a.cls", b"1"),
        ("b.png", png(np.zeros((8, 8), np.uint8))),
        ("c.png", png(np.full((8, 8), 7, np.uint8))),
        ("c.cls", b"nine"),
        ("d.png", png(np.full((8, 8), 9, np.uint8))),
        ("d.cls", b"11"),
    ]
    write_tar(tmp_path / "train-000001.tar", members)
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    data.class_names = [str(k) for k in range(10)]
    batches = _batches(data, batch=10, micro=10)
    ids = sorted(_ids(_take(batches, 1)))
    assert ids == good and batches.skipped == 4  # garbage image, no label, unreadable label, label out of range
    assert "skipping corrupt sample " + str(tmp_path / "train-000001.tar:a") in caplog.text
    assert "label 11 is outside" in caplog.text
    memory = load_split(f"wds:{tmp_path}", "train", image_size=8)  # without an index the labels name the classes
    assert memory.num_classes == 12 and memory.skipped == 3 and len(memory) == 7
    strict = ShardBatches(
        data, seed=0, global_batch=10, rank=0, world=1, micro_batch=10, device=CPU, workers=0, strict=True
    )
    with pytest.raises(BadImageError, match="sample") as raised:
        _take(strict, 1)
    key = str(tmp_path / "train-000001.tar:a")
    assert str(raised.value).startswith(f"sample {key}: ") and str(raised.value).count(key) == 1  # named once


def test_lanes_split_each_epoch_disjointly_and_never_run_dry(tmp_path: Path) -> None:
    ids = numbered_shards(tmp_path, [5, 3, 7, 2, 6, 1])
    numbered_shards(tmp_path, [2], prefix="test", start=24)  # a test split of its own: train is every train shard
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    lanes = 3  # 6 shards: two per lane in each round
    firsts = []
    for lane in range(lanes):
        size = sum(u.count for u in _round0_units(data, lane, lanes))
        firsts.append([s.key.rpartition(":")[2] for _, s in zip(range(size), lane_samples(data, 0, lane, lanes, 4, 0))])
    keys = [k for first in firsts for k in first]
    assert sorted(keys) == [f"s{i:06d}" for i in ids] and len(set(keys)) == len(keys)
    many = lane_samples(load_split(f"wds:{tmp_path}", "train", max_in_memory_bytes=0), 0, 7, 8, 4, 0)
    assert len([s for _, s in zip(range(100), many)]) == 100  # 8 lanes, 6 shards: lane 7 still streams


def _round0_units(data: ShardSet, lane: int, lanes: int) -> list:
    from vitkit.data.stream import _UnitSequence

    sequence, per_round = _UnitSequence(len(data.units), 0), -(-len(data.units) // lanes)
    return [data.units[sequence[lane + k * lanes]] for k in range(per_round)]


def test_stream_order_depends_on_the_seed_and_is_reshuffled_each_epoch(tmp_path: Path) -> None:
    numbered_shards(tmp_path, [8, 8, 8])
    numbered_shards(tmp_path, [2], prefix="test", start=24)  # a test split of its own: train is every train shard
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    first, again, other = (_ids(_take(_batches(data, seed=s, batch=24, micro=24), 2)) for s in (0, 0, 1))
    assert first == again and first != other
    assert sorted(first[:24]) == sorted(first[24:]) == list(range(24)) and first[:24] != first[24:]


def test_the_largest_seed_a_run_takes_streams_shards(tmp_path: Path) -> None:
    """A seed above ~18 million folded past 64 bits into the lane's shuffle seed: the first batch crashed."""
    from vitkit.data.stream import order_seed
    from vitkit.train.config import MAX_SEED

    numbered_shards(tmp_path, [8, 8, 8])
    numbered_shards(tmp_path, [2], prefix="test", start=24)
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    first = _ids(_take(_batches(data, seed=MAX_SEED, batch=24, micro=24), 1))
    assert sorted(first) == list(range(24))
    assert order_seed(4612, 7, 3) == (4612 * 1_000_003 + 7) * 1_000_033 + 3  # a seed's order is what it was
    assert 0 <= order_seed(MAX_SEED, 2**20, 2**20) < 2**64 and order_seed(9, 4) == 9 * 1_000_003 + 4


@pytest.mark.parametrize("workers", [0, 2])
def test_resuming_at_any_step_continues_the_same_stream(tmp_path: Path, workers: int) -> None:
    numbered_shards(tmp_path, [9, 4, 11, 6])
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    whole = _batches(data, workers=workers, batch=6, micro=3)
    steps = _take(whole, 12)  # 72 samples: past the first epoch (30) and the second
    assert whole.state_dict()["step"] == 12
    for start in (1, 4, 9):
        resumed = _batches(data, workers=workers, batch=6, micro=3)
        resumed.load_state_dict({**whole.state_dict(), "step": start})
        assert _ids(_take(resumed, 12 - start)) == _ids(steps[start:]), start
    changed = _batches(data, workers=workers + 2, batch=6, micro=3)  # 0 and 1 workers: both one lane
    with pytest.raises(ValueError, match="lanes_per_process"):
        changed.load_state_dict(whole.state_dict())


def test_cli_shards_then_trains_on_the_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    from vitkit.cli import main

    caplog.set_level("INFO", logger="vitkit.data.sources")
    assert main(["shard", "digits", "--out", str(tmp_path / "wds"), "--samples-per-shard", "500", "--json"]) == 0
    written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert written["splits"]["train"] == {"shards": 3, "samples": 1438, "skipped": 0}
    assert main(["shard", "digits", "--out", str(tmp_path / "wds"), "--samples-per-shard", "5"]) == 2
    assert "already holds shards" in capsys.readouterr().err
    code = main(
        [
            "train",
            "--data",
            f"wds:{tmp_path / 'wds'}",
            "--recipe",
            "small-8px-tiny",
            "--out",
            str(tmp_path / "run"),
            "--json",
            "--set",
            "run.threads=1",
            "--set",
            "data.steps=2",
            "--set",
            "data.max_in_memory_mb=0",
        ]
    )
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert code == 0 and result["step"] == 2 and result["test"]["count"] == 359
    # the index keeps the source's flip rule (a mirrored digit is no digit): shards of digits train without flips
    assert json.loads((tmp_path / "wds" / "dataset.json").read_text())["mirror_keeps_label"] is False
    assert mirror_keeps_label(f"wds:{tmp_path / 'wds'}") is False and mirror_keeps_label("digits") is False
    assert "train: 1438 images, 10 classes, streamed from shards by every process and worker" in caplog.text


@pytest.mark.parametrize("fmt", ["GNU_FORMAT", "PAX_FORMAT", "USTAR_FORMAT"])
def test_tar_reader_agrees_with_tarfile_on_every_format(tmp_path: Path, fmt: str) -> None:
    import tarfile

    from vitkit.data.tarshards import tar_members

    names = ["a.png", "d" * 60 + "/" + "n" * 70 + ".png", "x" * 150 + ".cls", "é/ü.json"]
    if fmt == "USTAR_FORMAT":
        names = names[:2] + ["é/ü.json"]  # ustar: a name up to 100 bytes plus a 155-byte prefix, no more
    with tarfile.open(tmp_path / "t.tar", "w", format=getattr(tarfile, fmt)) as tar:
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 700 * k + 3
            tar.addfile(info, io.BytesIO(bytes([k]) * info.size))
        folder = tarfile.TarInfo("folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a regular file: skipped by both
    with tarfile.open(tmp_path / "t.tar") as tar:
        theirs = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
    with open(tmp_path / "t.tar", "rb") as handle:
        ours = [(m.name, m.offset, m.size) for m in tar_members(handle)]
    assert ours == theirs and [n for n, _, _ in ours] == names


def test_damaged_and_truncated_shards_count_their_rest_as_corrupt(tmp_path: Path) -> None:
    numbered_shards(tmp_path, [4, 4])
    damaged = bytearray((tmp_path / "train-000000.tar").read_bytes())
    damaged[2 * 1024 + 130] ^= 0x01  # the size field of sample 1's image header: its checksum fails
    (tmp_path / "train-000000.tar").write_bytes(bytes(damaged))
    whole = (tmp_path / "train-000001.tar").read_bytes()
    (tmp_path / "train-000001.tar").write_bytes(whole[: 2 * 1024 + 512 + 50])  # ends inside sample 1's image
    index = {
        "splits": {"train": [{"shard": "train-000000.tar", "count": 4}, {"shard": "train-000001.tar", "count": 4}]},
        "classes": [str(k) for k in range(10)],
        "channels": 1,
    }
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    samples = read_all(data)
    assert [bool(s.problem) for s in samples] == [False, True, True, True, False, True, True, True]
    batches = _batches(data, batch=8, micro=8)
    assert sorted(_ids(_take(batches, 1))) == [0, 4] and batches.skipped == 6


def test_shards_keep_the_training_splits_channels(tmp_path: Path) -> None:
    """A colour train split beside a grayscale test split wrote "channels": 1 (the last split's), and training on
    the shards built a grayscale model where the source itself gave a colour one."""
    datasets = pytest.importorskip("datasets")

    def split(mode: str, count: int):
        rows = {"image": [], "label": []}
        for i in range(count):
            buffer = io.BytesIO()
            Image.new(mode, (8, 8), (40 * i) % 256 if mode == "L" else (40 * i % 256, 0, 0)).save(buffer, "PNG")
            rows["image"].append({"bytes": buffer.getvalue(), "path": None})
            rows["label"].append(i % 2)
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
        return datasets.Dataset.from_dict(rows, features=features)

    datasets.DatasetDict({"train": split("RGB", 20), "test": split("L", 6)}).save_to_disk(str(tmp_path / "hf"))
    write_shards(f"hf:{tmp_path / 'hf'}", tmp_path / "wds", 8)
    assert json.loads((tmp_path / "wds" / "dataset.json").read_text())["channels"] == 3
    assert describe(f"wds:{tmp_path / 'wds'}").channels == describe(f"hf:{tmp_path / 'hf'}").channels == 3


def test_a_damaged_shard_read_by_every_process_is_named_by_the_loading_logger(tmp_path: Path, caplog) -> None:
    """Read into memory, every process reads every shard (named once by each under torchrun); streamed, a
    process reads its own share, which only it can name."""
    import logging

    from vitkit.data import tarsamples

    with caplog.at_level(logging.WARNING, logger="vitkit"):
        with tarsamples.loading():
            tarsamples._name_once(str(tmp_path / "a.tar"), "a.tar: damaged")
        tarsamples._name_once(str(tmp_path / "b.tar"), "b.tar: damaged")
    by = {record.getMessage(): record.name for record in caplog.records}
    assert by == {"a.tar: damaged": "vitkit.data.tarshards.loading", "b.tar: damaged": "vitkit.data.tarshards"}
