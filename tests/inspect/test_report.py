"""`vitkit inspect` end to end on tiny models: figures written, numbers consistent, inapplicable figures explained."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.checkpoints import Checkpoint
from vitkit.cli import main
from vitkit.inspect.report import InspectConfig, inspect_model

TINY = dict(hidden_size=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8, img_size=32, num_classes=3)


def _checkpoint(**overrides) -> Checkpoint:
    model = vitkit.create_model("vit_ti16", **{**TINY, **overrides})
    channels = model.config.in_chans
    return Checkpoint(model=model.eval(), class_names=["a", "b", "c"], mean=(0.5,) * channels, std=(0.5,) * channels)


def _images(count: int, channels: int = 3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (channels, 40, 48), dtype=torch.uint8, generator=generator) for _ in range(count)]


def test_inspect_learned_1d_writes_all_figures_with_consistent_numbers(tmp_path: Path) -> None:
    checkpoint = _checkpoint()
    report = inspect_model(checkpoint, _images(3), tmp_path, InspectConfig(num_overlays=2, batch_size=2))
    for name in ("filters.png", "position_similarity.png", "attention_distance.png", "attention_rollout.png"):
        assert (tmp_path / name).stat().st_size > 1000
    assert report["notes"] == {}
    stored = json.loads((tmp_path / "inspect.json").read_text())
    distances = np.array(stored["attention_distance"]["per_layer_head"])
    assert distances.shape == (2, 2)  # (L, k)
    # a weighted mean of patch-centre distances on a 4x4 grid of 8 px patches: 0 <= d <= diagonal span
    assert np.all(distances >= 0) and np.all(distances <= np.hypot(24, 24))
    uniform = stored["attention_distance"]["uniform_reference"]
    assert abs(uniform - 8 * 2.0080150) < 1e-5  # mean pairwise distance of a 4x4 unit grid (self-pairs included)
    maps = np.array(stored["attention_rollout"]["maps"])
    assert maps.shape == (2, 4, 4) and np.allclose(maps.sum(axis=(1, 2)), 1.0)
    similarity = np.array(stored["position_similarity"]["similarity"])
    assert similarity.shape == (4, 4, 4, 4) and np.allclose(
        similarity[np.arange(4)[:, None], np.arange(4), np.arange(4)[:, None], np.arange(4)], 1.0
    )
    assert len(stored["filters"]["explained_variance_ratio"]) == 28


def test_inspect_distance_averages_over_images_in_any_batching(tmp_path: Path) -> None:
    checkpoint = _checkpoint(pool="gap", posemb="sincos_2d")
    images = _images(3)
    one = inspect_model(checkpoint, images, tmp_path / "a", InspectConfig(batch_size=1, num_overlays=1, draw=False))
    three = inspect_model(checkpoint, images, tmp_path / "b", InspectConfig(batch_size=3, num_overlays=1, draw=False))
    assert not (tmp_path / "a" / "attention_distance.png").exists()
    np.testing.assert_allclose(
        one["attention_distance"]["per_layer_head"], three["attention_distance"]["per_layer_head"], rtol=1e-6
    )


@pytest.mark.parametrize("posemb", ["relative", "none"])
def test_inspect_says_position_similarity_does_not_apply(tmp_path: Path, posemb: str) -> None:
    report = inspect_model(_checkpoint(posemb=posemb), [], tmp_path, InspectConfig())
    assert "does not apply" in report["notes"]["position_similarity"]
    assert "no images" in report["notes"]["attention_distance"]
    assert not (tmp_path / "position_similarity.png").exists() and (tmp_path / "filters.png").exists()


def test_inspect_cli_grayscale_model_from_image_files(tmp_path: Path, capsys) -> None:
    model = vitkit.create_model("vit_ti16", **{**TINY, "in_chans": 1, "posemb": "learned_2d"})
    checkpoint = vitkit.save(model, tmp_path / "ckpt", class_names=["a", "b", "c"], mean=(0.5,), std=(0.5,))
    picture = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(picture)
    assert main(["inspect", str(checkpoint), "--images", str(picture), "--out", str(tmp_path / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["num_images"] == 1 and len(summary["attention_distance_per_layer"]) == 2
    stored = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert "grayscale" in stored["filters"]["shown"]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    assert main(["inspect", str(checkpoint), "--images", str(broken), "--out", str(tmp_path / "out2")]) == 2
    assert "broken.png" in capsys.readouterr().err


def test_rollout_figure_holds_num_overlays_images(tmp_path: Path) -> None:
    report = inspect_model(_checkpoint(), _images(5), tmp_path, InspectConfig(num_overlays=3, batch_size=1, draw=False))
    assert len(report["attention_rollout"]["maps"]) == 3 and report["num_images"] == 5


@pytest.mark.parametrize("side, uniform", [(7, 25 / 49), (8, 16 / 64), (2, None)])
def test_the_rollout_centre_share_is_read_against_uniform_relevance_on_its_own_grid(side: int, uniform) -> None:
    """ "(25% = uniform)" held only for grid sides divisible by 4 (a 7x7 grid's centre is 51% of it), and a 2x2
    grid, all edge, printed 100% on the central half for every model."""
    from vitkit.inspect.report import _centre_mass

    flat = torch.ones(3, side, side)
    share, reference = _centre_mass(flat)
    if uniform is None:
        assert share is None and reference is None
        return
    assert share == pytest.approx(uniform) and reference == pytest.approx(uniform)
    peaked = torch.zeros(1, side, side)
    peaked[0, side // 2, side // 2] = 1.0
    assert _centre_mass(peaked)[0] == 1.0


def test_the_summary_line_counts_the_figures_it_wrote(tmp_path: Path, capsys) -> None:
    """A BiT ResNet, for which every figure is skipped, printed "wrote figures to OUT" and exited 0."""
    resnet = vitkit.save(vitkit.create_model("bit_r50x1", img_size=32, num_classes=3), tmp_path / "resnet")
    assert main(["inspect", str(resnet), "--data", "digits", "--num-images", "2", "--out", str(tmp_path / "r")]) == 0
    assert "wrote inspect.json alone (no figure applies: notes)" in capsys.readouterr().out
    vit = vitkit.save(vitkit.create_model("vit_ti16", **{**TINY, "in_chans": 1}), tmp_path / "vit")
    assert main(["inspect", str(vit), "--data", "digits", "--num-images", "2", "--out", str(tmp_path / "v")]) == 0
    written = sorted(p.name for p in (tmp_path / "v").glob("*.png"))
    assert f"wrote {len(written)} figure(s) and inspect.json" in capsys.readouterr().out and len(written) >= 3


def test_the_summary_gives_head_distances_to_a_tenth_of_a_pixel() -> None:
    """Rounded to whole pixels, heads 0.6 and 1.4 px apart read "1-1" on a grid of 8-px steps."""
    from vitkit.inspect.report import summary

    distance = {"per_layer_mean": [1.0, 6.2], "uniform_reference": 9.0, "per_layer_min": [0.6, 5.25]}
    distance["per_layer_max"] = [1.4, 7.0]
    lines = summary({"out": "o", "attention_distance": distance})["lines"]
    assert any(line.strip() == "min/max over heads per layer: 0.6-1.4, 5.2-7.0" for line in lines), lines


def test_no_figures_names_no_figure_and_the_variance_key_says_its_components(tmp_path: Path, capsys) -> None:
    """--no-figures printed "wrote 4 figure(s)" and inspect.json listed filters.png and the rest, none of which
    existed; the JSON key filters_top28_variance held the top --components share (5 here), whatever 28 says."""
    model = vitkit.create_model("vit_ti16", **{**TINY, "posemb": "learned_2d"})
    checkpoint = vitkit.save(model, tmp_path / "ckpt", class_names=["a", "b", "c"], mean=(0.5,) * 3, std=(0.5,) * 3)
    picture = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)).save(picture)
    out = tmp_path / "out"
    flags = ["--images", str(picture), "--out", str(out), "--components", "5", "--no-figures"]
    assert main(["inspect", str(checkpoint), *flags]) == 0
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first.startswith(f"wrote inspect.json alone (--no-figures) to {out}")
    assert sorted(p.name for p in out.iterdir()) == ["inspect.json"]
    stored = json.loads((out / "inspect.json").read_text())
    assert not [k for k, v in stored.items() if isinstance(v, dict) and "figure" in v]
    assert main(["inspect", str(checkpoint), *flags, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ratio = stored["filters"]["explained_variance_ratio"]
    assert summary["filters_components"] == len(ratio) == 5 and summary["filters_variance"] == sum(ratio)
    assert "filters_top28_variance" not in summary


def test_a_second_inspect_into_the_same_folder_leaves_no_figure_of_the_first(tmp_path: Path) -> None:
    """Inspecting again without images (or another model) left the first run's attention figures beside the new
    inspect.json, which says they were skipped."""
    out = tmp_path / "figures"
    inspect_model(_checkpoint(), _images(2), out, InspectConfig())
    figures = ("filters", "position_similarity", "attention_distance", "attention_rollout")
    assert {p.name for p in out.glob("*.png")} == {f"{name}.png" for name in figures}
    (out / "notes.png").write_bytes(b"the user's own file")
    report = inspect_model(_checkpoint(posemb="relative"), [], out, InspectConfig())
    assert set(report["notes"]) == {"position_similarity", "attention_distance", "attention_rollout"}
    assert {p.name for p in out.glob("*.png")} == {"filters.png", "notes.png"}
    inspect_model(_checkpoint(), _images(2), tmp_path / "numbers", InspectConfig(draw=False))
    assert not list((tmp_path / "numbers").glob("*.png"))


def test_inspect_replaces_a_figure_not_its_own_only_with_force(tmp_path: Path, capsys) -> None:
    """A folder holding a filters.png but no inspect.json is not an earlier inspect's: its file was overwritten
    without a word, where `embed` asks for --force.  An earlier inspect's folder is still replaced as before."""
    checkpoint = vitkit.save(vitkit.create_model("vit_ti16", **TINY), tmp_path / "ckpt")
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "filters.png").write_bytes(b"the user's own figure")
    assert main(["inspect", str(checkpoint), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "filters.png" in err and "--force" in err and "inspect.json" in err
    assert (out / "filters.png").read_bytes() == b"the user's own figure" and not (out / "inspect.json").exists()
    assert main(["inspect", str(checkpoint), "--out", str(out), "--force"]) == 0
    assert (out / "filters.png").read_bytes().startswith(b"\x89PNG") and (out / "inspect.json").is_file()
    assert main(["inspect", str(checkpoint), "--out", str(out)]) == 0  # now an earlier inspect's folder


def test_the_rollout_overlays_are_not_the_first_classes_of_a_sorted_folder(tmp_path: Path) -> None:
    """The overlays are the first --num-overlays of the drawn images: read in the split's order, a folder sorted
    by class showed its first two or three classes only.  Each image's one grey level here is its class."""
    from vitkit.inspect.report import sample_images

    for split in ("train", "test"):
        for label in range(8):
            (tmp_path / split / f"class{label}").mkdir(parents=True)
            for i in range(3):
                Image.new("L", (8, 8), 20 + 30 * label).save(tmp_path / split / f"class{label}" / f"{i}.png")
    drawn = sample_images(f"folder:{tmp_path}", "test", 24, channels=1, size=8)
    labels = [round((int(image[0, 4, 4]) - 20) / 30) for image in drawn]
    assert sorted(labels) == sorted(list(range(8)) * 3)  # all 24, each once
    assert len(set(labels[:8])) >= 5  # in the split's order: 3 classes


def test_inspect_draws_its_images_from_a_streamed_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A split too large to decode up front is streamed from its shards; drawing inspect's images from one was an
    AttributeError traceback (a streamed split had no fixed_sample)."""
    from vitkit.data import imageset
    from vitkit.data.shard import write_shards

    write_shards("digits", tmp_path / "wds", 100)
    checkpoint = vitkit.save(vitkit.create_model("vit_ti16", **{**TINY, "in_chans": 1}), tmp_path / "ckpt")
    monkeypatch.setattr(imageset, "MAX_FILES_IN_MEMORY", 0)  # every split is "large": streamed
    flags = ["--data", f"wds:{tmp_path / 'wds'}", "--num-images", "5", "--num-overlays", "3", "--no-figures"]
    assert main(["inspect", str(checkpoint), *flags, "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert report["num_images"] == 5
