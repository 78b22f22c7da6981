"""Array sources: digits, IDX (MNIST-style), CIFAR binary, npz; URIs, splits and describe()."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit.data import arrays, sources
from vitkit.data.readers import DataFormatError
from vitkit.data.sources import describe, load_split, parse_uri, stratified_split

DIGITS_PER_CLASS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]  # sklearn's digits, 1,797 in all


# ------------------------------------------------------------------------------------ helpers
def write_idx(path: Path, array: np.ndarray, magic: int, compress: bool = True, cut: int = 0) -> Path:
    data = struct.pack(f">i{array.ndim}i", magic, *array.shape) + array.astype(np.uint8).tobytes()
    data = data[: len(data) - cut]
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def make_idx_dir(root: Path, n_train: int = 30, n_test: int = 10, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8)
    labels = np.arange(n_train, dtype=np.uint8) % 10
    write_idx(root / "train-images-idx3-ubyte", images, 2051, **kwargs)
    write_idx(root / "train-labels-idx1-ubyte", labels, 2049, **kwargs)
    write_idx(root / "t10k-images-idx3-ubyte", images[:n_test], 2051, **kwargs)
    write_idx(root / "t10k-labels-idx1-ubyte", labels[:n_test], 2049, **kwargs)
    return images, labels


# ------------------------------------------------------------------------------------- digits
def test_digits_counts_scaling_and_fixed_split():
    train, test = load_split("digits", "train"), load_split("digits", "test")
    assert len(train) + len(test) == 1797
    assert (torch.bincount(train.labels) + torch.bincount(test.labels)).tolist() == DIGITS_PER_CLASS
    # 20 % of each class, rounded, is the fixed test split.
    assert torch.bincount(test.labels).tolist() == [round(0.2 * n) for n in DIGITS_PER_CLASS]
    assert len(test) == 359 and len(train) == 1438
    assert train.images.shape == (1438, 1, 8, 8) and train.images.dtype == torch.uint8
    assert int(train.images.max()) == 255 and int(train.images.min()) == 0
    assert train.class_names == [str(d) for d in range(10)]


def test_digits_pixels_golden():
    # The first row of sklearn's digits.csv.gz: a "0" whose top rows are 0 0 5 13 9 1 0 0 / 0 0 13 15 10 15 5 0
    # (0..16); scaled by 255 / 16 and rounded.  (Not via sklearn.load_digits: importing it takes seconds.)
    whole = arrays.digits()
    assert len(whole) == 1797 and int(whole.labels[0]) == 0
    assert whole.images[0, 0, 0].tolist() == [0, 0, 80, 207, 143, 16, 0, 0]
    assert whole.images[0, 0, 1].tolist() == [0, 0, 207, 239, 159, 239, 80, 0]
    assert torch.bincount(whole.labels).tolist() == DIGITS_PER_CLASS


def test_digits_deterministic_and_val_split_disjoint():
    a = load_split("digits", "train", val_fraction=0.1, seed=3)
    b = load_split("digits", "train", val_fraction=0.1, seed=3)
    val = load_split("digits", "val", val_fraction=0.1, seed=3)
    other = load_split("digits", "val", val_fraction=0.1, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert len(a) + len(val) == 1438
    assert not torch.equal(val.images, other.images)  # the seed matters
    # No val image is also a train image (rows compared as bytes; digits has a few exact duplicates, so
    # compare positions instead through the split indices).
    keep, held = stratified_split(load_split("digits", "train").labels, 0.1, 3)
    assert set(keep.tolist()).isdisjoint(held.tolist())
    assert len(keep) + len(held) == 1438


def test_stratified_split_per_class_fraction():
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 3 + [3])
    keep, held = stratified_split(labels, 0.2, seed=0)
    assert torch.bincount(labels[held], minlength=4).tolist() == [10, 6, 1, 0]  # round(0.6) = 1; a lone sample stays
    assert sorted(keep.tolist() + held.tolist()) == list(range(len(labels)))
    assert torch.equal(held, stratified_split(labels, 0.2, seed=0)[1])
    with pytest.raises(ValueError, match="val_fraction"):
        stratified_split(labels, 1.0, seed=0)


def test_parse_uri():
    assert parse_uri("fashion-mnist:/x") == ("fashion-mnist", "/x")
    assert parse_uri("folder:~/photos") == ("folder", str(Path.home() / "photos"))  # "~/photos: does not exist"
    assert parse_uri("digits") == ("digits", "")
    assert parse_uri("folder:C:/data") == ("folder", "C:/data")
    with pytest.raises(ValueError, match="unknown data source"):
        parse_uri("imagenet:/x")
    with pytest.raises(ValueError, match="needs a path"):
        parse_uri("mnist")


def test_split_errors_are_clear():
    with pytest.raises(ValueError, match="split must be"):
        load_split("digits", "validation")
    with pytest.raises(ValueError, match="no separate val split"):
        load_split("npz:/nonexistent.npz", "val")
    with pytest.raises(ValueError, match="no separate val split"):  # it was the training images, called "val"
        load_split("digits", "val")
    assert len(load_split("digits", "val", val_fraction=0.1)) == 143  # 10% of the 1,438 training images, as asked


# ---------------------------------------------------------------------------------------- IDX
@pytest.mark.parametrize("compress", [True, False])
def test_idx_synthetic_round_trip(tmp_path, compress):
    images, labels = make_idx_dir(tmp_path, compress=compress)
    train = load_split(f"mnist:{tmp_path}", "train")
    test = load_split(f"fashion-mnist:{tmp_path}", "test")
    assert torch.equal(train.images[:, 0], torch.from_numpy(images))
    assert torch.equal(train.labels, torch.from_numpy(labels).long())
    assert test.images.shape == (10, 1, 28, 28) and test.class_names[9] == "Ankle boot"
    info = describe(f"mnist:{tmp_path}")
    assert (info.num_train, info.num_classes, info.image_size, info.channels) == (30, 10, 28, 1)


def test_idx_wrong_magic_names_the_file(tmp_path):
    make_idx_dir(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(30, np.uint8), 2051 + 7)
    with pytest.raises(DataFormatError, match=r"train-labels-idx1-ubyte\.gz.*magic number is 2058"):
        load_split(f"mnist:{tmp_path}", "train")


def test_idx_labels_swapped_for_images_is_refused(tmp_path):
    make_idx_dir(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros(30, np.uint8), 2049)
    with pytest.raises(DataFormatError, match="expected 2051 for images"):
        load_split(f"mnist:{tmp_path}", "train")


def test_idx_truncated_data_names_the_file(tmp_path):
    make_idx_dir(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((30, 28, 28), np.uint8), 2051, cut=100)
    with pytest.raises(DataFormatError, match=r"train-images-idx3-ubyte\.gz.*truncated"):
        load_split(f"mnist:{tmp_path}", "train")


def test_idx_truncated_gzip_stream_names_the_file(tmp_path):
    make_idx_dir(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(DataFormatError, match=r"t10k-images-idx3-ubyte\.gz.*truncated or corrupt"):
        load_split(f"mnist:{tmp_path}", "test")


def test_idx_missing_file(tmp_path):
    with pytest.raises(DataFormatError, match="train-images-idx3-ubyte"):
        load_split(f"mnist:{tmp_path}", "train")


def test_fashion_mnist_real_files(shared_data):
    uri = f"fashion-mnist:{shared_data / 'fashion-mnist'}"
    train, test = load_split(uri, "train"), load_split(uri, "test")
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    pixels = train.images.numpy()
    assert abs(pixels.sum(dtype=np.uint64) / pixels.size - 72.94) < 0.01  # README's mean pixel value
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.image_size, info.channels, info.in_memory) == (
        60000,
        10,
        28,
        1,
        True,
    )


def test_mnist_real_files(shared_data):
    uri = f"mnist:{shared_data / 'mnist'}"
    test = load_split(uri, "test")
    assert torch.bincount(test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert describe(uri).num_train == 60000


# -------------------------------------------------------------------------------------- CIFAR
def write_cifar(path: Path, images: np.ndarray, labels: list[np.ndarray]) -> None:
    rows = np.concatenate([np.stack(labels, 1).astype(np.uint8), images.reshape(len(images), -1)], axis=1)
    path.write_bytes(rows.tobytes())


def test_cifar10_binary_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "cifar-10-batches-bin"
    root.mkdir()
    batches = []
    for i in range(1, 6):
        images, labels = rng.integers(0, 256, (4, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 4)
        write_cifar(root / f"data_batch_{i}.bin", images, [labels])
        batches.append((images, labels))
    write_cifar(root / "test_batch.bin", batches[0][0], [batches[0][1]])
    train = load_split(f"cifar10:{tmp_path}", "train")  # the parent folder is accepted too
    assert torch.equal(train.images, torch.from_numpy(np.concatenate([b[0] for b in batches])))
    assert torch.equal(train.labels, torch.from_numpy(np.concatenate([b[1] for b in batches])).long())
    assert train.class_names[0] == "airplane" and len(load_split(f"cifar10:{root}", "test")) == 4
    assert describe(f"cifar10:{root}").num_train == 20


def test_cifar100_fine_labels_and_names(tmp_path):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (6, 3, 32, 32), dtype=np.uint8)
    coarse, fine = np.array([0, 1, 2, 3, 4, 19]), np.array([5, 99, 0, 7, 8, 9])
    write_cifar(tmp_path / "train.bin", images, [coarse, fine])
    write_cifar(tmp_path / "test.bin", images[:2], [coarse[:2], fine[:2]])
    (tmp_path / "fine_label_names.txt").write_text("\n".join(f"name{i}" for i in range(100)) + "\n")
    train = load_split(f"cifar100:{tmp_path}", "train")
    assert train.labels.tolist() == fine.tolist() and train.num_classes == 100
    assert torch.equal(train.images, torch.from_numpy(images)) and train.class_names[99] == "name99"
    assert describe(f"cifar100:{tmp_path}").num_train == 6


def test_cifar_truncated_file_is_named(tmp_path):
    (tmp_path / "train.bin").write_bytes(bytes(2 + 3072 + 5))
    with pytest.raises(DataFormatError, match=r"train\.bin.*not a whole number of 3074-byte records"):
        load_split(f"cifar100:{tmp_path}", "train")


# ---------------------------------------------------------------------------------------- npz
def test_npz_train_test_nhwc_and_nchw(tmp_path):
    rng = np.random.default_rng(3)
    nhwc = rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8)
    np.savez(
        tmp_path / "a.npz",
        x_train=nhwc,
        y_train=np.arange(12) % 4,
        x_test=nhwc[:4].transpose(0, 3, 1, 2),
        y_test=np.arange(4),
    )
    train = load_split(f"npz:{tmp_path / 'a.npz'}", "train")
    test = load_split(f"npz:{tmp_path / 'a.npz'}", "test")
    assert torch.equal(train.images, torch.from_numpy(nhwc.transpose(0, 3, 1, 2).copy()))
    assert torch.equal(test.images, train.images[:4]) and train.num_classes == 4
    info = describe(f"npz:{tmp_path / 'a.npz'}")
    assert (info.num_train, info.num_classes, info.image_size, info.channels) == (12, 4, 16, 3)


def test_npz_images_labels_gets_fixed_test_split(tmp_path):
    images = np.zeros((50, 8, 8), np.uint8)
    images[:, 0, 0] = np.arange(50)  # a fingerprint per sample
    np.savez_compressed(tmp_path / "b.npz", images=images, labels=np.arange(50) % 5)
    train = load_split(f"npz:{tmp_path / 'b.npz'}", "train")
    test = load_split(f"npz:{tmp_path / 'b.npz'}", "test")
    assert (len(train), len(test)) == (40, 10) and torch.bincount(test.labels).tolist() == [2] * 5
    assert set(train.images[:, 0, 0, 0].tolist()).isdisjoint(test.images[:, 0, 0, 0].tolist())
    assert describe(f"npz:{tmp_path / 'b.npz'}").num_train == 40


def test_npz_refuses_pickles_and_bad_dtypes(tmp_path):
    np.savez(tmp_path / "obj.npz", images=np.array([{"a": 1}], dtype=object), labels=np.zeros(1, int))
    with pytest.raises(DataFormatError, match="obj.npz"):
        load_split(f"npz:{tmp_path / 'obj.npz'}", "train")
    np.savez(tmp_path / "f.npz", images=np.zeros((2, 4, 4), np.float32), labels=np.zeros(2, int))
    with pytest.raises(DataFormatError, match="must be uint8"):
        load_split(f"npz:{tmp_path / 'f.npz'}", "train")
    np.savez(tmp_path / "k.npz", pixels=np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DataFormatError, match="expected x_train"):
        load_split(f"npz:{tmp_path / 'k.npz'}", "train")


def test_imageset_subset_and_describe_digits():
    train = load_split("digits", "train")
    part = train.subset(torch.tensor([5, 0, 7]))
    assert torch.equal(part.images, train.images[[5, 0, 7]]) and torch.equal(part.read(1), train.images[0])
    assert describe("digits") == sources.SourceInfo(
        uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True
    )


def test_a_file_given_as_a_data_directory_is_called_a_file(tmp_path: Path) -> None:
    """folder:notes.txt said "data directory does not exist"."""
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="notes.txt: is a file; give the directory that holds the data"):
        describe(f"folder:{tmp_path / 'notes.txt'}")


def test_a_class_left_without_test_images_is_named(tmp_path, caplog):
    """A class of one image keeps it for training: the fixed hold-out has none, and `eval` showed its accuracy
    as "-" with no word before."""
    import logging

    labels = np.array([0] * 10 + [1] * 10 + [2])  # class 2: one image
    np.savez(tmp_path / "c.npz", images=np.zeros((21, 8, 8), np.uint8), labels=labels)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        test = load_split(f"npz:{tmp_path / 'c.npz'}", "test")
    assert torch.bincount(test.labels, minlength=3).tolist() == [2, 2, 0]
    assert "1 class has no test image (2): its accuracy is not measured" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        load_split(f"npz:{tmp_path / 'c.npz'}", "train")
    assert "no test image" not in caplog.text


def test_a_class_without_training_images_is_named(tmp_path, caplog):
    """Test labels beyond train's (or a classes.txt naming classes no sample holds) widened the head by classes
    the model cannot learn, said only as "no test image" for others."""
    import logging

    x = np.zeros((6, 8, 8), np.uint8)
    np.savez(tmp_path / "c.npz", x_train=x, y_train=np.array([0, 0, 1, 1, 2, 2]), x_test=x, y_test=np.arange(6) % 4)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        train = load_split(f"npz:{tmp_path / 'c.npz'}", "train")
    assert train.num_classes == 4
    assert "1 class has no training image (3): the model cannot learn it" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        load_split(f"npz:{tmp_path / 'c.npz'}", "train", val_fraction=0.5, seed=0)  # a hold-out: no verdict
    assert "no training image" not in caplog.text


def test_a_bare_path_or_a_near_miss_scheme_is_named_with_the_uri_meant(tmp_path) -> None:
    """`--data DIR` (a folder of class folders, no scheme) and `fashion_mnist:` or `Folder:` listed every
    scheme and left the newcomer to find the one meant."""
    (tmp_path / "photos").mkdir()
    with pytest.raises(ValueError, match=f"did you mean folder:{tmp_path / 'photos'}"):
        parse_uri(str(tmp_path / "photos"))
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "train-000000.tar").write_bytes(b"")
    with pytest.raises(ValueError, match=f"did you mean wds:{tmp_path / 'shards'}"):
        parse_uri(str(tmp_path / "shards"))
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text("{}")
    with pytest.raises(ValueError, match=f"did you mean hf:{tmp_path / 'saved'}"):
        parse_uri(str(tmp_path / "saved"))
    for name, kind in (("fashion", "fashion-mnist"), ("digits-idx", "mnist")):  # IDX files: not a folder of classes
        (tmp_path / name).mkdir()
        (tmp_path / name / "train-images-idx3-ubyte.gz").write_bytes(b"")
        with pytest.raises(ValueError, match=f"did you mean {kind}:{tmp_path / name}"):
            parse_uri(str(tmp_path / name))
    (tmp_path / "cifar").mkdir()
    (tmp_path / "cifar" / "data_batch_1.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=f"did you mean cifar10:{tmp_path / 'cifar'}"):
        parse_uri(str(tmp_path / "cifar"))
    with pytest.raises(ValueError, match=r"did you mean fashion-mnist:/x\?"):
        parse_uri("fashion_mnist:/x")
    with pytest.raises(ValueError, match=r"did you mean folder:/x\?"):
        parse_uri("Folder:/x")
    with pytest.raises(ValueError) as refused:
        parse_uri("nosuch:x")
    assert "did you mean" not in str(refused.value)


def test_wds_on_a_folder_of_images_names_folder(tmp_path) -> None:
    """`wds:` on class folders of JPEGs said only "no train-* shards"."""
    import numpy as np
    from PIL import Image

    for name in ("cat", "dog"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "photos" / name / "a.JPG")
    with pytest.raises(ValueError, match=f"read it with folder:{tmp_path / 'photos'}"):
        load_split(f"wds:{tmp_path / 'photos'}", "train", image_size=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError) as refused:
        load_split(f"wds:{tmp_path / 'empty'}", "train", image_size=8)
    assert "folder:" not in str(refused.value)
    (tmp_path / "split").mkdir()  # train/<class>/ and val/<class>/ say so too
    (tmp_path / "photos").rename(tmp_path / "split" / "train")
    with pytest.raises(ValueError, match=f"read it with folder:{tmp_path / 'split'}"):
        load_split(f"wds:{tmp_path / 'split'}", "train", image_size=8)


def test_folder_on_tar_shards_names_wds_and_is_not_read_as_images_without_labels(tmp_path) -> None:
    """`folder:` on a directory of shards pointed at pretrain-mpp, which then found no image files in it."""
    import numpy as np
    from PIL import Image

    from vitkit.data.images import NoLabelsError

    (tmp_path / "train-000000.tar").write_bytes(b"\0" * 1024)
    for labelled in (True, False):
        with pytest.raises(ValueError, match=f"it holds .tar shards: read them with wds:{tmp_path}") as refused:
            load_split(f"folder:{tmp_path}", "train", image_size=8, labelled=labelled)
        assert not isinstance(refused.value, NoLabelsError)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")  # photos beside a stray backup .tar
    with pytest.raises(NoLabelsError, match="vitkit pretrain-mpp reads a folder of images without labels"):
        load_split(f"folder:{tmp_path}", "train", image_size=8)


def test_a_set_read_from_files_on_purpose_is_not_said_to_exceed_a_limit_of_0_mb(tmp_path, caplog) -> None:
    """`vitkit shard` reads its source from files (max_in_memory_bytes=0) and logged "more than
    data.max_in_memory_mb (0 MB) holds", as if the user had set that."""
    import logging

    from vitkit.data.imageset import ImageSet
    from vitkit.data.inmemory import materialise

    files = ImageSet(images=None, files=[tmp_path / "a.png"], labels=torch.zeros(1, dtype=torch.long),
                     class_names=["a"], load_size=8)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="vitkit"):
        kept, problems = materialise(files, strict=False, max_in_memory_bytes=0, num_workers=1)
    assert kept is files and problems == [] and "max_in_memory_mb" not in caplog.text


def test_a_fixed_sample_is_the_same_draw_every_time_in_the_splits_order() -> None:
    from vitkit.data.imageset import ImageSet

    images = torch.arange(50, dtype=torch.uint8).view(50, 1, 1, 1).expand(50, 3, 2, 2).contiguous()
    whole = ImageSet(images=images, labels=torch.arange(50) % 5, class_names=list("abcde"))
    drawn = whole.fixed_sample(12)
    rows = drawn.images[:, 0, 0, 0].tolist()
    assert rows == sorted(rows) and len(set(rows)) == 12 and drawn.labels.tolist() == [r % 5 for r in rows]
    expected = torch.randperm(50, generator=torch.Generator().manual_seed(0))[:12].sort().values.tolist()
    assert rows == expected and whole.fixed_sample(12).images.equal(drawn.images)
    assert whole.fixed_sample(12, seed=1).images[:, 0, 0, 0].tolist() != rows and whole.fixed_sample(50) is whole
