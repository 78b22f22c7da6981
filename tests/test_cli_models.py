"""`vitkit models`: every preset with its golden parameter count, Table 1 columns and GFLOPs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vitkit.models.flops as flops
from vitkit.cli import main
from vitkit.models.configs import PRESETS, ViTConfig

GOLDEN = json.loads((Path(__file__).parent / "golden" / "param_counts.json").read_text())["presets"]


def run_json(capsys, *flags: str) -> list[dict]:
    assert main(["models", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["models"]


@pytest.fixture
def fast_flops(monkeypatch):
    """Tracing the FLOPs of every ResNet and hybrid takes ~10 s of CPU and tests/bench/test_flops.py checks the
    counter, so these tests report 0 for non-ViT families; test_json_real_flops_for_a_hybrid runs the real one."""
    monkeypatch.setattr(
        flops, "model_flops", lambda c, s=None: flops.vit_flops(c, s) if isinstance(c, ViTConfig) else 0
    )


def pick(rows: list[dict], name: str) -> dict:
    return {row["name"]: row for row in rows}[name]


def test_json_lists_every_preset_with_golden_params(capsys, fast_flops):
    rows = run_json(capsys)
    assert [row["name"] for row in rows] == list(PRESETS)
    for row in rows:
        config = PRESETS[row["name"]]
        assert row["params"] == GOLDEN[row["name"]]["params"], row["name"]
        assert row["img_size"] == 224
        if isinstance(config, ViTConfig):
            assert (row["layers"], row["hidden"], row["mlp"], row["heads"]) == (
                config.depth,
                config.hidden_size,
                config.mlp_dim,
                config.num_heads,
            )
            assert row["gflops"] == round(flops.vit_flops(config) / 1e9, 2)
    by_name = {row["name"]: row for row in rows}
    assert by_name["vit_b16"]["gflops"] == 35.13
    assert by_name["bit_r50x1"]["layers"] == "-"
    assert by_name["r50_vit_b16"]["hidden"] == 768


def test_json_real_flops_for_a_hybrid(capsys):
    (row,) = run_json(capsys, "--filter", "r26_vit_s32")
    assert row["params"] == 36_431_912  # official R26+ViT-S_32
    assert row["gflops"] == round(flops.counted_flops(PRESETS["r26_vit_s32"]) / 1e9, 2) > 0


def test_num_classes_changes_the_head_only(capsys, fast_flops):
    row = pick(run_json(capsys, "--filter", "vit_b16", "--num-classes", "10"), "vit_b16")
    assert row["params"] == 86_567_656 - 990 * (768 + 1)


def test_text_table(capsys, fast_flops):
    assert main(["models", "--filter", "vit_ti1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "layers", "hidden", "mlp", "heads", "params", "img", "GFLOPs"]
    assert lines[2].split() == ["vit_ti16", "12", "192", "768", "3", "5,717,416", "224", "2.51"]


def test_bad_num_classes_is_a_clear_error(capsys, fast_flops):
    assert main(["models", "--filter", "vit_b16", "--num-classes", "-1"]) == 2
    assert "num_classes must be an integer in [0, 1048576], got -1" in capsys.readouterr().err


def test_img_size_flag(capsys, fast_flops):
    row = pick(run_json(capsys, "--filter", "vit_b16", "--img-size", "384"), "vit_b16")
    assert row["img_size"] == 384 and row["params"] == 86_567_656 + (577 - 197) * 768  # E_pos for 24x24 + 1 tokens
    assert row["gflops"] == round(flops.vit_flops(PRESETS["vit_b16"], 384) / 1e9, 2)


def test_flags_are_matched_whole_and_the_version_is_the_packages(capsys) -> None:
    """`--e 1` is an unknown flag (argparse would take it for --epochs), and --version says the package's release,
    the installed one's where vitkit is installed (not where it runs from a source tree on PYTHONPATH)."""
    from importlib.metadata import PackageNotFoundError, version

    import vitkit

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--e", "1"])
    assert exit_.value.code == 2 and "unrecognized arguments: --e" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # the verb's usage (it had been vitkit's), and the flag meant
        main(["train", "--max-mintues=1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: vitkit train") and "(did you mean --max-minutes?)" in err
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"vitkit {vitkit.__version__}"
    try:
        assert version("vitkit") == vitkit.__version__
    except PackageNotFoundError:
        pass


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--max-minutes", "nan"],
        ["train", "--lr", "inf"],
        ["pretrain-mpp", "--corrupt-rate", "nan"],
        ["train", "--lr", "abc"],  # said "invalid finite_float value", a function's name
        ["train", "--max-minutes", ""],
    ],
)
def test_a_number_flag_takes_only_finite_numbers(argv: list[str], capsys) -> None:
    """argparse's float takes "nan" and "inf"; `--max-minutes nan` then trained with no budget at all."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and "expected a finite number" in capsys.readouterr().err


def test_a_negative_budget_says_what_zero_means(tmp_path, capsys) -> None:
    assert main(["train", "--max-minutes", "-1", "--out", str(tmp_path / "run")]) == 2
    assert "--max-minutes (run.max_minutes) must be >= 0 (0: no budget), got -1" in capsys.readouterr().err


def test_an_error_under_torchrun_names_the_process_that_hit_it(tmp_path, monkeypatch, capsys) -> None:
    """Every process of a torchrun job prints its own error (one may hit it alone); each line says which."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--max-minutes", "-1", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith("vitkit train: error (process 1 of 2): --max-minutes")


def test_python_m_vitkit_under_torchruns_variables_exits_with_the_commands_status(tmp_path) -> None:
    """Under torchrun the command ends through distributed.leave (os._exit after the exit handlers): the
    output still arrives whole and the status is the command's."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}  # a one-process launch: no process group to join
    listed = subprocess.run(
        [sys.executable, "-m", "vitkit", "models"], capture_output=True, text=True, env=env, timeout=120
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert listed.stdout.splitlines()[0].split()[0] == "name" and "vit_h14" in listed.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "vitkit", "train", "--max-minutes", "-1", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert refused.returncode == 2 and "--max-minutes (run.max_minutes) must be >= 0" in refused.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "vitkit", "train", "--bogus"], capture_output=True, text=True, env=env
    )
    assert usage.returncode == 2 and "unrecognized arguments: --bogus" in usage.stderr  # argparse's own exit
    crash = "import vitkit.cli as cli; cli.main = lambda *a, **k: 1 / 0; cli._entry()"
    crashed = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, env=env, timeout=120)
    assert crashed.returncode == 1 and "ZeroDivisionError" in crashed.stderr  # the traceback, then status 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "RUN", "--img-size", "100000"], "--img-size: expected an integer from 1 to 16,384"),
        (["train", "--img-size", "0"], "--img-size: expected an integer from 1 to 16,384"),  # 0 read as not given
        (["predict", "RUN", "x.jpg", "--img-size", "0"], "--img-size: expected an integer from 1 to 16,384"),
        (["embed", "RUN", "--data", "digits", "--out", "e.npy", "--batch-size", "0"], "--batch-size: expected"),
        (["eval", "RUN", "--max-images", "-5"], "--max-images: expected an integer from 1"),
        (["fewshot", "RUN", "--data", "digits", "--max-test", "0"], "--max-test: expected an integer from 1"),
        (["fewshot", "RUN", "--data", "digits", "--seeds", "0"], "--seeds: expected an integer from 1"),
        (["inspect", "RUN", "--num-images", "0"], "--num-images: expected an integer from 1"),
        (["train", "--batch-size", "0"], "--batch-size: expected an integer from 1"),  # named micro_batch_size
        (["train", "--seed", "9223372036854775807"], "--seed: expected an integer from 0 to 4,294,967,295"),
        (["shard", "digits", "--out", "o", "--samples-per-shard", "9", "--workers", "-1"], "--workers: expected"),
    ],
)
def test_integer_flags_are_bounded_where_they_are_parsed(argv: list[str], message: str, capsys) -> None:
    """--img-size 100000 asked the allocator for 2.5 TB (predict was killed), --batch-size 0 and --opset 24 ended
    in tracebacks, --max-images -5 evaluated 354 images and --max-test 0 printed NaN as JSON."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "error, message",
    [
        (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 2500000000000 bytes."), "memory"),
        (OSError(28, "No space left on device", "/mnt/run/m.safetensors"), "device: '/mnt/run/m.safetensors'); free"),
        (RuntimeError("unable to write to file </torch_81_2>: No space left on device (28)"), "data.workers=0"),
        (MemoryError(), "memory"),
        (OSError(30, "Read-only file system", "/mnt/ro/run/metrics.jsonl"), "/mnt/ro/run/metrics.jsonl: Read-only"),
        (OSError(5, "Input/output error", "/nfs/run"), "/nfs/run: Input/output error (the storage reported an I/O"),
    ],
)
def test_running_out_of_memory_or_disk_is_one_error_line(error, message, monkeypatch, capsys) -> None:
    """Both ended in tracebacks (a full disk while a checkpoint was written: SafetensorError)."""
    import vitkit.cli.tools as tools

    def fail(args):
        raise error

    monkeypatch.setattr(tools, "_list_models", lambda: fail(None))
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert ("/dev/shm" in err) == ("data.workers=0" in message)  # a full disk is not said to be shared memory


def test_an_opset_newer_than_torch_exports_is_named(tmp_path, capsys) -> None:
    import vitkit
    from vitkit.checkpoints.onnx_export import newest_opset

    pytest.importorskip("onnx")
    if newest_opset() is None:
        pytest.skip("this torch does not say its newest opset")
    vitkit.save(vitkit.create_model("vit_ti16", img_size=16, num_classes=2), tmp_path / "m")
    assert main(["export-onnx", str(tmp_path / "m"), str(tmp_path / "x.onnx"), "--opset", "9999"]) == 2
    assert f"newer than this torch exports: use 17 to {newest_opset()}" in capsys.readouterr().err


def test_an_error_raised_again_from_a_dataloader_worker_is_its_own_line(monkeypatch, capsys) -> None:
    """torch raises a worker's error again with the worker's whole traceback as its message: a damaged shard
    read with data.workers=2 printed "Caught ShardLayoutError in DataLoader worker process 0." and the trace."""
    import vitkit.cli.tools as tools

    worker = (
        "Caught ShardLayoutError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    g()\nvitkit.data.tarsamples.ShardLayoutError: a.tar: the files of '
        "sample 'k' are not adjacent\n"
    )

    def fail():
        raise ValueError(worker)

    monkeypatch.setattr(tools, "_list_models", fail)
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert err == "vitkit models: error: a.tar: the files of sample 'k' are not adjacent\n"


def test_a_torchrun_peer_that_ended_is_one_line_naming_the_resume(monkeypatch, capsys) -> None:
    """Rank 0 printed a whole traceback ending in gloo's "Connection reset by peer" when rank 1 was killed."""
    import vitkit.cli as cli
    import vitkit.cli.tools as tools

    def fail():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:62511: Connection reset by peer")

    monkeypatch.setattr(tools, "_list_models", fail)
    monkeypatch.setattr(cli, "DISTRIBUTED", (*cli.DISTRIBUTED, "models"))  # standing in for a training verb
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["models"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit models: error (process 0 of 2): another process of this torchrun job ended")
    assert "re-run the same command to resume it" in err and "Traceback" not in err
    monkeypatch.setenv("WORLD_SIZE", "1")  # alone, the same words are no peer's: not explained away
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        main(["models"])


def test_a_brace_range_the_shell_expanded_is_named(capsys) -> None:
    """`--data wds:DIR/train-{000000..000001}.tar` unquoted reaches vitkit as two words: argparse said only
    "unrecognized arguments: wds:DIR/train-000001.tar"."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", "wds:d/train-000000.tar", "wds:d/train-000001.tar"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments: wds:d/train-000001.tar" in err
    assert "the shell expanded a {a..b} range or {a,b} list in --data into several words: quote the URI" in err
    for argv in (["train", "cifar10:/data/cifar"], ["train", "--data", "digits", "https://example.com/x"]):
        with pytest.raises(SystemExit):  # a forgotten --data, a stray word: no brace hint
            main(argv)
        assert "the shell expanded" not in capsys.readouterr().err


def test_an_interrupted_study_says_a_re_run_goes_on(monkeypatch, capsys) -> None:
    """Ctrl-C outside an arm's training (its data loading, between arms) printed only "interrupted", with no
    word that the finished arms are kept and the same command goes on."""
    from vitkit.cli import studies

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(studies, "run_reproduce", interrupted)
    assert main(["reproduce", "posemb", "--data", "digits"]) == 130
    assert capsys.readouterr().err.strip() == (
        "vitkit reproduce: interrupted; re-run the same command to go on from what it saved"
    )


def test_an_interrupted_shard_says_a_re_run_starts_over(monkeypatch, capsys, tmp_path) -> None:
    """`vitkit shard` said a re-run would "go on from what it saved"; it starts over, as its marker file says."""
    from vitkit.data import shard

    def interrupted(uri, out, *args, **kwargs):
        Path(out).mkdir()
        (Path(out) / "train-000000.tar").write_bytes(b"")  # a shard written before the Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(shard, "write_shards", interrupted)
    assert main(["shard", "digits", "--out", str(tmp_path / "o"), "--samples-per-shard", "9"]) == 130
    assert capsys.readouterr().err.strip() == "vitkit shard: interrupted; re-run the same command to start it over"


NOTHING_SAVED = "vitkit train: interrupted before its first checkpoint: a re-run starts it over"


def test_an_interrupted_run_that_saved_nothing_says_so(monkeypatch, capsys, tmp_path) -> None:
    """Ctrl-C while the data loaded said "re-run the same command to go on from what it saved": nothing was."""
    from vitkit.cli import training

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "run_train", interrupted)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip() == NOTHING_SAVED
    out.mkdir()  # its config and first metrics, but no checkpoint: a re-run starts over
    (out / "config.json").write_text("{}")
    assert main(["train", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip() == NOTHING_SAVED
    (out / "checkpoints" / "step_0000010").mkdir(parents=True)  # a step whose writing was cut: no LATEST yet
    assert main(["train", "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip() == NOTHING_SAVED
    trial = out / "sweep" / "lr_0.01"
    (trial / "checkpoints").mkdir(parents=True)
    import vitkit

    vitkit.save(vitkit.create_model("vit_ti16", img_size=8, patch_size=4, num_classes=2), trial / "checkpoints" / "s")
    (trial / "checkpoints" / "s").rename(trial / "checkpoints" / "step_0000010")
    (trial / "checkpoints" / "LATEST").write_text("step_0000010\n")  # a sweep's first trial, saved
    assert main(["train", "--out", str(out)]) == 130
    assert "re-run the same command to go on from what it saved" in capsys.readouterr().err


def test_vitkit_traceback_shows_where_a_one_line_error_came_from(capsys, fast_flops, monkeypatch):
    """An error a user can fix is one line; a bug that raises a ValueError read the same, with nothing to find it
    by.  VITKIT_TRACEBACK=1 prints the traceback before the line."""
    assert main(["models", "--filter", "vit_b16", "--num-classes", "-1"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("VITKIT_TRACEBACK", "1")
    assert main(["models", "--filter", "vit_b16", "--num-classes", "-1"]) == 2
    err = capsys.readouterr().err
    lines = err.rstrip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "num_classes must be" in lines[-2]
    assert lines[-1].startswith("vitkit models: error: num_classes must be")


def test_a_verb_of_one_process_is_refused_under_torchrun(capsys, fast_flops, monkeypatch):
    """`torchrun --nproc-per-node 2 -m vitkit eval ...` evaluated the whole split in each process and printed
    and wrote every line twice."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert main(["models", "--filter", "vit_b16"]) == 2
    err = capsys.readouterr().err
    assert "vitkit models runs in one process: run it without torchrun" in err and "(process 1 of 2)" in err


def test_a_file_where_a_directory_is_to_be_made_is_named_so(tmp_path, capsys):
    """`vitkit eval RUN --out afile` and `vitkit shard --out afile` said only "afile: File exists"."""
    afile = tmp_path / "afile"
    afile.write_text("notes\n")
    assert main(["shard", "digits", "--out", str(afile), "--samples-per-shard", "100"]) == 2
    assert f"{afile} already exists as a file: choose another path (--out)" in capsys.readouterr().err
    assert afile.read_text() == "notes\n"


def test_ctrl_c_while_the_command_loads_is_one_line(monkeypatch, capsys) -> None:
    """Ctrl-C in the seconds torch takes to import ended in a KeyboardInterrupt traceback from inside an import."""
    import importlib.abc
    import sys

    import vitkit.__main__ as entry

    class Interrupted(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "vitkit.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "vitkit.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupted(), *sys.meta_path])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130 and capsys.readouterr().err == "vitkit: interrupted\n"


def test_the_root_package_loads_its_public_names_when_used() -> None:
    """`import vitkit` imports no torch (the command's start-up, Ctrl-C); its public names are there when asked."""
    script = (
        "import sys, vitkit; before = 'torch' in sys.modules; names = set(dir(vitkit)); "
        "print(before, sorted(set(vitkit.__all__) - names), callable(vitkit.create_model), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False", "[]", "True", "True"], done.stderr


def test_a_filter_that_matches_no_model_is_said(capsys, fast_flops):
    """`--filter nomatch` printed the table's header alone and exited 0."""
    assert main(["models", "--filter", "vit_q16"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == "vitkit models: error: no model name contains 'vit_q16'; vitkit models lists all"
