"""Shards read as untrusted input: forged tar headers are bounded by the file's real size, a bad shard
affects only itself, and a split left with no usable sample is one clear error."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from shardkit import numbered_shards, write_tar
from vitkit.data.imageset import EmptySplitError
from vitkit.data.shardscan import scan_shard
from vitkit.data.sources import load_split
from vitkit.data.stream import decode_samples, read_all
from vitkit.data.tarshards import TarFormatError, tar_members

EIGHT_GIB = 8 << 30


def forge_size(path: Path, header: int, size: int) -> None:
    """Rewrite the size field of the `header`-th 512-byte block of a tar (checksum recomputed)."""
    raw = bytearray(path.read_bytes())
    block = raw[header * 512 : (header + 1) * 512]
    block[124:136] = b"%011o\0" % size if size < 8**11 else b"\x80" + size.to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    raw[header * 512 : (header + 1) * 512] = block
    path.write_bytes(bytes(raw))


def _forged_beside_valid_test(tmp_path: Path, first: str = "a.png") -> Path:
    numbered_shards(tmp_path, [10], prefix="test")
    members = [(first, b"x" * 100), ("a.cls" if first != "a.cls" else "a.png", b"1")]
    forge_size(write_tar(tmp_path / "train-000000.tar", members), 0, EIGHT_GIB)
    return tmp_path


@pytest.mark.parametrize("first", ["a.png", "a.cls"])
def test_a_header_claiming_8_gib_is_a_clear_error_and_the_test_shard_still_reads(tmp_path: Path, first: str) -> None:
    uri = f"wds:{_forged_beside_valid_test(tmp_path, first)}"
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(EmptySplitError) as caught:
        load_split(uri, "train", image_size=8)
    seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    message = str(caught.value)
    assert seconds < 1.0 and peak < 16 << 20  # nothing allocated beyond the headers
    assert "train-000000.tar" in message and "8,589,934,592" in message and "train split" in message
    test = load_split(uri, "test", image_size=8)
    assert len(test) == 10 and test.skipped == 0 and test.num_classes == 10


def test_member_sizes_are_bounded_by_the_file(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "t.tar", [("a.png", b"x" * 600), ("a.cls", b"1")])
    forge_size(path, 0, EIGHT_GIB)
    with open(path, "rb") as handle, pytest.raises(TarFormatError, match=r"a\.png.*8,589,934,592 bytes"):
        list(tar_members(handle))


def test_an_indexed_forged_shard_counts_as_skipped_and_names_the_file(tmp_path: Path) -> None:
    _forged_beside_valid_test(tmp_path)
    index = {
        "splits": {
            "train": [{"shard": "train-000000.tar", "count": 1}],
            "test": [{"shard": "test-000000.tar", "count": 10}],
        },
        "classes": [str(k) for k in range(10)],
    }
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    with pytest.raises(EmptySplitError, match=r"1 skipped as corrupt.*train-000000\.tar.*8,589,934,592 bytes"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert len(load_split(f"wds:{tmp_path}", "test", image_size=8)) == 10


def test_a_damaged_shard_spoils_only_itself_and_is_named_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = numbered_shards(tmp_path, [4, 6])
    forge_size(tmp_path / "train-000000.tar", 4, EIGHT_GIB)  # sample 1's image header
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    assert len(data) == 7 and len(data.problems) == 1  # the scan counts sample 0 of the damaged shard
    samples = read_all(data) + read_all(data)
    assert [s.key.rpartition(":")[2] for s in samples if not s.problem] == [f"s{i:06d}" for i in [0, *ids[4:]]] * 2
    assert caplog.text.count("train-000000.tar") == 1 and "8,589,934,592" in caplog.text
    memory = load_split(f"wds:{tmp_path}", "train", image_size=8)
    assert len(memory) == 7 and memory.skipped == 0


def test_a_stream_with_no_usable_sample_stops_with_a_clear_error(tmp_path: Path) -> None:
    import torch

    from vitkit.data.stream import ShardBatches

    for k in range(2):
        members = [m for i in range(5) for m in ((f"s{i}.png", b"\x89PNG broken"), (f"s{i}.cls", b"1"))]
        write_tar(tmp_path / f"train-{k:06d}.tar", members)
    numbered_shards(tmp_path, [2], prefix="test", classes=2)  # a test split of its own: train is every train shard
    data = load_split(f"wds:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0)
    batches = ShardBatches(
        data,
        seed=0,
        global_batch=2,
        rank=0,
        world=1,
        micro_batch=2,
        device=torch.device("cpu"),
        workers=0,
        strict=False,
        window=4,
    )
    with pytest.raises(EmptySplitError, match=r"10 samples\) has no usable sample: the last 10 read"):
        for _ in zip(range(100), batches, strict=False):
            pass


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({"shard": "train-000000.tar", "count": "many"}, "bad entry"),
        ({"shard": "../elsewhere.tar", "count": 1}, "bad entry"),
        ({"shard": "train-000000.tar", "count": 10**12}, "hold at most"),
        ({"count": 1}, "bad entry"),
        ("train-000000.tar", "bad entry"),
    ],
)
def test_index_entries_are_checked(tmp_path: Path, entry: object, problem: str) -> None:
    numbered_shards(tmp_path, [3])
    (tmp_path / "dataset.json").write_text(json.dumps({"splits": {"train": [entry]}}))
    with pytest.raises(ValueError, match=problem):
        load_split(f"wds:{tmp_path}", "train", image_size=8)


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"classes": 5}, "'classes'"),
        ({"classes": ["a", "a", "c"]}, "'a' appears twice"),  # as classes.txt refuses them
        ({"classes": ["a", "", "c"]}, "class 2 is empty"),
        ({"classes": ["a", "b\x0cc", "d"]}, "class 2's name holds a control character"),
        ({"channels": 7}, "'channels'"),
        ({"image_size": "big"}, "'image_size'"),
        ({"image_size": 100_000}, r"'image_size' must be .* at most 9,459 \(the readers' pixel limit\), got 100000"),
        ({"splits": []}, "'splits'"),
    ],
)
def test_index_fields_are_checked(tmp_path: Path, fields: dict, problem: str) -> None:
    numbered_shards(tmp_path, [3])
    index = {"splits": {"train": [{"shard": "train-000000.tar", "count": 3}]}, **fields}
    (tmp_path / "dataset.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"dataset.json: .*{problem}"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)


def _header(name: bytes, size_field: bytes, kind: bytes = b"0") -> bytes:
    block = bytearray(512)
    block[: len(name)], block[124:136], block[156:157] = name, size_field, kind
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


@pytest.mark.parametrize(
    "size_field, problem",
    [(b"-0000001000\0", "bad number"), (b"\xff" * 12, "negative"), (b"0000000009\0\0", "bad number")],
)
def test_size_fields_must_be_non_negative_numbers(tmp_path: Path, size_field: bytes, problem: str) -> None:
    path = tmp_path / "t.tar"
    path.write_bytes(_header(b"a.png", size_field) + bytes(2048))
    with open(path, "rb") as handle, pytest.raises(TarFormatError, match=problem):
        list(tar_members(handle))


def test_a_pax_record_of_length_zero_is_an_error_not_a_loop(tmp_path: Path) -> None:
    records = b"0 path=x.png\n".ljust(512, b"\0")
    path = tmp_path / "t.tar"
    path.write_bytes(_header(b"pax", b"%011o\0" % 13, b"x") + records + _header(b"a.png", b"%011o\0" % 0) + bytes(1024))
    with open(path, "rb") as handle, pytest.raises(TarFormatError, match="damaged pax header"):
        list(tar_members(handle))


@pytest.mark.parametrize("text", ["1_0", "\u0663", "+3", "0x1", "1.0", ""])
def test_a_text_label_is_ascii_digits(text: str) -> None:
    """int() reads "1_0" as 10 and an Arabic-Indic three as 3: a label member holds ASCII digits, nothing else."""
    from vitkit.data.tarsamples import _parse_label

    with pytest.raises(ValueError, match="not a class index" if text else "the label is empty"):
        _parse_label("cls", text.encode())
    assert _parse_label("cls", b" 7\n") == 7 and _parse_label("a.cls", b"12") == 12


def test_strict_stops_at_every_kind_of_bad_sample_in_memory_and_streamed(tmp_path: Path) -> None:
    """--strict stopped at a bad image only, and only in memory a sample without a label went by as skipped;
    a damaged shard was a warning either way."""
    from vitkit.data.images import BadImageError

    labelless = tmp_path / "labelless"
    numbered_shards(labelless, [4])
    write_tar(labelless / "train-000001.tar", [("lone.png", (labelless / "train-000000.tar").read_bytes()[:0])])
    damaged = tmp_path / "damaged"
    numbered_shards(damaged, [4, 6])
    forge_size(damaged / "train-000000.tar", 4, EIGHT_GIB)
    for directory, problem in ((labelless, "lone"), (damaged, "train-000000.tar")):
        for memory in (None, 0):
            budget = {} if memory is None else {"max_in_memory_bytes": memory}
            assert len(load_split(f"wds:{directory}", "train", image_size=8, **budget)) >= 4  # skipped by default
            with pytest.raises(BadImageError, match=problem):  # on loading, or on decoding what a stream reads
                data = load_split(f"wds:{directory}", "train", image_size=8, strict=True, **budget)
                decode_samples(read_all(data), data, strict=True)


def test_a_shard_whose_samples_files_are_not_together_is_refused(tmp_path: Path) -> None:
    """`tar cf shard.tar -C dir .` stores files in directory order, not a sample's files together: every group
    lacked its image or its label, 321 of 322 samples were skipped, and the run trained on one image."""
    from shardkit import numbered_images, png

    images, labels = numbered_images(12)
    pictures = [(f"s{i:02d}.png", png(images[i])) for i in range(12)]
    classes = [(f"s{i:02d}.cls", str(labels[i]).encode()) for i in range(12)]
    (tmp_path / "wds").mkdir()
    write_tar(tmp_path / "wds" / "train-000000.tar", pictures[:6] + classes[:6] + pictures[6:] + classes[6:])
    with pytest.raises(ValueError, match=r"train-000000.tar: the files of sample 's00' are not next to each other"):
        load_split(f"wds:{tmp_path / 'wds'}", "train", image_size=8)


def test_a_sample_of_several_images_is_named(tmp_path: Path, caplog) -> None:
    """webdataset's key ends at the first dot of a file name: cat.0.png and cat.1.png are one sample "cat", of
    which one image was read, and the rest vanished without a word."""
    from shardkit import numbered_images, png

    images, _ = numbered_images(8)
    members = []
    for name, label, ids in (("cat", 0, range(4)), ("dog", 1, range(4, 8))):
        for i in ids:
            members += [(f"{name}.{i}.png", png(images[i])), (f"{name}.{i}.cls", str(label).encode())]
    (tmp_path / "wds").mkdir()
    write_tar(tmp_path / "wds" / "train-000000.tar", members)
    with caplog.at_level("WARNING"):
        load_split(f"wds:{tmp_path / 'wds'}", "train", image_size=8)
    assert scan_shard(tmp_path / "wds" / "train-000000.tar")[0] == 2  # two samples, of 8 images
    assert "sample 'cat' holds 4 images (0.png, 1.png, 2.png, 3.png)" in caplog.text
    assert "key ends at the first dot" in caplog.text and caplog.text.count("holds 4 images") == 1  # once
    caplog.clear()
    from vitkit.data import tarsamples

    tarsamples._named.discard("several images in a sample")  # said once a process: said again here if it fires
    members = [m for i in range(4) for m in ((f"k{i}.jpg", b"x"), (f"k{i}.mask.png", b"y"), (f"k{i}.cls", b"0"))]
    write_tar(tmp_path / "wds" / "train-000000.tar", members)  # an image and its mask: a sample as meant
    with caplog.at_level("WARNING"):
        scan_shard(tmp_path / "wds" / "train-000000.tar")
    assert "images" not in caplog.text


def test_gzip_compressed_shards_are_named_as_such(tmp_path: Path) -> None:
    """A folder of .tar.gz shards had "no train split (no train-* shards)"; gzip data under a .tar name was
    "damaged after 0 samples (header checksum mismatch at byte 0)": neither said the shards are compressed."""
    import gzip

    numbered_shards(tmp_path / "plain", [4])
    packed = tmp_path / "gz"
    packed.mkdir()
    data = gzip.compress((tmp_path / "plain" / "train-000000.tar").read_bytes())
    (packed / "train-000000.tar.gz").write_bytes(data)
    with pytest.raises(ValueError, match=r"gzip-compressed shards \(1 \.tar\.gz\).*gunzip"):
        load_split(f"wds:{packed}", "train", image_size=8)
    (packed / "train-000000.tar.gz").rename(packed / "train-000000.tar")
    with open(packed / "train-000000.tar", "rb") as handle, pytest.raises(TarFormatError, match="gzip-compressed"):
        list(tar_members(handle))
    with pytest.raises(ValueError, match=r"no sample has a label, and 1 shard\(s\) are damaged.*gzip-compressed"):
        load_split(f"wds:{packed}", "train", image_size=8)  # it said "no sample has a label ... pretrain-mpp"


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("cls", b"0x1", "not a class index"),
        ("cls", b"", "the label is empty"),
        ("json", b'{"label": 1.5}', 'no "label" or "cls" field holding a class index or a class name'),
    ],
)
def test_labels_that_do_not_parse_say_why(tmp_path: Path, name: str, content: bytes, why: str) -> None:
    """Every label neither a class index nor a class name: the error said "no sample has a label (a .cls or .json
    member)", which the shards contradict."""
    from shardkit import numbered_images, png

    images, _ = numbered_images(4)
    members = [m for i in range(4) for m in ((f"s{i}.png", png(images[i])), (f"s{i}.{name}", content))]
    (tmp_path / "wds").mkdir()
    write_tar(tmp_path / "wds" / "train-000000.tar", members)
    with pytest.raises(ValueError, match=rf"no sample has a label that reads as a class index.*s0.*{why}"):
        load_split(f"wds:{tmp_path / 'wds'}", "train", image_size=8)


def test_a_class_name_longer_than_a_name_holds_is_refused(tmp_path: Path) -> None:
    """classes.txt with one 60 MB line took 39 s and went into every checkpoint's config.json, whose reader then
    refused it: the run's models could not be loaded."""
    numbered_shards(tmp_path, [10], classes=2)
    (tmp_path / "classes.txt").write_text("a\n" + "b" * 1_001 + "\n")
    with pytest.raises(ValueError, match="classes.txt: line 2's name is 1,001 characters, more than a class name"):
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    (tmp_path / "classes.txt").write_text("a\n" + "b" * 1_000 + "\n")
    assert load_split(f"wds:{tmp_path}", "train", image_size=8).class_names[1] == "b" * 1_000


def test_class_names_are_bounded_as_a_checkpoint_writes_them(tmp_path: Path) -> None:
    """The bound counted characters, but config.json escapes every non-ASCII one (6 bytes, 12 for an emoji):
    16 M characters of names made a 96 MB config.json that its reader (64 MiB) refused, so the model was lost."""
    from vitkit.data.tarsamples import MAX_NAMES_BYTES, check_class_names

    names = [f"{i:03d}" + "\U0001f600" * 997 for i in range(720)]  # 720,000 characters, 8.6 MB as JSON
    assert MAX_NAMES_BYTES == 8 << 20
    with pytest.raises(ValueError, match=r"classes.txt: the class names take more than 8,388,608 bytes"):
        check_class_names(names, "classes.txt", "line")
    check_class_names(names[:600], "classes.txt", "line")  # 7.2 MB
