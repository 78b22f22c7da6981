"""`vitkit train`: flags -> config -> run; errors (`vitkit finetune`: test_cli_finetune.py)."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
from helpers import class_npz, last_json

from vitkit.cli import main
from vitkit.train.resolve import Request, resolve


def test_train_tiny_recipe_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--recipe",
            "small-8px-tiny",
            "--out",
            str(out),
            "--json",
            "--seed",
            "1",
            "--set",
            "run.threads=1",
            "--set",
            "data.steps=3",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    result = last_json(captured.out)
    assert result["status"] == "finished" and result["step"] == 3 and result["test"]["count"] == 359
    assert "recipe: small-8px-tiny" in captured.err and "effective global batch: 32" in captured.err
    assert "learning rate:" in captured.err
    config = json.loads((out / "config.json").read_text())
    assert config["run"]["seed"] == 1 and config["data"]["steps"] == 3
    # Re-running the same command resumes the finished run: nothing is trained again.
    assert (
        main(
            [
                "train",
                "--recipe",
                "small-8px-tiny",
                "--out",
                str(out),
                "--json",
                "--seed",
                "1",
                "--set",
                "run.threads=1",
                "--set",
                "data.steps=3",
            ]
        )
        == 0
    )
    again = last_json(capsys.readouterr().out)
    assert again["step"] == 3 and again["test"] == result["test"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--set", "optim.warmup_steps=abc"], "expected int"),
        (["--set", "optim.bogus=1"], "unknown field"),
        (["--data", "nosuch:x"], "unknown data source"),
        (["--recipe", "nope"], "unknown recipe"),
        (["--model", "vit_q16"], "unknown model"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["train", "--out", str(tmp_path / "r"), *flags]) == 2
    assert message in capsys.readouterr().err


def test_default_request_picks_the_digits_recipe_and_names_the_run(tmp_path: Path, monkeypatch) -> None:
    """Two runs started in the same second took one name, and the second was refused as using another's."""
    import datetime

    from vitkit.train import resolve as resolving

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 28, 9, 30, 0)

    monkeypatch.setattr(resolving.datetime, "datetime", Frozen)
    resolved = resolve(Request(runs_root=str(tmp_path)))
    assert resolved.config.recipe == "small-8px" and resolved.config.data.uri == "digits"
    assert Path(resolved.config.run.out) == tmp_path / "digits-vit-d64-l4-p4-20261128-093000"
    again = resolve(Request(runs_root=str(tmp_path)))
    assert Path(again.config.run.out) == tmp_path / "digits-vit-d64-l4-p4-20261128-093000-2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(r.config.run.out).name for r in (resolved, again)]
    big = resolve(Request(model="vit_b16", out="x"))
    assert big.config.model.img_size == 16 and big.config.model.num_classes == 10 and big.config.model.in_chans == 1
    assert any("from scratch" in w for w in big.warnings)


def test_a_muon_recipe_trains_a_bit_resnet_with_its_adamw_part() -> None:
    recipe = resolve(Request(recipe="small-28px", out="x")).config.optim  # Muon for the encoder's matrices
    resnet = resolve(Request(recipe="small-28px", model="bit_r50x1", out="x")).config.optim
    hybrid = resolve(Request(recipe="small-28px", model="r26_vit_s32", out="x")).config.optim
    assert recipe.name == "muon" and hybrid == recipe  # a hybrid has encoder matrices
    assert resnet.name == "adamw" and (resnet.lr, resnet.weight_decay, resnet.schedule) == (
        recipe.lr,
        recipe.weight_decay,
        recipe.schedule,
    )
    asked = resolve(Request(recipe="small-28px", model="bit_r50x1", overrides=("optim.name=muon",), out="x"))
    assert asked.config.optim.name == "muon"  # an explicit request is the user's (the optimiser refuses it, saying why)


def test_the_final_line_says_when_the_step_count_was_an_estimate() -> None:
    from types import SimpleNamespace

    from vitkit.cli.training import _final_line

    config = SimpleNamespace(eval=SimpleNamespace(final_split="test"), mpp=None)
    final = {"top1": 0.5, "top5": 0.9, "count": 10}
    result = {"status": "time_budget", "step": 427, "steps": 294, "wall_minutes": 2.87, "run_dir": "r", "test": final}
    budget_alone = _final_line({**result, "plan": {"steps_given": False}}, config)
    assert "after 427 (~294 estimated) steps, 2.87 min (time budget spent); run: r" in budget_alone
    # a resumed invocation's estimate is of its own warm-up, not of the run: "after 854 (~129 estimated) steps"
    resumed = _final_line({**result, "plan": {"steps_given": False, "start_step": 40}}, config)
    assert "after 427 steps, 2.87 min (time budget spent)" in resumed
    # "after 328 steps, 0.12 min" of a re-run of a 2-minute run: this invocation's minutes only
    whole = _final_line({**result, "minutes": 2.01, "plan": {"steps_given": False, "start_step": 40}}, config)
    assert "after 427 steps, 2.87 min this time with its start-up, 2.01 min of training in all (time budget" in whole
    assert "after 427/294 steps" in _final_line({**result, "plan": {"steps_given": True}}, config)
    capped = {**result, "step": 1125, "steps": 46875, "plan": {"steps_given": True}}  # the budget ended it first
    assert "after 1125 of at most 46875 steps, 2.87 min (time budget spent)" in _final_line(capped, config)
    # a fitted budget ends its schedule annealed before the recipe's cap: "after 72/607 steps" read as stopped at 12%
    annealed = {**capped, "status": "finished", "step": 72, "steps": 607}
    budget = {"steps_given": True, "budget_minutes": 3.0, "budget_schedule": "fit"}
    line = _final_line({**annealed, "plan": budget}, config)
    assert "after 72 (the schedule fitted to the time budget; at most 607) steps, 2.87 min; run: r" in line
    assert "after 72/607 steps" in _final_line({**annealed, "plan": {"steps_given": True}}, config)  # no budget
    stopped = {"status": "interrupted", "step": 163, "steps": 9469, "run_dir": "r"}  # 9469: the recipe's epochs
    fitted = _final_line({**stopped, "plan": {"budget_minutes": 3.0, "budget_schedule": "fit"}}, config)
    assert fitted.startswith("interrupted at step 163 of at most 9469 (the time budget ends the schedule); ")
    assert _final_line({**stopped, "plan": {}}, config).startswith("interrupted at step 163/9469; checkpoint saved")
    # the budget alone sets the length: "interrupted at step 43 of at most 37" read as past a cap; it is an estimate
    estimated = {**stopped, "step": 43, "steps": 37}
    budget_alone = {"budget_minutes": 1.5, "budget_schedule": "fit", "steps_given": False}
    line = _final_line({**estimated, "plan": budget_alone}, config)
    assert line.startswith("interrupted at step 43 (~37 estimated; the time budget ends the schedule); ")
    resumed = _final_line({**estimated, "plan": {**budget_alone, "start_step": 20}}, config)
    assert resumed.startswith("interrupted at step 43 (the time budget ends the schedule); ")


def test_data_a_classifier_cannot_learn_from_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """One class (nothing to tell apart) and --labels-per-class 0 (no labels) stop before training, one line."""
    one = class_npz(tmp_path / "one.npz", classes=1)
    out = tmp_path / "run"
    assert main(["train", "--data", f"npz:{one}", "--recipe", "small-8px-tiny", "--out", str(out)]) == 2
    assert "1 class" in capsys.readouterr().err and not out.exists()
    four = class_npz(tmp_path / "four.npz")
    assert main(["train", "--data", f"npz:{four}", "--labels-per-class", "0", "--out", str(out)]) == 2
    assert "--labels-per-class" in capsys.readouterr().err and not out.exists()


def test_a_batch_larger_than_the_training_split_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--batch-size 5000 on 1,438 images made one step of 3.5 epochs; 10**8 died allocating 78 GB in a traceback."""
    out = tmp_path / "run"
    for flags in (["--batch-size", "5000"], ["--batch-size", "100000000"], ["--set", "data.batch_size=5000"]):
        assert main(["train", *flags, "--epochs", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "larger than the 1,438 training images" in err and "Traceback" not in err and not out.exists()
        assert "use --batch-size 1438 or less" in err  # as it can be typed: "1,438" is no integer to the flag


def test_the_final_line_names_the_k_it_measured() -> None:
    from types import SimpleNamespace

    from vitkit.cli.training import _final_line

    config = SimpleNamespace(eval=SimpleNamespace(final_split="test"), mpp=None)
    result = {"status": "done", "step": 4, "steps": 4, "wall_minutes": 0.1, "run_dir": "r", "plan": {}}
    three = _final_line({**result, "test": {"top1": 0.5, "top5": 1.0, "k": 3, "count": 10}}, config)
    assert "top-1 50.00%, top-3 100.00% on 10 images" in three
    stored = _final_line({**result, "test": {"top1": 0.5, "top5": 0.9, "count": 10}}, config)  # a record from before k
    assert "top-5 90.00%" in stored


def test_an_out_that_is_not_a_run_is_refused_and_kept(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--out at a model checkpoint (a converted timm model, a run's checkpoints/final) or a project's own
    config.json replaced that config.json with the run's; --out at a file ended in a FileExistsError traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", "num_classes": 10}\n')
    afile = tmp_path / "afile"
    afile.write_text("notes\n")
    for out, words in ((model, "is not a vitkit run"), (afile, "is a file")):
        assert main(["train", "--set", "data.steps=1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert words in err and "choose another --out" in err and "Traceback" not in err
    assert json.loads((model / "config.json").read_text())["architecture"] == "vit_tiny_patch16_224"
    listed = tmp_path / "listed"  # a config.json that is no JSON object: an AttributeError traceback
    listed.mkdir()
    (listed / "config.json").write_text("[1, 2]\n")
    assert main(["train", "--set", "data.steps=1", "--out", str(listed)]) == 2
    assert "config.json is not a JSON object of field groups: no vitkit run's config" in capsys.readouterr().err
    assert sorted(p.name for p in model.iterdir()) == ["config.json"] and afile.read_text() == "notes\n"


def test_a_run_whose_data_changed_is_not_resumed_on_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Photos added to a folder after a kill: the re-run resumed without a word, and 23 of its 34 test images
    had been training images (the class-stratified draw moves with every count).  With --labels-per-class the
    counts of the splits stay N a class while the N are drawn again: the source's own count is what is kept."""
    from vitkit.data.sources import describe

    data, out = class_npz(tmp_path / "d.npz"), tmp_path / "run"
    argv = ["train", "--data", f"npz:{data}", "--recipe", "small-8px-tiny", "--out", str(out), "--set", "data.steps=2"]
    for flags in ([], ["--labels-per-class", "5"]):
        class_npz(data)
        before = describe(f"npz:{data}").num_train
        assert main([*argv, *flags, "--out", str(out / "-".join(flags))]) == 0
        class_npz(data, n=90)
        capsys.readouterr()
        assert main([*argv, *flags, "--out", str(out / "-".join(flags))]) == 2
        err = capsys.readouterr().err
        after = describe(f"npz:{data}").num_train
        assert f"holds {after} training images, {before} when this run started" in err and "--out" in err, err
    class_npz(data)  # the data as it was: the run resumes (and, finished, evaluates again)
    assert main([*argv, "--labels-per-class", "5", "--out", str(out / "--labels-per-class-5")]) == 0


def test_a_file_that_decodes_now_is_no_other_data(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A truncated photo repaired between two invocations changed the decoded split's count, not its files:
    the resume was refused as other data."""
    from PIL import Image

    root = tmp_path / "photos"
    for k in range(2):
        (root / f"c{k}").mkdir(parents=True)
        for i in range(10):
            Image.new("L", (8, 8), 20 * i + 100 * k).save(root / f"c{k}" / f"{i}.png")
    good = (root / "c0" / "3.png").read_bytes()
    (root / "c0" / "3.png").write_bytes(good[:20])
    argv = ["train", "--data", f"folder:{root}", "--recipe", "small-8px-tiny", "--out", str(tmp_path / "run")]
    argv += ["--set", "data.steps=2", "--set", "model.in_chans=3"]
    assert main(argv) == 0
    (root / "c0" / "3.png").write_bytes(good)
    assert main(argv) == 0, capsys.readouterr().err


def test_under_torchrun_other_ranks_do_not_repeat_the_datas_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process reads the data: "skipping bad image" came once from each."""
    import logging

    from vitkit.cli.training import LOADING_LOGGERS, quiet_other_ranks

    for name in ("vitkit", *(f"vitkit.data.{name}" for name in LOADING_LOGGERS)):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not quiet_other_ranks()
    assert not logging.getLogger("vitkit.data.images").isEnabledFor(logging.WARNING)
    # a damaged shard where every process meets it: scanning the labels, or reading every shard into memory
    assert not logging.getLogger("vitkit.data.tarshards.loading").isEnabledFor(logging.WARNING)
    assert logging.getLogger("vitkit.train.trainer").isEnabledFor(logging.WARNING)  # a rank's own problems
    for own in ("vitkit.data.loader", "vitkit.data.stream", "vitkit.data.tarshards"):  # its share of the batches
        assert logging.getLogger(own).isEnabledFor(logging.WARNING)
    monkeypatch.setenv("RANK", "0")
    assert quiet_other_ranks()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("optim.end_lr_fraction=-1", "end_lr_fraction in [0, 1]"),  # the lr ended at -0.004: gradient ascent
        ("optim.base_batch_size=-8", "base_batch_size >= 0"),  # the plan printed "(32/-8)"
        ("optim.eps=0", "eps > 0"),  # stopped on a NaN loss blaming the learning rate
        ("data.std=-1", "std must be > 0"),  # trained on inverted inputs
        ("data.std=0,0,0", "std must be > 0"),
        ("data.epochs=1e300", "epochs <= 1e+06"),  # planned 4.5e299 steps
        ("data.steps=99999999999999999999", "steps <= 1e+09"),  # a warm-up of 2.7e22 steps: the lr stayed at 0
        ("run.max_minutes=1e308", "max_minutes) must be <= 1e+06"),  # an OverflowError traceback
        ("run.max_minutes=1e20", "max_minutes) must be <= 1e+06"),  # planned 4.8e22 epochs
        ("eval.every_epochs=-1", "eval.every_epochs must be >= 0"),  # named batch_size too
        ("eval.batch_size=0", "eval.batch_size must be >= 1"),  # failed after the whole run, in the final evaluation
        ("run.threads=-2", "run.threads >= 0"),
        ("run.seed=99999999999999999999", "seed < 2**32"),
        (
            "run.seed=9223372036854775807",
            "seed < 2**32",
        ),  # "Overflow when unpacking long long" once multiplied
        ("optim.betas=0.9,1.5", "betas and momentum must be in [0, 1)"),
    ],
)
def test_nonsense_settings_are_refused_before_anything_runs(setting: str, message: str, tmp_path, capsys) -> None:
    assert main(["train", "--out", str(tmp_path / "r"), "--set", setting]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--out", "R", "--set", "run.out=elsewhere"],  # the run went to elsewhere
        ["--epochs", "1", "--set", "data.epochs=3"],
        ["--max-minutes", "0", "--set", "run.max_minutes=0.05"],
        ["--compile", "--set", "run.compile=off"],  # trained eagerly, --compile dropped
    ],
)
def test_a_flag_and_a_set_of_the_same_field_are_refused(flags: list[str], tmp_path, capsys) -> None:
    """--set silently won over the flag it contradicts."""
    flags = [str(tmp_path / "r") if flag == "R" else flag for flag in flags]
    assert main(["train", *flags]) == 2
    assert "were both given, and one would be dropped; give one of them" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        ["--warmup-steps", "3", "--set", "optim.warmup_steps=4"],  # the plan said warmup 4
        ["--corrupt-rate", "0.3", "--set", "mpp.corrupt_rate=0.4"],  # config.json held 0.4
        ["--target", "pixels", "--set", "mpp.target=downsampled"],
        ["--replace", "0.8", "0.2", "0", "--set", "mpp.replace=0.6,0.2,0.2"],
    ],
)
def test_pretrain_mpp_s_own_flags_and_a_set_of_the_same_field_are_refused(flags, tmp_path, capsys) -> None:
    assert main(["pretrain-mpp", "--out", str(tmp_path / "r"), *flags]) == 2
    assert "were both given, and one would be dropped" in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "optim.lr=0.1", "--set", "optim.lr=0.2"], "--set optim.lr was given more than once"),
        (
            ["--epochs", "1", "--set", "data.steps=5"],
            "data.steps both give the run's length (steps count where both are set): give one",
        ),
    ],
)
def test_a_field_given_twice_is_refused(flags: list[str], message: str, tmp_path, capsys) -> None:
    """The last --set of a key won, and data.steps over --epochs, without a word."""
    assert main(["train", "--out", str(tmp_path / "r"), *flags]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("rate", [["--lr", "0.1"], ["--set", "optim.lr=0.1"]])
@pytest.mark.parametrize("sweep", [["--lr-sweep"], ["--set", "optim.lr_sweep=0.01,0.03"]])
def test_a_learning_rate_with_lr_sweep_is_refused(rate: list[str], sweep: list[str], tmp_path, capsys) -> None:
    """The sweep picked among optim.lr_sweep and dropped the rate given beside it without a word."""
    assert (
        main(["finetune", str(tmp_path / "none"), "--data", "digits", *sweep, *rate, "--out", str(tmp_path / "r")]) == 2
    )
    assert "--lr-sweep picks the learning rate among optim.lr_sweep" in capsys.readouterr().err


@pytest.mark.parametrize(
    "verb, flags",
    [
        ("pretrain-mpp", ["--lr", "1e-3", "--set", "optim.lr=5e-4"]),  # trained at 5e-4 without a word
        ("train", ["--image-column", "img", "--set", "data.image_column=thumb"]),
    ],
)
def test_the_flags_applied_outside_resolve_are_checked_against_set_too(verb, flags, tmp_path, capsys) -> None:
    assert main([verb, "--out", str(tmp_path / "r"), *flags]) == 2
    assert "were both given, and one would be dropped" in capsys.readouterr().err


def test_an_out_below_a_file_is_named_in_a_sentence(tmp_path, capsys) -> None:
    """The error was Python's "[Errno 20] Not a directory: 'afile/sub'"."""
    (tmp_path / "afile").write_text("")
    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "afile" / "sub")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'afile' / 'sub'}: Not a directory" in err and "[Errno" not in err


@pytest.mark.parametrize("verb", [["train", "--epochs", "1"], ["shard", "digits", "--samples-per-shard", "100"]])
def test_an_empty_out_is_refused(verb: list[str], tmp_path, capsys, monkeypatch) -> None:
    """`--out ''` (an unset shell variable) trained into a default directory without a word."""
    monkeypatch.chdir(tmp_path)
    assert main([*verb, "--out", ""]) == 2
    assert "--out is empty" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_an_empty_model_is_refused(tmp_path, capsys, monkeypatch) -> None:
    """`--model ''` trained the recipe's model without a word, where `--recipe ''` is refused."""
    assert main(["train", "--epochs", "1", "--model", "", "--out", str(tmp_path / "r")]) == 2
    assert "--model is empty: give a model name" in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_a_rename_error_names_both_paths() -> None:
    """os.replace's error names the destination second: dropping it named only a temporary that is gone."""
    from vitkit.cli import _sentence

    error = OSError(errno.EISDIR, "Is a directory", "rep/.eval.json.ab12.tmp", None, "rep/eval.json")
    assert _sentence(error) == "rep/.eval.json.ab12.tmp -> rep/eval.json: Is a directory"


def test_under_torchrun_a_run_needs_its_out(tmp_path: Path) -> None:
    """Each process named the run by its own clock's second: two directories where the start-up crossed one."""
    with pytest.raises(ValueError, match=r"under torchrun \(2 processes\) give --out"):
        resolve(Request(data="digits", world=2, runs_root=str(tmp_path)))
    assert not any(tmp_path.iterdir())
    assert Path(resolve(Request(data="digits", runs_root=str(tmp_path))).config.run.out).parent == tmp_path


def test_a_model_too_large_an_image_to_train_is_refused_before_it_is_built(tmp_path, capsys) -> None:
    """`vitkit train --img-size 16384` on digits built a 1.07-billion-parameter model (its position embeddings)
    and trained it until killed; `vitkit eval` refused the same --img-size by the work of one image."""
    assert main(["train", "--img-size", "16384", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the model to train: one 16384-px image through this model would take" in err
    assert "choose a smaller --img-size or model" in err and not (tmp_path / "r").exists()


def test_a_run_whose_classes_changed_is_not_resumed_on_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A class folder replaced by another after a kill (the count of classes and images alike): the re-run resumed,
    and each output went on learning another class (airplane's became the new class's) without a word."""
    import numpy as np

    data, out = class_npz(tmp_path / "d.npz"), tmp_path / "run"
    with np.load(data) as arrays:
        images, labels = arrays["images"], arrays["labels"]
    np.savez(data, images=images, labels=labels, class_names=np.array(["ant", "bee", "cat", "dog"]))
    argv = ["train", "--data", f"npz:{data}", "--recipe", "small-8px-tiny", "--out", str(out), "--set", "data.steps=2"]
    assert main(argv) == 0
    np.savez(data, images=images, labels=labels, class_names=np.array(["ant", "bee", "cat", "eel"]))
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"npz:{data}'s classes differ from those this run started with (dog, eel)" in err and "--out" in err, err


def test_the_annealed_line_calls_a_cap_a_cap_and_an_estimate_an_estimate(caplog) -> None:
    from vitkit.train import finish

    with caplog.at_level(logging.INFO, logger="vitkit.train.trainer"):
        finish.log_end("finished", 0, 72, 607, 3.0, given=True)  # the recipe's 100 epochs: a cap, not an estimate
        finish.log_end("finished", 0, 72, 80, 3.0, given=False)  # the budget alone: its estimate
    assert [r.getMessage() for r in caplog.records] == [
        "time budget: schedule annealed at step 72 (at most 607)",
        "time budget: schedule annealed at step 72 (about 80)",
    ]
