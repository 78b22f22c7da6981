"""`vitkit eval`, `fewshot`, `embed` in-process on the bundled digits: numbers against hand computations."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

import vitkit
from vitkit.cli import main
from vitkit.data.fewshot import k_per_class
from vitkit.data.sources import load_split
from vitkit.data.transforms import eval_transform
from vitkit.runs import find_checkpoint


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _hand_logits(checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """All test images through the model in one batch, outside the eval code."""
    model = vitkit.load(checkpoint).eval()
    test = load_split("digits", "test")
    with torch.no_grad():
        logits = model(eval_transform(test.images, 16, (0.5,), (0.5,), 1))
    return logits, test.labels


def test_eval_matches_hand_computation_and_does_not_depend_on_batch(
    tmp_path: Path, digits_checkpoint: Path, capsys
) -> None:
    logits, labels = _hand_logits(digits_checkpoint)
    order = np.argsort(-logits.numpy(), axis=1, kind="stable")
    top1 = float(np.mean(order[:, 0] == labels.numpy()))
    top5 = float(np.mean([labels[i].item() in order[i, :5] for i in range(len(labels))]))
    reports = []
    out = tmp_path / "eval"
    for batch, where in (("7", []), ("128", ["--out", str(out)])):
        assert main(["eval", str(digits_checkpoint), "--data", "digits", "--batch-size", batch, *where, "--json"]) == 0
        reports.append(_last_json(capsys))
    assert (out / "confusion_test.png").stat().st_size > 1000
    assert json.loads((out / "eval_test.json").read_text())["top1"] == reports[-1]["top1"]
    report = reports[0]
    assert report["num_images"] == len(labels) == 359
    assert abs(report["top1"] - top1) < 1e-12 and abs(report["top5"] - top5) < 1e-12
    assert 0.0 < top1 < 1.0  # the random head predicts several classes
    confusion = np.array(report["confusion"])
    assert confusion.sum() == 359 and confusion.sum(1).tolist() == np.bincount(labels.numpy(), minlength=10).tolist()
    assert abs(np.trace(confusion) / 359 - top1) < 1e-12
    assert reports[0]["confusion"] == reports[1]["confusion"]  # batch 7 vs 128 vs 359: same predictions


def test_eval_at_another_resolution_and_clear_error_for_wrong_classes(
    tmp_path: Path, digits_checkpoint: Path, make_checkpoint, capsys
) -> None:
    assert main(["eval", str(digits_checkpoint), "--data", "digits", "--img-size", "24", "--json"]) == 0
    assert _last_json(capsys)["img_size"] == 24  # 3x3 patches: position embeddings resampled on the fly
    other = make_checkpoint(tmp_path / "three", in_chans=1, img_size=16, num_classes=3)
    assert main(["eval", str(other), "--data", "digits"]) == 2
    err = capsys.readouterr().err
    assert "classes" in err and "Traceback" not in err


def test_run_directory_resolves_to_final_or_newest_checkpoint(tmp_path: Path, make_checkpoint) -> None:
    run = tmp_path / "run"
    old = make_checkpoint(run / "checkpoints" / "step_000010", in_chans=1, img_size=16)
    new = make_checkpoint(run / "checkpoints" / "step_000020", in_chans=1, img_size=16)
    past = time.time() - 100
    os.utime(old / "config.json", (past, past))
    assert find_checkpoint(run) == new
    final = make_checkpoint(run / "checkpoints" / "final", in_chans=1, img_size=16)
    assert find_checkpoint(run) == final
    assert find_checkpoint(final) == final
    # vitkit train's layout: LATEST names the newest step; a newer final/ or ema/ export (Polyak average) wins
    (run / "checkpoints" / "LATEST").write_text("step_000010\n")
    assert find_checkpoint(run) == final  # the finished run's model, as docs/evaluation.md says
    os.utime(final / "config.json", (past - 20, past - 20))
    assert find_checkpoint(run) == old  # the run went on after that final export
    ema = make_checkpoint(run / "checkpoints" / "ema", in_chans=1, img_size=16)
    assert find_checkpoint(run) == ema
    os.utime(ema / "config.json", (past - 10, past - 10))
    assert find_checkpoint(run) == old


def test_plain_eval_names_the_checkpoint_it_read(tmp_path: Path, make_checkpoint, capsys) -> None:
    """An unfinished run is scored at its newest step; the text says which, as --json does."""
    run = tmp_path / "run"
    step = make_checkpoint(run / "checkpoints" / "step_000020", in_chans=1, img_size=16)
    assert main(["eval", str(run), "--data", "digits", "--max-images", "20"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"model {step}"
    assert main(["fewshot", str(run), "--data", "digits", "--shots", "1", "--seeds", "1", "--max-test", "20"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"model {step}"


def test_fewshot_cli_reports_every_k_and_seed(digits_checkpoint: Path, capsys) -> None:
    assert (
        main(["fewshot", str(digits_checkpoint), "--data", "digits", "--shots", "1,5", "--seeds", "2", "--json"]) == 0
    )
    report = _last_json(capsys)
    assert set(report["shots"]) == {"1", "5"} and report["num_test"] == 359
    for entry in report["shots"].values():
        accuracies = [run["accuracy"] for run in entry["runs"]]
        assert len(accuracies) == 2 and abs(np.mean(accuracies) - entry["mean"]) < 1e-12
        assert abs(np.std(accuracies, ddof=1) - entry["std"]) < 1e-12
        assert all(0.0 <= a <= 1.0 for a in accuracies)
        assert all(float(np.log2(run["l2"])).is_integer() for run in entry["runs"])  # powers of 2


def test_k_per_class_draws_exactly_k() -> None:
    labels = load_split("digits", "train").labels
    for k in (1, 5, 25):
        index = k_per_class(labels, k, seed=3)
        assert torch.bincount(labels[index], minlength=10).tolist() == [k] * 10
        assert len(index.unique()) == len(index)


def test_k_per_class_draws_what_a_scan_of_each_class_draws() -> None:
    """Each class's members are found by one sort, not a scan of every label per class (3.3 s a draw on 1.28M
    labels of 1,000 classes): the draws are those of the scan, positions of -1 (not to be drawn) among them."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 7, (3000,), generator=generator)
    labels[::11] = -1
    for seed in range(3):
        scanned, draw = [], torch.Generator().manual_seed(seed)
        for cls in range(7):
            members = torch.nonzero(labels == cls).flatten()
            scanned.append(members[torch.randperm(len(members), generator=draw)[:5]])
        assert torch.equal(k_per_class(labels, 5, seed, num_classes=7), torch.cat(scanned).sort().values)


def test_embed_npy_and_safetensors_round_trip(tmp_path: Path, digits_checkpoint: Path, capsys) -> None:
    target = tmp_path / "emb.npy"
    assert main(["embed", str(digits_checkpoint), "--data", "digits", "--out", str(target), "--json"]) == 0
    assert _last_json(capsys)["shape"] == [359, 32]
    features = np.load(target, allow_pickle=False)
    labels = np.load(tmp_path / "emb.labels.npy", allow_pickle=False)
    model = vitkit.load(digits_checkpoint).eval()
    test = load_split("digits", "test")
    with torch.no_grad():
        expected = model.forward_features(eval_transform(test.images[:5], 16, (0.5,), (0.5,), 1))
    np.testing.assert_allclose(features[:5], expected.numpy(), atol=1e-5)
    assert labels.tolist() == test.labels.tolist()
    assert "names" not in json.loads((tmp_path / "emb.json").read_text())  # arrays: row i is the source's row i
    tokens = tmp_path / "tokens.safetensors"
    assert main(["embed", str(digits_checkpoint), "--data", "digits", "--layer", "block01", "--out", str(tokens)]) == 0
    stored = load_file(str(tokens))
    assert stored["embeddings"].shape == (359, 5, 32) and stored["labels"].tolist() == test.labels.tolist()
    assert main(["embed", str(digits_checkpoint), "--data", "digits", "--out", str(tmp_path / "x.txt")]) == 2
    again = ["embed", str(digits_checkpoint), "--data", "digits", "--out", str(target)]
    before = target.read_bytes()
    assert main(again) == 2  # it replaced the three files without a word
    err = capsys.readouterr().err
    assert f"{target}, {tmp_path / 'emb.labels.npy'} and {tmp_path / 'emb.json'} already exist; choose another" in err
    assert target.read_bytes() == before
    assert main([*again, "--layer", "block09", "--force"]) == 2
    listed = capsys.readouterr().err.split("choose from ")[1].strip().split(", ")
    assert listed[:3] == ["logits", "features", "block00"] and len(listed) == len(set(listed))  # logits listed twice
    assert main(["embed", str(digits_checkpoint), "--data", "digits", "--out", str(tokens)]) == 2
    assert f"{tokens} already exists; choose another --out" in capsys.readouterr().err


def test_fewshot_works_for_a_resnet(tmp_path: Path, capsys) -> None:
    from vitkit.models import build_model
    from vitkit.models.configs import ResNetConfig

    model = build_model(ResNetConfig(layers=(1, 1), img_size=16, in_chans=1, num_classes=10))
    checkpoint = vitkit.save(
        model, tmp_path / "resnet", class_names=[str(i) for i in range(10)], mean=(0.5,), std=(0.5,)
    )
    assert main(["fewshot", str(checkpoint), "--data", "digits", "--shots", "5", "--seeds", "1", "--json"]) == 0
    report = _last_json(capsys)
    # a random-weight ResNet is still a useful feature extractor on 8x8 digits: well above 10 % chance
    assert report["shots"]["5"]["mean"] > 0.4
    assert main(["inspect", str(checkpoint), "--out", str(tmp_path / "inspect"), "--json"]) == 0
    assert "not a Vision Transformer" in _last_json(capsys)["notes"]["attention_rollout"]


def test_a_run_evaluated_on_other_data_keeps_its_own_figures(tmp_path: Path, capsys) -> None:
    """RUN/eval/eval_test.json is the run's own data set; another one is written beside it under its name."""
    from PIL import Image

    run, photos = tmp_path / "run", tmp_path / "photos"
    assert main(["train", "--recipe", "small-8px-tiny", "--out", str(run), "--set", "run.threads=1"]) == 0
    for digit in range(10):  # ten classes of 8x8 grayscale images, named as the digits' classes are
        (photos / str(digit)).mkdir(parents=True)
        for i in range(5):
            Image.new("L", (8, 8), 25 * digit + i).save(photos / str(digit) / f"{i}.png")
    capsys.readouterr()
    assert main(["eval", str(run), "--data", "digits", "--json"]) == 0
    own = _last_json(capsys)
    assert main(["eval", str(run), "--data", f"folder:{photos}", "--json"]) == 0
    other = _last_json(capsys)
    assert own["files"] == ["eval_test.json", "confusion_test.png"]
    assert other["files"] == ["eval_folder-photos_test.json", "confusion_folder-photos_test.png"]
    assert json.loads((run / "eval" / "eval_test.json").read_text())["top1"] == own["top1"]
    assert json.loads((run / "eval" / "eval_folder-photos_test.json").read_text())["num_images"] == 10


def test_flip_views_are_refused_where_a_mirror_changes_the_label(digits_checkpoint: Path, tmp_path, capsys) -> None:
    """eval --flip-views on digits averaged each digit with its mirror image (top-1 13.65% -> 12.26%)."""
    assert main(["eval", str(digits_checkpoint), "--data", "digits", "--flip-views"]) == 2
    assert "a mirror image changes the label here" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "r"), "--set", "eval.flip_views=true"]) == 2
    said = capsys.readouterr().err  # each names what the user typed (train has no --flip-views)
    assert said.rstrip().endswith("mix classes; leave out eval.flip_views=true") and "--flip-views" not in said


def test_embeddings_replaced_mid_write_never_pair_with_the_old_labels(tmp_path: Path, monkeypatch) -> None:
    """Replacing FILE.npy wrote the new embeddings, then the labels: a kill between left new embeddings beside
    the old labels and sidecar, a pair that reads as complete.  The sidecar goes first and comes back last."""
    import numpy as np
    import pytest
    import torch

    from vitkit.eval import embed

    target = tmp_path / "e.npy"
    embed.save_embeddings(target, torch.zeros(4, 2), torch.tensor([0, 1, 0, 1]), {"layer": "old"})
    save_npy = embed._save_npy

    def killed_after_the_embeddings(path: Path, array) -> None:
        save_npy(path, array)
        if path == target:
            raise KeyboardInterrupt

    monkeypatch.setattr(embed, "_save_npy", killed_after_the_embeddings)
    with pytest.raises(KeyboardInterrupt):
        embed.save_embeddings(target, torch.ones(4, 2), torch.tensor([1, 1, 1, 1]), {"layer": "new"})
    assert np.load(target).sum() == 8  # the new embeddings, and nothing that says they are complete
    assert not (tmp_path / "e.labels.npy").exists() and not (tmp_path / "e.json").exists()


def test_class_names_with_control_characters_are_printed_escaped(tmp_path: Path, capsys) -> None:
    """A checkpoint's class name holding an ESC sequence or a newline was printed raw: it could recolour the
    terminal or forge a line of predict's output."""
    from PIL import Image

    model = vitkit.create_model(
        "vit_ti16", num_classes=2, img_size=16, hidden_size=32, depth=1, num_heads=2, mlp_dim=32
    )
    hostile = ["cat\x1b[2J", "dog\nfake.jpg: cat 100.0%"]
    vitkit.save(model, tmp_path / "m", class_names=hostile, mean=(0.5,) * 3, std=(0.5,) * 3)
    Image.new("RGB", (16, 16)).save(tmp_path / "a.png")
    assert main(["predict", str(tmp_path / "m"), str(tmp_path / "a.png"), "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("\n") == 1
    assert "cat\\x1b[2J" in out and "dog\\nfake.jpg: cat 100.0%" in out


def test_embed_names_each_row_by_the_file_it_was_read_from(tmp_path: Path, rgb_checkpoint: Path) -> None:
    """Rows had no names: a user could not tell which photo a row was.  An unreadable photo is left out of both."""
    root = tmp_path / "photos"
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (20, 20), (80 * i, 40, 200 if name == "dog" else 10)).save(
                    root / split / name / f"{name}{i}.png"
                )
    (root / "test" / "dog" / "broken.png").write_bytes(b"not a png")
    argv = ["embed", str(rgb_checkpoint), "--data", f"folder:{root}", "--out"]
    assert main([*argv, str(tmp_path / "e.npy")]) == 0
    names = json.loads((tmp_path / "e.json").read_text())["names"]
    assert [Path(n).relative_to(root / "test").as_posix() for n in names] == [
        "cat/cat0.png", "cat/cat1.png", "dog/dog0.png", "dog/dog1.png"
    ]  # fmt: skip
    labels = np.load(tmp_path / "e.labels.npy", allow_pickle=False)
    assert [Path(n).parent.name for n in names] == [["cat", "dog"][k] for k in labels.tolist()]
    assert main([*argv, str(tmp_path / "e.safetensors")]) == 0
    with safe_open(str(tmp_path / "e.safetensors"), "pt") as stored:
        assert json.loads(stored.metadata()["names"]) == names


def test_eval_above_the_confusion_limit_names_the_one_file_it_wrote(
    tmp_path: Path, digits_checkpoint: Path, capsys, monkeypatch
) -> None:
    """Above the confusion limit no matrix (and no plot) is written; the human-readable report named a second
    file that did not exist and ended in an IndexError after eval_test.json was written."""
    from vitkit.eval import evaluator

    monkeypatch.setattr(evaluator, "CONFUSION_MAX_CLASSES", 5)
    out = tmp_path / "eval"
    assert main(["eval", str(digits_checkpoint), "--data", "digits", "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"wrote {out}/eval_test.json"
    assert sorted(p.name for p in out.iterdir()) == ["eval_test.json"]
    assert json.loads((out / "eval_test.json").read_text())["confusion"] is None


@pytest.mark.parametrize("shots", ["1,,5", "0,5", "five", ""])
def test_fewshot_refuses_shots_that_name_no_count(digits_checkpoint: Path, shots: str, capsys) -> None:
    """`--shots 1,,5` was read as "1,5", a slip taken silently."""
    assert main(["fewshot", str(digits_checkpoint), "--data", "digits", "--shots", shots]) == 2
    assert f"--shots must be comma-separated integers of 1 or more, got {shots!r}" in capsys.readouterr().err


def test_inspect_refuses_no_overlays_by_its_flag(digits_checkpoint: Path, capsys) -> None:
    """--num-overlays 0 was refused as "num_components, num_overlays and batch_size must be positive"."""
    with pytest.raises(SystemExit):
        main(["inspect", str(digits_checkpoint), "--num-overlays", "0"])
    assert "argument --num-overlays: expected an integer from 1 up, got '0'" in capsys.readouterr().err
