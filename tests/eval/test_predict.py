"""`vitkit predict` on awkward files, run in-process: correct output or one clear error line, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli import main
from vitkit.eval.predict import PredictConfig, predict_files


def _write_images(folder: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    folder.mkdir()
    files = {
        "rgba": folder / "alpha.png",
        "gray": folder / "gray.jpg",
        "tiny": folder / "one_pixel.png",
        "cmyk": folder / "cmyk.jpg",
        "deep": folder / "sixteen_bit.png",
        "palette": folder / "palette.png",
    }
    Image.fromarray(rng.integers(0, 256, (32, 32, 4), dtype=np.uint8), "RGBA").save(files["rgba"])
    Image.fromarray(rng.integers(0, 256, (50, 70), dtype=np.uint8), "L").save(files["gray"], quality=90)
    Image.new("RGB", (1, 1), (200, 30, 90)).save(files["tiny"])
    Image.new("CMYK", (40, 40), (10, 200, 30, 0)).save(files["cmyk"])
    Image.fromarray(rng.integers(0, 65536, (24, 40), dtype=np.uint16)).save(files["deep"])
    palette = Image.fromarray(rng.integers(0, 256, (33, 33, 3), dtype=np.uint8)).convert("P")
    palette.save(files["palette"], transparency=0)
    return files


def test_predict_awkward_images_and_corrupt_files(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    files = _write_images(tmp_path / "images")
    corrupt = tmp_path / "images" / "broken.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(files["rgba"].read_bytes()[:200])
    args = ["predict", str(rgb_checkpoint), str(tmp_path / "images"), str(truncated), "--top-k", "3", "--json"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 1  # some files failed
    assert "Traceback" not in out + err
    errors = err.strip().splitlines()
    assert len(errors) == 2
    assert any("broken.jpg" in line for line in errors) and any("truncated.png" in line for line in errors)
    results = {Path(r["file"]).name: r for r in json.loads(out.strip().splitlines()[-1])["results"]}
    assert results["broken.jpg"]["error"] and "predictions" not in results["broken.jpg"]
    for path in files.values():
        top = results[path.name]["predictions"]
        assert len(top) == 3
        probs = [p["probability"] for p in top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert all(p["class"] == f"class_{p['index']}" for p in top)


def test_predict_probabilities_match_an_independent_forward_pass(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    files = _write_images(tmp_path / "images")
    assert main(["predict", str(rgb_checkpoint), str(files["rgba"]), "--top-k", "4", "--json"]) == 0
    top = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"][0]["predictions"]
    # independent: 32x32 RGBA -> drop alpha -> [-1, 1] (x / 127.5 - 1) -> model -> softmax
    pixels = np.asarray(Image.open(files["rgba"]).convert("RGB"), dtype=np.float32)
    inputs = torch.from_numpy(pixels / 127.5 - 1.0).permute(2, 0, 1)[None]
    model = vitkit.load(rgb_checkpoint).eval()
    with torch.no_grad():
        expected = model(inputs).softmax(-1)[0]
    for entry in top:
        assert abs(entry["probability"] - float(expected[entry["index"]])) < 1e-5
    assert top[0]["index"] == int(expected.argmax())


def test_the_python_predict_is_the_verbs(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    """`vitkit.predict` decodes, resizes and normalises as `vitkit predict` does: the same numbers."""
    files = _write_images(tmp_path / "images")
    paths = [str(files[name]) for name in ("rgba", "gray", "cmyk")]
    assert main(["predict", str(rgb_checkpoint), *paths, "--top-k", "3", "--json"]) == 0
    verb = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert vitkit.predict(rgb_checkpoint, paths, top_k=3) == verb
    assert vitkit.predict(rgb_checkpoint, [tmp_path / "missing.png"])[0]["error"].endswith("no such file")
    os.mkfifo(tmp_path / "fifo.png")  # it exists: "no such file" had been said of it, and of /dev/zero
    assert "not a regular file" in vitkit.predict(rgb_checkpoint, [tmp_path / "fifo.png"])[0]["error"]
    (alone,) = vitkit.predict(rgb_checkpoint, paths[0], top_k=3)  # one path, not a sequence of characters
    assert [p["index"] for p in alone["predictions"]] == [p["index"] for p in verb[0]["predictions"]]
    for ours, theirs in zip(alone["predictions"], verb[0]["predictions"]):  # a batch of one: float rounding only
        assert ours["probability"] == pytest.approx(theirs["probability"], abs=1e-6)


def test_predict_missing_file_and_human_output(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    files = _write_images(tmp_path / "images")
    code = main(["predict", str(rgb_checkpoint), str(files["tiny"]), str(tmp_path / "nope.png")])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    assert err.count("\n") == 1 and "nope.png" in err
    assert out.startswith(str(files["tiny"])) and "%" in out


def test_predict_on_a_folder_without_images_is_a_users_error(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    """Nothing to predict is what the user gave (status 2, as every error they can fix), not a failed image (1)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no images here")
    code = main(["predict", str(rgb_checkpoint), str(tmp_path / "empty")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("vitkit predict: error: no image files (") and "empty" in err
    # from Python, an empty inbox is an empty answer (and a warning), as before
    assert predict_files(vitkit.checkpoints.read(rgb_checkpoint), [tmp_path / "empty"], PredictConfig()) == []


def test_a_top_k_below_one_is_refused_by_its_flag(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    """The message "--top-k, --batch-size and --img-size must be positive" left the user to find which of the
    three (the other two are refused by their flags already); from Python, PredictConfig names its field."""
    with pytest.raises(SystemExit) as stopped:
        main(["predict", str(rgb_checkpoint), str(tmp_path / "a.png"), "--top-k", "0"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "argument --top-k: expected an integer from 1 up, got '0'" in err
    with pytest.raises(ValueError, match=r"^PredictConfig.top_k must be positive, got 0$"):
        PredictConfig(top_k=0)


def test_predict_decodes_a_batch_at_a_time(tmp_path: Path, rgb_checkpoint: Path, monkeypatch) -> None:
    """A folder of many photos is read a batch at a time (it had decoded every file before the first forward
    pass: 100,000 photos at 224 px held 15 GB); a bad file in a batch leaves the others' predictions."""
    from vitkit.eval import predict

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(7):
        Image.new("RGB", (20, 20), (30 * i, 0, 0)).save(folder / f"{i}.png")
    (folder / "3.png").write_bytes(b"not an image")
    decoded, widest = [0], [0]
    real_decode, real_probabilities = predict._decode, predict.class_probabilities

    def decode(*args, **kwargs):
        decoded[0] += 1
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(predict, "_decode", decode)

    def probabilities(model, inputs):
        widest[0] = max(widest[0], decoded[0] - inputs.shape[0])  # decoded and not yet passed forward
        decoded[0] = 0
        return real_probabilities(model, inputs)

    monkeypatch.setattr(predict, "class_probabilities", probabilities)
    checkpoint = vitkit.checkpoints.read(rgb_checkpoint)
    results = predict_files(checkpoint, [folder], PredictConfig(batch_size=2))
    alone = [predict_files(checkpoint, [folder / f"{i}.png"], PredictConfig())[0] for i in range(7)]
    assert widest == [1]  # at most the bad file beside its batch
    for batched, single in zip(results, alone, strict=True):  # the same classes, equal up to float rounding
        got_all, want_all = batched.get("predictions", []), single.get("predictions", [])
        assert [p["index"] for p in got_all] == [p["index"] for p in want_all]
        for got, want in zip(got_all, want_all, strict=True):
            assert got["probability"] == pytest.approx(want["probability"], rel=1e-4, abs=1e-7)
    assert "error" in results[3] and sum("predictions" in r for r in results) == 6


def test_predict_max_pixels_is_a_flag(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    """The decompression-bomb limit is Pillow's by default; a user with large photos raises it (as serve's)."""
    image = tmp_path / "wide.png"
    Image.new("RGB", (300, 200), (90, 10, 10)).save(image)
    assert main(["predict", str(rgb_checkpoint), str(image), "--max-pixels", "50000", "--json"]) == 1
    assert "60,000 pixels" in capsys.readouterr().err
    assert main(["predict", str(rgb_checkpoint), str(image), "--max-pixels", "60000", "--json"]) == 0
    assert main_refuses(["predict", str(rgb_checkpoint), str(image), "--max-pixels", "0"], capsys)


def main_refuses(argv: list[str], capsys) -> bool:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code == 2 and "--max-pixels" in capsys.readouterr().err


def test_a_dangling_link_in_a_folder_is_an_error_not_skipped(tmp_path: Path, rgb_checkpoint: Path, capsys) -> None:
    """A link to a moved photo inside a folder is reported as the same link given by name is, naming its target."""
    files = _write_images(tmp_path / "images")
    (tmp_path / "images" / "moved.jpg").symlink_to(tmp_path / "elsewhere" / "moved.jpg")
    code = main(["predict", str(rgb_checkpoint), str(tmp_path / "images"), "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    results = {Path(r["file"]).name: r for r in json.loads(out.strip().splitlines()[-1])["results"]}
    assert set(results) == {path.name for path in files.values()} | {"moved.jpg"}
    error = results["moved.jpg"]["error"]
    assert "moved.jpg" in error and "link" in error and str(tmp_path / "elsewhere") in error
    assert err.strip().splitlines() == [f"vitkit predict: error: {error}"]
