"""Tar shards whose labels are class names ("n01443537" in a .cls, "label": "cat" in a .json), read through the
classes.txt beside them: in memory, streamed, held out, and by every verb that reads data."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from shardkit import image_ids, numbered_images, numbered_shards, png, write_tar
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import read_all

NAMES = ["n01443537", "golden retriever", "cat", "dog"]


def named_shards(directory: Path, count: int = 40, classes_txt: bool = True) -> list[int]:
    """Two train shards of numbered 8x8 images labelled by class name (the first .cls text, the second .json), a
    third with integer .cls labels; returns every image's class index."""
    directory.mkdir(parents=True, exist_ok=True)
    images, labels = numbered_images(count, classes=len(NAMES))
    third = count // 3
    for k, rows in enumerate((range(third), range(third, 2 * third), range(2 * third, count))):
        members = []
        for i in rows:
            label = {0: NAMES[labels[i]].encode(), 1: json.dumps({"label": NAMES[labels[i]]}).encode()}.get(k)
            ext = "json" if k == 1 else "cls"
            members += [(f"s{i:06d}.png", png(images[i])), (f"s{i:06d}.{ext}", label or str(labels[i]).encode())]
        write_tar(directory / f"train-{k:06d}.tar", members)
    if classes_txt:
        (directory / "classes.txt").write_text("\n".join(NAMES) + "\n")
    return labels.tolist()


def test_class_name_labels_are_read_through_classes_txt(tmp_path: Path) -> None:
    """Shards labelled by class name beside a classes.txt were refused ("no sample has a label that reads as a
    class index"): the names are read as the classes.txt line they are on, alike in memory and streamed."""
    labels = named_shards(tmp_path)
    uri = f"wds:{tmp_path}"
    info = describe(uri)
    assert (info.num_classes, info.num_train) == (4, 32)  # 40 less the fixed 20% test hold-out
    for part in ("train", "test"):
        memory = load_split(uri, part, image_size=8)
        assert memory.class_names == NAMES
        assert memory.labels.tolist() == [labels[i] for i in image_ids(memory.images)]
        streamed = load_split(uri, part, image_size=8, max_in_memory_bytes=0)
        assert streamed.access == "stream" and streamed.class_names == NAMES
        samples = read_all(streamed)
        assert [s.problem for s in samples] == [""] * len(samples)
        assert sorted((int(s.key.rpartition(":s")[2]), s.label) for s in samples) == sorted(
            zip(image_ids(memory.images), memory.labels.tolist())
        )
    held = load_split(uri, "test", image_size=8).labels
    assert np.bincount(held.numpy()).tolist() == [2, 2, 2, 2]  # the hold-out is drawn by class, names read


def test_a_class_name_not_in_classes_txt_names_the_sample_the_name_and_the_file(tmp_path: Path) -> None:
    named_shards(tmp_path)
    (tmp_path / "classes.txt").write_text("n01443537\ngolden retriever\ncat\nhound\n")  # no "dog"
    with pytest.raises(ValueError) as caught:
        load_split(f"wds:{tmp_path}", "train", image_size=8)
    said = str(caught.value)
    assert (
        f"{tmp_path / 'train-000000.tar'}:s000001" in said and "'dog'" in said and str(tmp_path / "classes.txt") in said
    )


def test_class_name_labels_without_classes_txt_say_how_to_fix_it(tmp_path: Path) -> None:
    """The refusal said "a line of classes.txt" holds the class index: it did not say to write one, nor how."""
    named_shards(tmp_path, classes_txt=False)
    (tmp_path / "train-000002.tar").unlink()  # integer labels beside them: those samples skipped, as before
    with pytest.raises(ValueError) as caught:
        describe(f"wds:{tmp_path}")
    said = str(caught.value)
    assert "class names" in said and "'n01443537'" in said and f"{tmp_path / 'train-000000.tar'}:s000000" in said
    assert f"write {tmp_path / 'classes.txt'}" in said and "one class name a line" in said


def test_every_verb_reads_class_name_labels_through_classes_txt(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """train, eval, fewshot and predict agree on the classes, named by classes.txt."""
    from vitkit.cli import main

    named_shards(tmp_path / "shards")
    uri, run = f"wds:{tmp_path / 'shards'}", str(tmp_path / "run")
    settings = ["--set", "run.threads=1", "--set", "data.steps=2"]
    trained = ["train", "--data", uri, "--recipe", "small-8px-tiny", "--out", run, "--json", *settings]
    assert main(trained) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", run, "--data", uri, "--json"]) == 0, capsys.readouterr().err
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["num_images"] == 8 and evaluated["class_names"] == NAMES
    assert main(["fewshot", run, "--data", uri, "--shots", "1", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_classes"] == 4
    image = tmp_path / "one.png"
    image.write_bytes(png(numbered_images(1)[0][0]))
    assert main(["predict", run, str(image), "--top-k", "4", "--json"]) == 0, capsys.readouterr().err
    predictions = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]["predictions"]
    assert sorted(p["class"] for p in predictions) == sorted(NAMES)
    assert all(NAMES[p["index"]] == p["class"] for p in predictions)


def test_the_scan_reads_the_label_the_reader_reads(tmp_path: Path) -> None:
    """A sample with a .json naming a class before a .cls holding its index: the reader takes the .cls, but the
    scan of the labels took whichever came first, and refused the shards as labelled by class names."""
    images, labels = numbered_images(8, classes=2)
    members = []
    for i in range(8):
        name = json.dumps({"label": "cat"}).encode()
        members += [(f"s{i:06d}.png", png(images[i])), (f"s{i:06d}.json", name), (f"s{i:06d}.cls", b"%d" % labels[i])]
    write_tar(tmp_path / "train-000000.tar", members)
    train = load_split(f"wds:{tmp_path}", "train", image_size=8, val_fraction=0.0)
    assert train.class_names == ["0", "1"] and train.labels.tolist() == [labels[i] for i in image_ids(train.images)]


def test_class_name_labels_are_read_through_an_index_naming_the_classes(tmp_path: Path) -> None:
    """With a dataset.json listing the classes, a classes.txt was not read and neither was the index's list: every
    sample labelled by name was skipped as corrupt, and the split was refused as empty."""
    labels = named_shards(tmp_path, count=30, classes_txt=False)
    entries = [{"shard": f"train-{k:06d}.tar", "count": 10} for k in range(3)]
    (tmp_path / "dataset.json").write_text(json.dumps({"splits": {"train": entries}, "classes": NAMES}))
    train = load_split(f"wds:{tmp_path}", "train", image_size=8, val_fraction=0.0)
    assert len(train) == 24  # the 30 less the fixed 20% test hold-out: none skipped
    assert train.class_names == NAMES and train.labels.tolist() == [labels[i] for i in image_ids(train.images)]


def test_a_json_label_of_digits_is_an_index_and_names_are_composed(tmp_path: Path) -> None:
    """{"label": "9"} was refused ("no integer label") where a .cls holding 9 is read as 9; a decomposed "é" in a
    label (as macOS folder names are) was not the composed "é" of classes.txt, though both look the same."""
    images, labels = numbered_images(8, classes=2)
    names = ["caf\u00e9", "th\u00e9"]  # composed in classes.txt
    members = []
    for i in range(8):
        label = {"label": str(labels[i])} if i % 2 else {"label": unicodedata.normalize("NFD", names[labels[i]])}
        members += [(f"s{i:06d}.png", png(images[i])), (f"s{i:06d}.json", json.dumps(label).encode())]
    write_tar(tmp_path / "train-000000.tar", members)
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n")
    train = load_split(f"wds:{tmp_path}", "train", image_size=8, val_fraction=0.0)
    assert len(train) + len(load_split(f"wds:{tmp_path}", "test", image_size=8)) == 8  # none skipped
    assert train.class_names == names and train.labels.tolist() == [labels[i] for i in image_ids(train.images)]


@pytest.mark.parametrize(("lines", "refused"), [("3 7 0 9 1 8 2 6 4 5", True), ("2010 2011", True), ("0 1 cat", False)])
def test_class_names_in_digits_must_be_their_own_numbers(tmp_path: Path, lines: str, refused: bool) -> None:
    """A classes.txt of "3 7 0 ...": a .cls "3" read as class 3, which line 4 names "9", so every image took
    another class's name in silence (train, eval and `vitkit shard` alike)."""
    numbered_shards(tmp_path, [8], classes=2)
    (tmp_path / "classes.txt").write_text("\n".join(lines.split()) + "\n")
    if refused:
        with pytest.raises(ValueError, match=r"classes.txt: line 1 \(class 0\) is named '(3|2010)', a number other"):
            load_split(f"wds:{tmp_path}", "train", image_size=8)
    else:
        assert load_split(f"wds:{tmp_path}", "train", image_size=8).class_names == ["0", "1", "cat"]


def test_a_column_flag_on_a_source_without_columns_is_refused(tmp_path: Path) -> None:
    """`--label-column species` on wds: shards was ignored in silence, the labels read as ever."""
    named_shards(tmp_path)
    with pytest.raises(ValueError, match=r"--label-column chooses a column of an hf: data set; wds:.* \(it is wds:\)"):
        describe(f"wds:{tmp_path}", label_column="species")
    with pytest.raises(ValueError, match="--image-column chooses a column"):
        describe("digits", image_column="img")
