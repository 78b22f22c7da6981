"""The one evaluator: top-1 / top-k, confusion matrix and per-class accuracy against hand computations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vitkit.checkpoints import Checkpoint
from vitkit.data.sources import ImageSet
from vitkit.eval.accuracy import AccuracyConfig
from vitkit.eval.accuracy import evaluate as evaluate_checkpoint
from vitkit.eval.evaluator import evaluate, one_view_note
from vitkit.models.configs import ViTConfig


class Lookup(nn.Module):
    """Returns fixed logits per image: image i is a 1x2x2 tile of pixel value i (decoded from the input)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits
        self.config = ViTConfig(img_size=2, patch_size=1, in_chans=1, num_classes=logits.shape[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = torch.round((x[:, 0, 0, 0] + 1) * 127.5).long()  # undo x / 127.5 - 1
        return self.logits[index]


def _data(logits: torch.Tensor, labels: torch.Tensor) -> ImageSet:
    images = torch.arange(len(labels), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    return ImageSet(images=images, labels=labels, class_names=[str(k) for k in range(logits.shape[1])])


def _counts(logits: torch.Tensor, labels: torch.Tensor, top_k: int = 5, batch_size: int = 3):
    return evaluate(
        Lookup(logits),
        _data(logits, labels),
        size=2,
        mean=(0.5,),
        std=(0.5,),
        channels=1,
        batch_size=batch_size,
        top_k=top_k,
    )


def test_topk_against_hand_computation() -> None:
    logits = torch.tensor(
        [
            [0.9, 0.05, 0.03, 0.01, 0.005, 0.005],  # label 0: top-1 hit
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # label 1: rank 5 -> top-5 hit, top-1 miss
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # label 0: rank 6 -> miss both
            [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],  # label 2: hit
        ]
    )
    labels = torch.tensor([0, 1, 0, 2])
    assert _counts(logits, labels).top1 == 0.5
    assert _counts(logits, labels).topk == 0.75
    assert _counts(logits, labels, top_k=10).topk == 1.0 and _counts(logits, labels, top_k=10).k == 6  # capped at K
    assert _counts(logits, labels, batch_size=1).topk == _counts(logits, labels, batch_size=4).topk  # batch-independent


def test_confusion_matrix_counts_and_sums() -> None:
    predictions = torch.tensor([0, 1, 1, 2, 2, 2, 0])
    labels = torch.tensor([0, 1, 2, 2, 2, 0, 0])
    matrix = _counts(torch.eye(3)[predictions], labels).confusion
    assert matrix.tolist() == [[2, 0, 1], [0, 1, 0], [0, 1, 2]]
    assert int(matrix.sum()) == 7
    assert matrix.sum(1).tolist() == torch.bincount(labels).tolist()


def test_checkpoint_accuracy_per_class() -> None:
    logits = torch.eye(3)[torch.tensor([0, 1, 1, 2, 2, 2, 0])]
    labels = torch.tensor([0, 1, 2, 2, 2, 0, 0])
    checkpoint = Checkpoint(model=Lookup(logits), class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,))
    data = _data(logits, labels)
    data.class_names = ["a", "b", "c"]
    result = evaluate_checkpoint(checkpoint, data, AccuracyConfig(img_size=2, device="cpu", batch_size=2))
    assert result.k == 3 and result.topk == 1.0
    assert abs(result.top1 - 5 / 7) < 1e-12
    assert result.per_class == [2 / 3, 1.0, 2 / 3]
    assert sum(map(sum, result.confusion)) == 7
    assert result.to_dict()["per_class"]["b"] == 1.0


def test_above_the_confusion_limit_the_figures_come_from_per_class_counts(monkeypatch) -> None:
    """21,843 classes had asked for a K x K float64 matrix a batch and another to keep (3.8 GB each), and written
    K x K numbers into eval JSON; above the limit the accuracies are the same and no matrix is kept."""
    from vitkit.eval import evaluator

    logits = torch.eye(3)[torch.tensor([0, 1, 1, 2, 2, 2, 0])]
    labels = torch.tensor([0, 1, 2, 2, 2, 0, 0])
    checkpoint = Checkpoint(model=Lookup(logits), class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,))
    config = AccuracyConfig(img_size=2, device="cpu", batch_size=2)
    dense = evaluate_checkpoint(checkpoint, _data(logits, labels), config)
    monkeypatch.setattr(evaluator, "CONFUSION_MAX_CLASSES", 2)
    sparse = evaluate_checkpoint(checkpoint, _data(logits, labels), config)
    assert sparse.confusion is None and dense.confusion == [[2, 0, 1], [0, 1, 0], [0, 1, 2]]
    assert (sparse.top1, sparse.topk, sparse.per_class) == (dense.top1, dense.topk, dense.per_class)
    assert sparse.per_class == [2 / 3, 1.0, 2 / 3] and sparse.to_dict()["confusion"] is None


def test_classes_named_alike_in_another_order_are_matched_by_name() -> None:
    """A folder sorts its class names (one, two, zero; 0, 1, 10, 2, ...), and a model trained on shards with a
    classes.txt or on npz keeps another order: matched by index, the names disagreed and a perfect model scored
    0%.  Classes are matched by name where the data's names are the model's, in any order, or some of them."""
    predictions = torch.tensor([0, 1, 2, 2, 0])  # the model's classes: zero, one, two; every prediction right
    logits = torch.eye(3)[predictions]
    checkpoint = Checkpoint(model=Lookup(logits), class_names=["zero", "one", "two"], mean=(0.5,), std=(0.5,))
    config = AccuracyConfig(img_size=2, device="cpu", batch_size=2)
    data = _data(logits, torch.tensor([2, 0, 1, 1, 2]))  # the same images, labelled in the folder's order
    data.class_names = ["one", "two", "zero"]
    result = evaluate_checkpoint(checkpoint, data, config)
    assert result.top1 == 1.0 and result.class_names == ["zero", "one", "two"]
    assert result.per_class == [1.0, 1.0, 1.0] and result.confusion == [[2, 0, 0], [0, 1, 0], [0, 0, 2]]
    checkpoint.model = Lookup(torch.eye(3)[torch.tensor([1, 2, 2])])  # predicts one, two, two
    some = _data(logits, torch.tensor([0, 1, 1]))  # a folder of two of the model's classes
    some.class_names = ["one", "two"]
    result = evaluate_checkpoint(checkpoint, some, config)
    assert result.top1 == 1.0 and result.num_images == 3 and result.per_class == [None, 1.0, 1.0]
    renamed = _data(logits, torch.tensor([2, 0, 1, 1, 2]))  # one folder renamed: matched by index, 53% read 19%
    renamed.class_names = ["one", "two", "zebra"]
    with pytest.raises(ValueError, match=r"2 of the data set's 3 classes are the checkpoint's, but 'zebra' is not"):
        evaluate_checkpoint(checkpoint, renamed, config)
    renamed.class_names = ["a", "b", "c"]  # no name shared: matched by index, as before
    checkpoint.model = Lookup(logits)
    assert evaluate_checkpoint(checkpoint, renamed, config).num_images == 5


def test_flip_views_average_the_logits_of_an_image_and_its_mirror() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))  # sees left and right apart
    images = torch.randint(0, 256, (37, 3, 4, 4), dtype=torch.uint8)
    labels = torch.randint(0, 5, (37,))
    data = ImageSet(images=images, labels=labels, class_names=[str(k) for k in range(5)])
    run = dict(size=4, mean=(0.5,) * 3, std=(0.5,) * 3, channels=3, batch_size=8)
    with torch.no_grad():
        x = images.float() / 127.5 - 1
        plain, both = model(x), (model(x) + model(x.flip(-1))) / 2
    flipped, one = evaluate(model, data, flip_views=True, **run), evaluate(model, data, **run)
    assert flipped.top1 == int((both.argmax(1) == labels).sum()) / 37
    assert flipped.one_view_top1 == one.top1 == int((plain.argmax(1) == labels).sum()) / 37
    assert flipped.top1 != one.top1  # the two views disagree somewhere on these random images
    assert abs(flipped.loss - torch.nn.functional.cross_entropy(both, labels).item()) < 1e-5
    assert one.one_view_top1 is None and "top1_one_view" not in one.summary()
    assert flipped.summary()["top1_one_view"] == one.top1
    assert one_view_note({"top1_one_view": 0.7891}) == " (image + mirror; one view 78.91%)"
    assert one_view_note(one.summary()) == ""


def test_a_model_whose_class_names_repeat_is_matched_by_index() -> None:
    """ImageNet-1k names two classes "crane": a folder "crane" matched the last of them."""
    from vitkit.eval.accuracy import by_name

    assert by_name(["tench", "crane", "goldfish", "crane"], ["crane", "tench"]) is None
    assert by_name(["tench", "crane", "goldfish"], ["crane", "tench"]).tolist() == [1, 0]


def test_the_confusion_figure_draws_any_folder_name(tmp_path) -> None:
    """`$5_$` was parsed as mathtext and a non-UTF-8 folder name (its bytes as surrogates) raised: `vitkit eval`
    failed after writing its figures' JSON, its accuracy unprinted."""
    from vitkit.eval.plots import plain, plot_confusion

    odd = b"\xff\xfe".decode("utf-8", "surrogateescape")
    path = plot_confusion([[2, 0, 0], [1, 1, 0], [0, 0, 3]], ["a", "$5_$", odd], tmp_path / "confusion.png")
    assert path.stat().st_size > 2000 and plain(odd) == "\\xff\\xfe" and plain("$5_$") == "$5_$"
    assert plain("x\ud800") == "x\\ud800"  # a lone surrogate from a JSON escape (an hf or dataset.json name)
    assert plain("café_ñ 時計") == "café_ñ \\u6642\\u8a08"  # no glyph in the figures' font: a warning each, a box
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Glyph 26178 missing from font(s) DejaVu Sans", twice a name
        plot_confusion([[1, 0], [0, 1]], ["時計", "b"], tmp_path / "cjk.png")


def test_tied_logits_rank_the_lower_class_first_in_every_figure() -> None:
    """torch.topk orders tied values arbitrarily (on the CPU, six equal logits came back as 3, 5, 4, 0, 2), while
    argmax takes the first: a zero-initialised head, which every fine-tune starts from, was scored for class 3
    in top-1 and confusion, and the one-view top-1 beside it for class 0.  Ties go to the lower class index."""
    from vitkit.eval.evaluator import ranked
    from vitkit.eval.predict import top_classes

    logits = torch.zeros(6, 6)
    logits[3:, :2] = 1.0  # images 3-5: classes 0 and 1 tied above the rest
    labels = torch.tensor([0, 3, 5, 0, 1, 2])
    counts = _counts(logits, labels, top_k=5, batch_size=6)
    assert counts.top1 == 2 / 6  # images 0 and 3: class 0 is first of a tie
    assert counts.topk == 5 / 6  # top-5 is classes 0-4 for every image: only label 5 misses
    assert counts.confusion[:, 0].sum() == 6 and counts.confusion.sum() == 6
    assert ranked(torch.zeros(2, 6), 5).tolist() == [[0, 1, 2, 3, 4]] * 2
    assert ranked(torch.tensor([[0.0, 2.0, 1.0, 2.0]]), 4).tolist() == [[1, 3, 2, 0]]
    assert [c["index"] for c in top_classes(torch.full((6,), 1 / 6), None, 3)] == [0, 1, 2]


def test_ranked_equals_a_whole_stable_sort_on_rows_full_of_ties() -> None:
    """The top-k candidates are ordered, and only rows with a tie across the k-th place sorted whole: the result
    is the whole stable sort's, on scores drawn from a few values (ties everywhere) and on distinct ones."""
    from vitkit.eval.evaluator import ranked

    generator = torch.Generator().manual_seed(0)
    for scores in (
        torch.randint(0, 4, (200, 30), generator=generator).float(),
        torch.randn(50, 1000, generator=generator),
    ):
        whole = scores.sort(dim=-1, descending=True, stable=True).indices
        for k in (1, 5, 30):
            assert torch.equal(ranked(scores, k), whole[:, :k]), k
