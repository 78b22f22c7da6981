"""Closed-form few-shot ridge (Sec. 4.1): independent solutions, separable features, lambda selection."""

from __future__ import annotations

import pytest
import torch

from vitkit.eval.fewshot import FewShotConfig, evaluate_fewshot, fewshot_accuracy, select_l2
from vitkit.eval.ridge import pm1_targets, ridge_path


def _augmented_lstsq(x: torch.Tensor, y: torch.Tensor, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent solution: ridge as ordinary least squares on [X 1; sqrt(l2) I 0] (bias unpenalised)."""
    n, d = x.shape
    design = torch.cat(
        [
            torch.cat([x, torch.ones(n, 1, dtype=x.dtype)], 1),
            torch.cat([l2**0.5 * torch.eye(d, dtype=x.dtype), torch.zeros(d, 1, dtype=x.dtype)], 1),
        ]
    )
    target = torch.cat([y, torch.zeros(d, y.shape[1], dtype=y.dtype)])
    solution = torch.linalg.lstsq(design, target, driver="gelsd").solution
    return solution[:d], solution[d]


@pytest.mark.parametrize("n, d", [(40, 8), (12, 30)])  # over- and under-determined (the few-shot case)
def test_ridge_equals_lstsq_and_normal_equations(n: int, d: int) -> None:
    x = torch.randn(n, d, dtype=torch.float64) * 3 + 1
    labels = torch.arange(n) % 4
    y = pm1_targets(labels, 4)
    for l2 in (2.0**-6, 1.0, 2.0**5):
        weight, bias = ridge_path(x, y).weights(l2)
        ref_w, ref_b = _augmented_lstsq(x, y, l2)
        torch.testing.assert_close(weight, ref_w, atol=1e-5, rtol=0)
        torch.testing.assert_close(bias, ref_b, atol=1e-5, rtol=0)
        xc, yc = x - x.mean(0), y - y.mean(0)  # normal equations (Xc^T Xc + l2 I) W = Xc^T Yc
        normal = torch.linalg.solve(xc.T @ xc + l2 * torch.eye(d, dtype=x.dtype), xc.T @ yc)
        torch.testing.assert_close(weight, normal, atol=1e-5, rtol=0)


def test_pm1_targets() -> None:
    assert pm1_targets(torch.tensor([2, 0]), 3).tolist() == [[-1.0, -1.0, 1.0], [1.0, -1.0, -1.0]]


def _separable(k: int, num_classes: int = 5, dim: int = 16, test: int = 200, seed: int = 0):
    """Class c lives near 4 * e_c plus noise: linearly separable with a wide margin."""
    generator = torch.Generator().manual_seed(seed)

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(count) % num_classes
        centres = torch.zeros(num_classes, dim)
        centres[torch.arange(num_classes), torch.arange(num_classes)] = 4.0
        return centres[labels] + 0.3 * torch.randn(count, dim, generator=generator), labels

    return (*draw(k * num_classes), *draw(test))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_separable_features_are_recovered_exactly(k: int) -> None:
    train_x, train_y, test_x, test_y = _separable(k)
    accuracy, l2 = fewshot_accuracy(train_x, train_y, test_x, test_y, 5, FewShotConfig(), seed=0)
    assert accuracy == 1.0
    assert l2 in [2.0**e for e in FewShotConfig().l2_exponents]


def test_select_l2_prefers_strong_regularisation_for_noise_dimensions() -> None:
    # 2 informative dimensions and 200 pure-noise ones with n << d: tiny lambda overfits the noise,
    # so the held-out choice must not be the smallest candidate; and it is deterministic.
    generator = torch.Generator().manual_seed(1)
    labels = torch.arange(40) % 2
    x = torch.randn(40, 202, generator=generator) * 3
    x[:, 0] = labels * 2.0 - 1 + 0.1 * torch.randn(40, generator=generator)
    grid = [2.0**e for e in range(-10, 11)]
    chosen = select_l2(x, labels, 2, grid, folds=5, seed=0)
    assert chosen > grid[0]
    assert chosen == select_l2(x, labels, 2, grid, folds=5, seed=0)


def test_evaluate_fewshot_draws_k_per_class_and_reports_mean_std() -> None:
    pytest.importorskip("vitkit.data.fewshot")
    train_x, train_y, test_x, test_y = _separable(30)
    config = FewShotConfig(shots=(1, 3), seeds=2)
    result = evaluate_fewshot(train_x, train_y, test_x, test_y, 5, config)
    assert set(result.shots) == {1, 3}
    for entry in result.shots.values():
        assert [run["seed"] for run in entry["runs"]] == [0, 1]
        assert entry["mean"] == 1.0 and entry["std"] == 0.0


def test_ridge_path_reuses_one_decomposition_for_every_lambda() -> None:
    x = torch.randn(10, 4, dtype=torch.float64)
    y = pm1_targets(torch.arange(10) % 3, 3)
    path = ridge_path(x, y)
    for l2 in (0.5, 8.0):
        torch.testing.assert_close(path.weights(l2)[0], ridge_path(x, y).weights(l2)[0])


def test_the_draws_of_the_shots_are_bounded() -> None:
    """--seeds 10**12 had listed that many draws and filled 24 GB before the kernel killed it."""
    assert FewShotConfig(seeds=1000).seeds == 1000
    for seeds in (0, 1001, 10**12):
        with pytest.raises(ValueError, match=f"seeds must be 1 or more and at most 1,000, got {seeds}"):
            FewShotConfig(seeds=seeds)
    with pytest.raises(ValueError, match="shots must be integers of 1 or more, got 5, 0"):
        FewShotConfig(shots=(5, 0))


def test_shots_are_drawn_among_the_images_that_decode(tmp_path, monkeypatch) -> None:
    """A set read from files (above the in-memory limit) skips an unreadable image while computing features, so
    the pool's features came back short of the pool and the scatter failed with a shape mismatch; the shots are
    now drawn again among the images that decode, and every probe fits k readable images a class."""
    import numpy as np
    from PIL import Image

    import vitkit
    from vitkit.data.imageset import ImageSet
    from vitkit.eval import fewshot
    from vitkit.eval.fewshot import run_fewshot
    from vitkit.runs import open_checkpoint

    model = vitkit.create_model("vit_ti16", num_classes=3, img_size=16, hidden_size=16, depth=1, num_heads=2,
                                mlp_dim=32, patch_size=8)  # fmt: skip
    checkpoint = open_checkpoint(vitkit.save(model, tmp_path / "ckpt", class_names=["a", "b", "c"]))
    rng = np.random.default_rng(0)
    files, labels = [], []
    for c in range(2):
        for i in range(6):
            path = tmp_path / f"{c}_{i}.png"
            if i % 2:  # every other file of each class is not an image
                path.write_bytes(b"not an image")
            else:
                pixels = np.full((16, 16, 3), 40 + 160 * c, np.uint8) + rng.integers(0, 20, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(path)
            files.append(path)
            labels.append(c)
    train = ImageSet(images=None, files=files, labels=torch.tensor(labels), class_names=["a", "b"], load_size=16)
    test = train.subset(torch.tensor([0, 2, 4, 6, 8, 10]))
    computed = []
    real = fewshot.compute

    def counting(checkpoint, images, *args, **kwargs):
        computed.append([images.name(i) for i in range(len(images))])
        return real(checkpoint, images, *args, **kwargs)

    monkeypatch.setattr(fewshot, "compute", counting)
    result = run_fewshot(checkpoint, train, test, FewShotConfig(shots=(2, 3), seeds=2, device="cpu"))
    assert set(result.shots) == {2, 3} and result.shots[3]["mean"] == 1.0  # all three readable images a class
    shots = [name for call in computed[:-1] for name in call]  # the last call computes the test split
    assert len(computed) > 2 and len(shots) == len(set(shots))  # a redraw computes only images not computed before
    with pytest.raises(ValueError, match="4"):  # 3 readable images a class: 4 shots cannot be drawn
        run_fewshot(checkpoint, train, test, FewShotConfig(shots=(4,), seeds=1, device="cpu"))
    # a round of draws none of whose images decodes: "the data set is empty" ended the probe; the shots are drawn
    # again, until class 1's one readable image is drawn (files 7, 9 and 11 are no images, here twice each)
    odd = train.subset(torch.tensor([0, 2, 4, 7, 9, 11, 7, 9, 11, 10]))
    result = run_fewshot(checkpoint, odd, test, FewShotConfig(shots=(1,), seeds=3, device="cpu"))
    assert [run["seed"] for run in result.shots[1]["runs"]] == [0, 1, 2]


def test_one_shot_is_the_class_prototype_classifier() -> None:
    """With one image a class nothing can be held out, and generalised cross-validation falls as lambda grows for
    any features: k = 1 takes the grid's largest lambda, whose probe scores a test image by its centred dot
    product with each shot (computed here without the ridge code)."""
    grid = [2.0**e for e in range(-10, 21)]
    generator = torch.Generator().manual_seed(0)
    shots = torch.randn(6, 32, generator=generator, dtype=torch.float64)
    labels = torch.arange(6)
    assert select_l2(shots, labels, 6, grid, folds=5, seed=0) == 2.0**20
    assert select_l2(shots, labels, 6, grid[:12], folds=5, seed=0) == 2.0**1
    test = shots.repeat(20, 1) + 1.5 * torch.randn(120, 32, generator=generator, dtype=torch.float64)
    test_labels = labels.repeat(20)
    mean = shots.mean(0)
    prototype = ((test - mean) @ (shots - mean).T).argmax(1)
    accuracy, l2 = fewshot_accuracy(shots, labels, test, test_labels, 6, FewShotConfig(shots=(1,)), seed=0)
    assert l2 == 2.0**20 and accuracy == float((prototype == test_labels).double().mean())
    assert 0.5 < accuracy < 1.0  # the noise makes mistakes, so the agreement is not trivially all-correct


def test_a_class_none_of_whose_images_decode_is_named(tmp_path) -> None:
    """The shots of a class whose every image failed to decode were drawn from the other classes alone, and the
    probe was scored on a test split it could never get right for that class, without a word."""
    import numpy as np
    from PIL import Image

    import vitkit
    from vitkit.data.imageset import ImageSet
    from vitkit.eval.fewshot import run_fewshot
    from vitkit.runs import open_checkpoint

    model = vitkit.create_model("vit_ti16", num_classes=3, img_size=16, hidden_size=16, depth=1, num_heads=2,
                                mlp_dim=32, patch_size=8)  # fmt: skip
    checkpoint = open_checkpoint(vitkit.save(model, tmp_path / "ckpt", class_names=["a", "b", "c"]))
    files, labels = [], []
    for c in range(3):
        for i in range(3):
            path = tmp_path / f"{c}_{i}.png"
            if c == 1:
                path.write_bytes(b"not an image")
            else:
                Image.fromarray(np.full((16, 16, 3), 40 + 80 * c, np.uint8)).save(path)
            files.append(path)
            labels.append(c)
    train = ImageSet(images=None, files=files, labels=torch.tensor(labels), class_names=["a", "b", "cat"], load_size=16)
    test = train.subset(torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"class 'b' \(index 1\) has no usable training image; --shots needs"):
        run_fewshot(checkpoint, train, test, FewShotConfig(shots=(1,), seeds=1, device="cpu"))
