"""IDX and .npz files read as untrusted input: a header cannot make the reader allocate more than the file holds."""

from __future__ import annotations

import gzip
import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from vitkit.data.readers import IDX_IMAGES_MAGIC, DataFormatError, read_idx, read_npz


def test_a_gzip_stream_inflating_past_its_idx_header_is_cut_there(tmp_path: Path) -> None:
    path = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as handle:  # claims 2 images of 2x2, inflates to 64 MiB
        handle.write(struct.pack(">iiii", IDX_IMAGES_MAGIC, 2, 2, 2) + bytes(64 << 20))
    with pytest.raises(DataFormatError, match=r"= 8 bytes of data but the file holds 9"):
        read_idx(path, IDX_IMAGES_MAGIC)


def test_an_idx_header_claiming_negative_dims_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x-idx3-ubyte"
    path.write_bytes(struct.pack(">iiii", IDX_IMAGES_MAGIC, -1, -8, 2))
    with pytest.raises(DataFormatError, match=r"claims dims \(-1, -8, 2\)"):
        read_idx(path, IDX_IMAGES_MAGIC)


def test_an_npy_header_claiming_more_than_its_member_holds_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros((2, 8, 8), np.uint8))
    header = buffer.getvalue()
    forged = header.replace(b"'shape': (2, 8, 8)", b"'shape': (9999999, 8)", 1)  # the header's padding absorbs it
    path = tmp_path / "d.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("images.npy", forged)
        archive.writestr("labels.npy", header)
    with pytest.raises(DataFormatError, match=r"`images.npy` claims shape \(9999999, 8\) \(79,999,992 bytes\)"):
        read_npz(path)


def test_npz_images_of_another_rank_are_a_data_error(tmp_path: Path) -> None:
    """2-D images (N, H*W) ended in an IndexError inside the reader."""
    from vitkit.data.sources import describe

    np.savez(tmp_path / "flat.npz", images=np.zeros((20, 64), np.uint8), labels=np.arange(20) % 2)
    with pytest.raises(DataFormatError, match=r"`images` has shape \(20, 64\); expected images as \(N, H, W\)"):
        describe(f"npz:{tmp_path / 'flat.npz'}")


def test_a_stray_npz_label_that_leaves_most_class_ids_empty_is_refused(tmp_path: Path) -> None:
    """Label 30000 among 0..2 had planned a 30,001-class model; with class_names the classes are the user's word."""
    from vitkit.data.sources import describe, load_split

    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 30000])
    np.savez(tmp_path / "s.npz", images=np.zeros((10, 8, 8), np.uint8), labels=labels)
    for read in (
        lambda: describe(f"npz:{tmp_path / 's.npz'}"),
        lambda: load_split(f"npz:{tmp_path / 's.npz'}", "train"),
    ):
        with pytest.raises(DataFormatError, match="29997 of the 30001 class ids 0..30000 have no image"):
            read()
    few = np.array([0, 1, 3, 0, 1, 3, 0, 1, 3, 0])  # one id without an image: a class that may be absent
    np.savez(tmp_path / "f.npz", images=np.zeros((10, 8, 8), np.uint8), labels=few)
    assert describe(f"npz:{tmp_path / 'f.npz'}").num_classes == 4


def test_images_of_no_pixels_are_a_data_error(tmp_path: Path) -> None:
    """(20, 0, 0) images in an .npz or an IDX file ended in a resize traceback, after the split was read."""
    from vitkit.data.readers import IDX_LABELS_MAGIC, read_idx_pair

    np.savez(tmp_path / "z.npz", images=np.zeros((20, 0, 0, 3), np.uint8), labels=np.arange(20) % 2)
    with pytest.raises(DataFormatError, match=r"`images` has shape \(20, 0, 0, 3\): images of no pixels"):
        read_npz(tmp_path / "z.npz")
    (tmp_path / "train-images-idx3-ubyte").write_bytes(struct.pack(">iiii", IDX_IMAGES_MAGIC, 20, 0, 0))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(struct.pack(">ii", IDX_LABELS_MAGIC, 20) + bytes(20))
    with pytest.raises(DataFormatError, match=r"images of shape \(0, 0\); expected \(H, W\) of 1 pixel or more"):
        read_idx_pair(tmp_path, "train", 10)


@pytest.mark.parametrize("layout", ["images", "x_train"])
def test_an_npz_label_past_any_class_count_is_a_data_error(tmp_path: Path, layout: str) -> None:
    """One label of 1,999,999 among 0-2 planned a model of 2,000,000 classes, refused as a model error."""
    from vitkit.data.sources import describe, load_split

    labels = np.arange(20) % 3
    labels[7] = 1_999_999
    path = tmp_path / "big.npz"
    images = np.zeros((20, 8, 8), np.uint8)
    if layout == "images":
        np.savez(path, images=images, labels=labels)
    else:
        np.savez(path, x_train=images, y_train=labels, x_test=images[:4], y_test=np.arange(4) % 3)
    key = "labels" if layout == "images" else "y_train"
    expected = rf"`{key}` holds label 1999999 \(at index 7\); class labels run 0\.\.1048575"
    with pytest.raises(DataFormatError, match=expected):
        describe(f"npz:{path}")
    with pytest.raises(DataFormatError, match=expected):
        load_split(f"npz:{path}", "train")


@pytest.mark.parametrize("layout", ["images", "x_train"])
def test_npz_labels_stored_as_python_objects_are_named(tmp_path: Path, layout: str) -> None:
    """Labels saved from a list of mixed values are an object array, which np.load refuses unpickled: the error
    said "Object arrays cannot be loaded when allow_pickle=False", naming neither the file nor the array."""
    from vitkit.data.sources import describe

    images = np.zeros((4, 8, 8), np.uint8)
    labels = np.array([0, "one", 2, 3], dtype=object)
    path = tmp_path / "d.npz"
    if layout == "images":
        np.savez(path, images=images, labels=labels)
    else:
        np.savez(path, x_train=images, y_train=labels, x_test=images, y_test=np.zeros(4, np.int64))
    key = "labels" if layout == "images" else "y_train"
    for read in (lambda: describe(f"npz:{path}"), lambda: read_npz(path)):
        with pytest.raises(DataFormatError, match=rf"d.npz: {key} holds Python objects.*integer class ids"):
            read()


def test_npz_members_not_used_are_not_inflated_and_those_used_must_fit(tmp_path: Path, monkeypatch) -> None:
    """A data .npz with a deflated 3 GB `junk` member beside images and labels took 3.2 GB: every member was read."""
    from vitkit.data import readers

    path = tmp_path / "d.npz"
    images, labels = np.zeros((6, 8, 8), np.uint8), np.arange(6) % 2
    np.savez_compressed(path, images=images, labels=labels, junk=np.zeros(5_000_000, np.float32))
    opened = []
    real = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda self, key: opened.append(key) or real(self, key))
    out = read_npz(path)
    assert sorted(opened) == ["images", "labels"] and out["labels"].tolist() == labels.tolist()
    monkeypatch.setattr(readers, "available_memory", lambda: 100)
    with pytest.raises(DataFormatError, match=r"d\.npz: images, labels inflate to \d+ bytes, more than the 100 bytes"):
        read_npz(path)


def test_an_idx_header_claiming_more_than_memory_holds_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    """A 13 MB gzip claiming 3.8 million 28x28 images passed the 16 GiB bound and took 6 GB before it ended."""
    from vitkit.data import readers

    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(struct.pack(">iiii", IDX_IMAGES_MAGIC, 3, 28, 28) + bytes(3 * 28 * 28))
    assert read_idx(path, IDX_IMAGES_MAGIC).shape == (3, 28, 28)
    monkeypatch.setattr(readers, "available_memory", lambda: 2_000)
    with pytest.raises(
        DataFormatError, match=r"claims dims \(3, 28, 28\), 2,352 bytes, more than the memory available"
    ):
        read_idx(path, IDX_IMAGES_MAGIC)


def test_npz_class_names_must_name_every_class_once(tmp_path: Path) -> None:
    """Two names for labels 0..9 planned a model of two classes, and training ended in a traceback; a 0-d
    array was a TypeError; repeated names were taken."""
    from vitkit.data.sources import load_split

    images, labels = np.zeros((20, 8, 8), np.uint8), np.arange(20) % 10
    cases = {
        "few": (np.array(["a", "b"]), r"2 class names for labels that reach 9; give a name for each class"),
        "flat": (np.array("abc"), r"class_names has shape \(\); expected one name for each class"),
        "twice": (np.array(["a"] * 10), r"the class name 'a' appears twice"),
    }
    for name, (class_names, words) in cases.items():
        np.savez(tmp_path / f"{name}.npz", images=images, labels=labels, class_names=class_names)
        with pytest.raises(ValueError, match=words):
            load_split(f"npz:{tmp_path / name}.npz", "train", image_size=8)
    np.savez(tmp_path / "ok.npz", images=images, labels=labels, class_names=np.array(list("abcdefghij")))
    assert load_split(f"npz:{tmp_path}/ok.npz", "train", image_size=8).class_names == list("abcdefghij")


def test_an_npy_header_that_does_not_parse_is_a_data_error(tmp_path: Path) -> None:
    """numpy's header parser raised tokenize.TokenError, a traceback past every except of the reader."""
    header = b"{'descr': (".ljust(53) + b"\n"
    path = tmp_path / "t.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("images.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", 54) + header)
        archive.writestr("labels.npy", b"")
    with pytest.raises(DataFormatError, match="cannot read .npz"):
        read_npz(path)
    from vitkit.data.readers import npz_shapes

    with pytest.raises(DataFormatError, match="not a readable .npz"):
        npz_shapes(path)


def test_a_file_that_is_no_zip_is_not_an_npz_and_no_pickle(tmp_path: Path) -> None:
    """np.load reads a file that is not a zip as a pickle: with pickles refused, the error advised
    `allow_pickle=True`, the one thing never to do with a file of unknown origin."""
    path = tmp_path / "notzip.npz"
    path.write_bytes(b"hello")
    with pytest.raises(DataFormatError, match="not an .npz archive") as caught:
        read_npz(path)
    assert "pickle" not in str(caught.value)
    with pytest.raises(DataFormatError, match="cannot read"):
        read_npz(tmp_path)  # a directory


@pytest.mark.parametrize("start", [b"junk", "npy"])
def test_a_zip_after_another_start_is_not_an_npz(tmp_path: Path, start) -> None:
    """zipfile finds a zip anywhere in a file, np.load looks at its start: an .npy with an .npz appended passed the
    check and ended in a TypeError traceback, a zip after junk in numpy's advice to allow pickles."""
    from vitkit.data.readers import npz_shapes
    from vitkit.data.sources import describe

    head = io.BytesIO()
    if start == "npy":
        np.save(head, np.zeros(3))
    else:
        head.write(start)
    archive = io.BytesIO()
    np.savez(archive, images=np.zeros((4, 8, 8), np.uint8), labels=np.arange(4) % 2)
    path = tmp_path / "hidden.npz"
    path.write_bytes(head.getvalue() + archive.getvalue())
    assert zipfile.is_zipfile(path)
    for read in (read_npz, npz_shapes, lambda p: describe(f"npz:{p}")):
        with pytest.raises(DataFormatError, match="hidden.npz: not an .npz archive"):
            read(path)


def test_describing_an_npz_checks_its_labels_headers_and_image_shape_as_reading_does(tmp_path: Path) -> None:
    """`vitkit train` describes a source before it reads it: a labels header claiming 10**11 entries was
    allocated there ("out of memory (... 745 GiB ...); lower --batch-size"), one claiming more than its member
    holds ended in "EOF: reading array data", and images of shape (10, -8, 8) were described as -8 px."""
    from vitkit.data.sources import describe

    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.zeros(10, np.int64))
    labels = buffer.getvalue().replace(b"'shape': (10,)", b"'shape': (10000000000,)", 1)
    path = tmp_path / "lying.npz"
    with zipfile.ZipFile(path, "w") as archive:
        images = io.BytesIO()
        np.lib.format.write_array(images, np.zeros((10, 8, 8), np.uint8))
        archive.writestr("images.npy", images.getvalue())
        archive.writestr("labels.npy", labels)
    with pytest.raises(DataFormatError, match=r"`labels.npy` claims shape \(10000000000,\) \(80,000,000,000 bytes\)"):
        describe(f"npz:{path}")
    with zipfile.ZipFile(tmp_path / "negative.npz", "w") as archive:
        archive.writestr("images.npy", images.getvalue().replace(b"(10, 8, 8)", b"(10, -8, 8)", 1))
        archive.writestr("labels.npy", buffer.getvalue())
    with pytest.raises(DataFormatError, match=r"`images` has shape \(10, -8, 8\); expected images as"):
        describe(f"npz:{tmp_path / 'negative.npz'}")
    np.savez(tmp_path / "unlabelled.npz", x_train=np.zeros((10, 8, 8), np.uint8), y_train=np.zeros(10, np.int64))
    with pytest.raises(DataFormatError, match=r"holds \['x_train', 'y_train'\]; expected x_train, y_train, x_test"):
        describe(f"npz:{tmp_path / 'unlabelled.npz'}")  # a KeyError traceback


def test_a_cifar_file_larger_than_memory_is_refused_unread_and_its_names_file_is_bounded(tmp_path, monkeypatch) -> None:
    """A CIFAR binary was read whole (a 77 GB sparse file: "out of memory ... lower --batch-size"), and a names
    file that was not UTF-8 ended in a UnicodeDecodeError naming no file."""
    from vitkit.data import readers
    from vitkit.data.sources import describe, load_split

    root = tmp_path / "cifar-100-binary"
    root.mkdir()
    (root / "train.bin").write_bytes(bytes(3074 * 4))
    (root / "test.bin").write_bytes(bytes(3074 * 2))
    monkeypatch.setattr(readers, "available_memory", lambda: 3074 * 3)
    for call in (lambda: describe(f"cifar100:{root}"), lambda: load_split(f"cifar100:{root}", "train")):
        with pytest.raises(DataFormatError, match=r"train\.bin: 12,296 bytes, more than the memory available \(9,222"):
            call()
    monkeypatch.setattr(readers, "available_memory", lambda: 1 << 40)
    (root / "fine_label_names.txt").write_bytes(b"apple\n\xff\xfe\n")
    with pytest.raises(DataFormatError, match=r"fine_label_names\.txt: not UTF-8 text"):
        load_split(f"cifar100:{root}", "train")
    with open(root / "fine_label_names.txt", "wb") as file:
        file.truncate(readers.MAX_NAMES_FILE_BYTES + 1)
    with pytest.raises(DataFormatError, match=r"fine_label_names\.txt: [\d,]+ bytes, more than a names file"):
        load_split(f"cifar100:{root}", "train")


def test_a_folder_of_images_or_shards_under_a_built_in_scheme_names_the_scheme_that_reads_it(tmp_path: Path) -> None:
    """`cifar10:` on a folder of JPEGs said only "data_batch_1.bin: missing", though a typo'd scheme gets a hint."""
    from PIL import Image

    from vitkit.data.sources import describe

    photos = tmp_path / "photos"
    (photos / "train" / "cat").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(photos / "train" / "cat" / "a.jpg")
    for uri in (f"cifar10:{photos}", f"mnist:{photos}"):
        with pytest.raises(DataFormatError, match=f"; it holds image files: read them with folder:{photos}$"):
            describe(uri)
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "train-000000.tar").write_bytes(b"")
    with pytest.raises(DataFormatError, match=f"; it holds .tar shards: read them with wds:{shards}$"):
        describe(f"fashion-mnist:{shards}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match="train-images-idx3-ubyte exists$"):
        describe(f"mnist:{tmp_path / 'empty'}")
