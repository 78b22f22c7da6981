"""What a wds: split says about shards that do not hold what they should: a truncated shard is named as
truncated, labels that leave class ids without an image are pointed out, and an index that miscounts
a shard is one warning, not a corrupt sample per missing entry."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from shardkit import image_ids, numbered_images, numbered_shards, png, write_tar
from vitkit.data.sources import load_split
from vitkit.data.stream import ShardBatches, read_all
from vitkit.data.tarshards import TarFormatError, scan_shard, tar_members


def label_first_shards(directory: Path, labels: list[list[int]]) -> list[Path]:
    """Shards train-00000k.tar as webdataset's ShardWriter writes them (members sorted: .cls before the
    image), sample i of all holding numbered image i and label labels[k][j]."""
    images, _ = numbered_images(sum(map(len, labels)))
    paths, i = [], 0
    for k, shard in enumerate(labels):
        members = []
        for label in shard:
            members += [(f"s{i:06d}.cls", str(label).encode()), (f"s{i:06d}.png", png(images[i]))]
            i += 1
        paths.append(write_tar(directory / f"train-{k:06d}.tar", members))
    return paths


def header_offsets(path: Path) -> dict[str, int]:
    """Where each member's header starts in the tar."""
    with open(path, "rb") as handle:
        return {member.name: member.offset - 512 for member in tar_members(handle)}


def _cut(path: Path, where: str) -> None:
    """Truncate the shard as a copy cut short does: inside the padding after sample 5's label, or at the
    start of its image's header (a 512-byte boundary).  Neither leaves the tar's end-of-archive blocks."""
    offsets = header_offsets(path)
    end = offsets["s000015.png"] - (100 if where == "padding" else 0)
    path.write_bytes(path.read_bytes()[:end])


@pytest.mark.parametrize("where", ["padding", "header"])
def test_a_truncated_shard_is_named_as_truncated(tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str) -> None:
    caplog.set_level(logging.INFO)
    paths = label_first_shards(tmp_path, [[k % 3 for k in range(10)], [k % 3 for k in range(10)]])
    numbered_shards(tmp_path, [6], prefix="test", classes=3)
    _cut(paths[1], where)
    with open(paths[1], "rb") as handle, pytest.raises(TarFormatError, match="truncated"):
        list(tar_members(handle))
    count, _top, problem = scan_shard(paths[1])
    assert count == 6 and f"{paths[1]} is truncated after 6 samples" in problem
    data = load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert len(data) == 15 and data.skipped == 1  # sample 15: its label only
    assert caplog.text.count(f"{paths[1]} is truncated after 6 samples") == 1
    assert "1 damaged shard(s)" in caplog.text  # the split's summary line counts the shard


def test_a_hidden_file_named_like_a_shard_is_no_shard(tmp_path: Path) -> None:
    """macOS's ._train-000000.tar beside each copied shard had been read as a damaged shard (fatal with --strict)."""
    label_first_shards(tmp_path, [[k % 3 for k in range(10)]])
    alone = load_split(f"wds:{tmp_path}", "train", image_size=8, strict=True)
    (tmp_path / "._train-000000.tar").write_bytes(b"\x00\x05\x16\x07" + bytes(4092))  # AppleDouble metadata
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, strict=True)
    assert torch.equal(data.labels, alone.labels) and data.origin == alone.origin


def test_an_empty_shard_is_damaged_not_a_shard_of_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A 0-byte file, what a failed copy leaves, had been read as a whole shard of no samples, --strict or not."""
    caplog.set_level(logging.INFO)
    paths = label_first_shards(tmp_path, [[k % 3 for k in range(10)], [k % 3 for k in range(10)]])
    numbered_shards(tmp_path, [6], prefix="test", classes=3)
    paths[1].write_bytes(b"")
    with open(paths[1], "rb") as handle, pytest.raises(TarFormatError, match="empty"):
        list(tar_members(handle))
    assert len(load_split(f"wds:{tmp_path}", "train", image_size=8)) == 10
    assert "1 damaged shard(s)" in caplog.text


def test_a_truncated_indexed_shard_counts_what_it_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = label_first_shards(tmp_path, [[k % 3 for k in range(10)], [k % 3 for k in range(10)]])
    numbered_shards(tmp_path, [6], prefix="test", classes=3)
    _cut(paths[1], "header")
    test = [{"shard": "test-000000.tar", "count": 6}]
    splits = {"train": [{"shard": p.name, "count": 10} for p in paths], "test": test}
    index = {"splits": splits, "classes": ["a", "b", "c"]}
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    samples = read_all(data)
    assert [bool(s.problem) for s in samples] == [False] * 15 + [True] * 5
    assert f"{paths[1]} is truncated after 6 samples" in caplog.text


def test_labels_that_leave_class_ids_without_an_image_are_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    labels = [[k % 3 for k in range(10)], [k % 3 for k in range(10)]]
    labels[1][4] = 4  # one label past the others: sample s000014
    paths = label_first_shards(tmp_path, labels)
    numbered_shards(tmp_path, [6], prefix="test", classes=3)
    data = load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert data.num_classes == 5  # still trains (the label is a class), but says so
    assert "1 of the 5 class ids 0..4 have no image in the shards (e.g. 3)" in caplog.text
    assert f"{paths[1]}:s000014" in caplog.text and "classes.txt" in caplog.text
    caplog.clear()
    load_split(f"wds:{tmp_path}", "test", image_size=8)
    assert "have no image" not in caplog.text  # said once


def test_a_stray_label_that_leaves_most_class_ids_empty_is_refused(tmp_path: Path) -> None:
    """A label of 30000 among 0..2 had trained a 30,001-class model, whose final evaluation then asked for
    7 GB of confusion matrix."""
    labels = [[k % 3 for k in range(10)], [k % 3 for k in range(10)]]
    labels[1][4] = 97
    paths = label_first_shards(tmp_path, labels)
    with pytest.raises(ValueError, match=f"94 of the 98 class ids 0..97 have no image.*{paths[1]}:s000014") as caught:
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert "(e.g. 3, 4, 5, 6, 7)" in str(caught.value)  # the first five, read from the ids' bits in one pass


def test_contiguous_labels_say_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    label_first_shards(tmp_path, [[k % 3 for k in range(10)]])
    numbered_shards(tmp_path, [6], prefix="test", classes=3)
    assert load_split(f"wds:{tmp_path}", "train", image_size=8).num_classes == 3
    assert "have no image" not in caplog.text


def test_a_label_beyond_classes_txt_names_its_shard_and_sample(tmp_path: Path) -> None:
    labels = [[k % 3 for k in range(10)], [k % 3 for k in range(10)]]
    labels[1][4] = 97
    paths = label_first_shards(tmp_path, labels)
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match="classes.txt names 3 classes") as caught:
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert f"{paths[1]}:s000014 holds label 97" in str(caught.value)
    (tmp_path / "classes.txt").write_bytes("\ufeffa\nb\nc\n".encode())  # a Windows editor's byte-order mark
    with pytest.raises(ValueError, match="classes.txt names 3 classes"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    from vitkit.data.large import class_file_names

    assert class_file_names(str(tmp_path), None) == ["a", "b", "c"]  # the mark had stayed in the first name
    splits = {"train": [{"shard": path.name, "count": 10} for path in paths]}
    (tmp_path / "dataset.json").write_text(json.dumps({"splits": splits}))  # an index that names no classes
    with pytest.raises(ValueError, match="classes.txt names 3 classes"):  # had dropped label 97's samples unsaid
        load_split(f"wds:{tmp_path}", "train", image_size=8)


def _stale_index(tmp_path: Path) -> Path:
    """Two train shards of 8 and a test shard, with dataset.json counting 20 in the first."""
    numbered_shards(tmp_path, [8, 8])
    numbered_shards(tmp_path, [4], prefix="test", start=16)
    index = {
        "splits": {
            "train": [{"shard": "train-000000.tar", "count": 20}, {"shard": "train-000001.tar", "count": 8}],
            "test": [{"shard": "test-000000.tar", "count": 4}],
        },
        "classes": [str(k) for k in range(10)],
        "channels": 1,
    }
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    return tmp_path / "train-000000.tar"


def test_an_index_counting_more_than_a_shard_holds_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = _stale_index(tmp_path)
    data = load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert len(data) == 16 and data.skipped == 0  # the shard's true count; nothing is corrupt
    assert "skipping corrupt sample" not in caplog.text
    stale = f"dataset.json says {shard} holds 20 samples, but the file holds 8"
    assert caplog.text.count(stale) == 1 and "re-run `vitkit shard`" in caplog.text


def test_a_stream_over_a_stale_index_skips_nothing_as_corrupt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _stale_index(tmp_path)
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    batches = ShardBatches(
        data,
        seed=0,
        global_batch=28,
        rank=0,
        world=1,
        micro_batch=28,
        device=torch.device("cpu"),
        workers=0,
        strict=False,
        window=4,
    )
    step = next(iter(batches))
    ids = [i for images, _ in step for i in image_ids(images)]
    assert sorted(ids) == list(range(16)) and batches.skipped == 0
    assert "skipping corrupt sample" not in caplog.text and caplog.text.count("holds 20 samples") == 1
    assert np.array_equal(np.sort(ids), np.arange(16))


def test_a_stale_index_is_sharded_again_without_its_absent_samples(tmp_path: Path) -> None:
    """`vitkit shard wds:` over an index counting samples a shard does not hold failed with a TypeError (the
    absent samples' label is None); they are dropped as training drops them."""
    from vitkit.data.shard import write_shards

    _stale_index(tmp_path / "in")
    report = write_shards(f"wds:{tmp_path / 'in'}", tmp_path / "out", samples_per_shard=100)
    assert (
        report["splits"]["train"]["samples"] == 16
        and len(load_split(f"wds:{tmp_path / 'out'}", "train", image_size=8)) == 16
    )


def test_an_index_that_lists_a_shard_twice_is_refused(tmp_path: Path) -> None:
    """A 1 MB dataset.json listing one shard 20,000 times claimed 2e9 samples: training tried to allocate 16 GB
    (and said "out of memory: lower --batch-size"), evaluation stepped through them for minutes."""
    _stale_index(tmp_path)
    index = json.loads((tmp_path / "dataset.json").read_text())
    index["splits"]["train"] = [{"shard": "train-000000.tar", "count": 8}] * 3
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lists train-000000.tar more than once"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    index["splits"]["train"] = [{"shard": "train-000000.tar", "count": 8}]
    index["splits"]["test"] = [{"shard": "./train-000000.tar", "count": 8}]  # in two splits, spelt another way
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="more than once"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    (tmp_path / "linked.tar").symlink_to(tmp_path / "train-000000.tar")  # one file under another name
    index["splits"]["test"] = [{"shard": "linked.tar", "count": 8}]
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="lists linked.tar more than once"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)


def test_sharding_a_folder_reads_no_file_larger_than_an_image(tmp_path: Path, caplog) -> None:
    """`vitkit shard folder:` read every file whole: a 7 GB (sparse) file among the photos ended it in "out of
    memory"; it is left out in one line, as training and evaluation leave it out."""
    from vitkit.data.shard import write_shards

    for name in ("a", "b"):
        (tmp_path / "in" / name).mkdir(parents=True)
        for k in range(3):
            (tmp_path / "in" / name / f"{k}.png").write_bytes(png(np.full((8, 8), 30 * k, np.uint8)))
    with open(tmp_path / "in" / "a" / "huge.png", "wb") as file:
        file.truncate(7 << 30)
    with caplog.at_level(logging.WARNING):
        report = write_shards(f"folder:{tmp_path / 'in'}", tmp_path / "out", samples_per_shard=100)
    assert "huge.png" in caplog.text and "larger than an image file may be" in caplog.text
    assert sum(split["samples"] for split in report["splits"].values()) == 6


def pillow_halved(image: torch.Tensor) -> torch.Tensor:
    from PIL import Image

    small = Image.fromarray(image[0].numpy()).resize((4, 4), Image.Resampling.BICUBIC, reducing_gap=2.0)
    return torch.from_numpy(np.array(small))[None]


def image_sums(images: torch.Tensor) -> torch.Tensor:
    return images.flatten(1).sum(1)


def test_array_images_above_the_pixel_limit_are_refused_before_writing(tmp_path: Path, monkeypatch) -> None:
    """Arrays were written as PNGs of any size, which `wds:` then refused one by one: shards of nothing.
    Above the readers' pixel limit they are refused before anything is written, naming `--max-side`; with it
    they are downscaled from the array."""
    import vitkit.data.shard as shard
    import vitkit.data.shard_records as shard_records
    from shardkit import numbered_npz

    source = f"npz:{numbered_npz(tmp_path / 'n.npz', 20)}"  # 8x8 images
    monkeypatch.setattr(shard, "MAX_PIXELS", 63)
    with pytest.raises(ValueError, match=r"8x8 .*64 pixels.*limit 63.*--max-side"):
        shard.write_shards(source, tmp_path / "out", samples_per_shard=10)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"written 8x8 .*give a smaller --max-side"):
        shard.write_shards(source, tmp_path / "still", samples_per_shard=10, max_side=9)

    def reopened(*args, **kwargs):  # what the readers would refuse above their limit: an array is not re-read
        raise AssertionError("an array image went through the file decoder")

    monkeypatch.setattr(shard_records, "open_image", reopened)
    report = shard.write_shards(source, tmp_path / "small", samples_per_shard=10, max_side=4)
    train = load_split(source, "train")
    assert report["splits"]["train"]["samples"] == len(train) and report["splits"]["train"]["skipped"] == 0
    written = load_split(f"wds:{tmp_path / 'small'}", "train", image_size=4)
    assert written.images.shape == (len(train), 1, 4, 4)
    halved = torch.stack([pillow_halved(image) for image in train.images])  # what thumbnail does to a file
    assert torch.equal(torch.sort(image_sums(written.images)).values, torch.sort(image_sums(halved)).values)


def test_a_source_of_no_readable_training_image_is_an_error_not_an_empty_data_set(tmp_path: Path) -> None:
    """Parquet rows holding relative image paths, sharded from another directory: every image was left out, and
    `vitkit shard` exited 0 with "train with: vitkit train --data wds:OUT", which then found no train split."""
    from vitkit.data.shard import write_shards

    for name in ("a", "b"):
        (tmp_path / "in" / name).mkdir(parents=True)
        for k in range(3):
            (tmp_path / "in" / name / f"{k}.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match=r"no training image could be read \(\d+ left out, each named above\)"):
        write_shards(f"folder:{tmp_path / 'in'}", tmp_path / "out", samples_per_shard=100)
    assert not (tmp_path / "out").exists()  # no marker, no shard, no directory: nothing half-written


def test_the_shard_command_counts_what_did_not_open_and_keeps_what_it_did_not_decode(tmp_path: Path, capsys) -> None:
    """ "1 unreadable left out" read as if the shards were clean, while a JPEG cut short, whose header opens, went
    in as its bytes (training skips it, named): the line says what was checked."""
    import io

    from PIL import Image

    from vitkit.cli import main

    for name in ("a", "b"):
        (tmp_path / "in" / name).mkdir(parents=True)
        for k in range(5):
            (tmp_path / "in" / name / f"{k}.png").write_bytes(png(np.full((8, 8), 30 * k, np.uint8)))
    (tmp_path / "in" / "a" / "notes.jpg").write_text("not an image")
    jpeg = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(jpeg, format="JPEG")
    (tmp_path / "in" / "b" / "cut.jpg").write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])  # header whole
    assert main(["shard", f"folder:{tmp_path / 'in'}", "--out", str(tmp_path / "out"), "--samples-per-shard", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if "left out" in line]
    assert len(said) == 1 and said[0].endswith(", 1 left out (each named above)")  # the text file, not the cut JPEG
    assert sum(int(line.split(": ")[1].split()[0]) for line in lines if " samples in " in line) == 11


def test_samples_left_out_of_a_wds_source_are_each_named(tmp_path: Path, capsys, caplog) -> None:
    """Re-sharding `wds:` counted a sample without a label or with a bad one as left out, "each named above",
    and named none."""
    from vitkit.cli import main

    images, _ = numbered_images(6)
    members = []
    for i in range(6):
        members.append((f"s{i:06d}.png", png(images[i])))
        if i != 1:  # s000001: no label; s000002: a label that is no number
            members.append((f"s{i:06d}.cls", b"abc" if i == 2 else str(i % 2).encode()))
    (tmp_path / "src").mkdir()
    write_tar(tmp_path / "src" / "train-000000.tar", members)
    with caplog.at_level(logging.WARNING):
        assert (
            main(["shard", f"wds:{tmp_path / 'src'}", "--out", str(tmp_path / "out"), "--samples-per-shard", "4"]) == 0
        )
    lines = capsys.readouterr().out.splitlines()
    assert any(line.endswith(", 2 left out (each named above)") for line in lines)
    named = [r.getMessage() for r in caplog.records if "s000001" in r.getMessage() or "s000002" in r.getMessage()]
    assert len(named) == 2 and all(message.startswith("leaving out sample ") for message in named)
    assert any("train-000000.tar:s000001: no label" in message for message in named)
