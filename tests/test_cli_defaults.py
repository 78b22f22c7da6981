"""The command line states its flags' defaults itself (so that `vitkit --help` imports no torch); they must be the
defaults of the settings they fill, so that a command and a Python caller with no options do the same thing."""

from __future__ import annotations

import dataclasses

import pytest

from vitkit.cli import build_parser

COMMANDS = {  # command line -> (module, settings class, {field: flag's name where it differs})
    "eval ck --data digits": ("vitkit.eval.accuracy", "AccuracyConfig", {}),
    "fewshot ck --data digits": ("vitkit.eval.fewshot", "FewShotConfig", {}),
    "predict ck x.png": ("vitkit.eval.predict", "PredictConfig", {}),
    "inspect ck --out o": ("vitkit.inspect.report", "InspectConfig", {"num_components": "components"}),
    "bench": ("vitkit.bench.throughput", "BenchConfig", {}),
    "serve ck": ("vitkit.serve.config", "ServeConfig", {}),
}

SUBSTITUTED = {("serve ck", "max_pixels")}  # None -> the setting's default, by the command's own code


@pytest.mark.parametrize("line", list(COMMANDS))
def test_every_flag_default_is_its_settings_default(line: str) -> None:
    import importlib

    module, name, renamed = COMMANDS[line]
    settings = getattr(importlib.import_module(module), name)
    args, defaults = build_parser().parse_args(line.split()), settings()
    compared = []
    for field in dataclasses.fields(settings):
        flag = renamed.get(field.name, field.name)
        if not hasattr(args, flag):
            continue
        if getattr(args, flag) is None:  # None: the flag leaves the setting's default, which must be None too
            assert getattr(defaults, field.name) is None or (line, field.name) in SUBSTITUTED, field.name
            continue
        given, default = getattr(args, flag), getattr(defaults, field.name)
        if isinstance(default, tuple) and isinstance(given, str):  # "1,5,10,25" for (1, 5, 10, 25)
            given = tuple(type(default[0])(part) for part in given.split(","))
        assert given == default, f"vitkit {line.split()[0]}: --{flag.replace('_', '-')} defaults to {given!r}"
        compared.append(field.name)
    assert len(compared) >= 2, compared  # the flags are found under these names


def test_serve_with_no_flags_is_the_default_server(monkeypatch) -> None:
    from vitkit.cli.serving import serve_config
    from vitkit.serve.config import ServeConfig

    monkeypatch.delenv("VITKIT_SERVE_TOKEN", raising=False)
    assert serve_config(build_parser().parse_args(["serve", "ck"])) == ServeConfig()


def test_flags_named_other_than_their_settings_default_to_them() -> None:
    import inspect

    from vitkit.bench.throughput import BenchConfig
    from vitkit.checkpoints.onnx_export import verified_export
    from vitkit.eval.commands import embed_command
    from vitkit.inspect.report import InspectConfig, inspect_command

    parse = build_parser().parse_args
    assert parse(["inspect", "ck", "--out", "o"]).no_figures is (not InspectConfig().draw)
    assert parse(["bench"]).mode == "both" and BenchConfig().modes == ("inference", "training")
    embed = parse(["embed", "ck", "--data", "digits", "--out", "o"])
    keywords = inspect.signature(embed_command).parameters
    assert [getattr(embed, name) for name in ("img_size", "batch_size", "device")] == [
        keywords[name].default for name in ("img_size", "batch_size", "device")
    ]
    shown = parse(["inspect", "ck", "--out", "o"])
    keywords = inspect.signature(inspect_command).parameters
    assert (shown.split, shown.num_images) == (keywords["split"].default, keywords["num_images"].default)
    assert (
        parse(["export-onnx", "ck", "o.onnx"]).opset == inspect.signature(verified_export).parameters["opset"].default
    )


def test_the_serving_guide_lists_every_flag_of_serve_with_its_default() -> None:
    """docs/serving.md's usage block had lost --max-bodies-mb, --max-pixels and --decode-workers."""
    import re
    from pathlib import Path

    from vitkit.serve.config import ServeConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    block = text[text.index("vitkit serve RUN_OR_CKPT") :].split("```")[0]
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = {option for action in serve._actions for option in action.option_strings if option.startswith("--")}
    assert flags - {"--help"} == set(re.findall(r"\[(--[a-z-]+)", block))
    defaults = ServeConfig()
    for flag, value in re.findall(r"\[(--[a-z-]+) (\d+(?:\.\d+)?)\]", block):
        default = getattr(defaults, flag[2:].replace("-", "_"))
        expected = max(256, 4 * defaults.max_body_mb) if flag == "--max-bodies-mb" else default  # its stated rule
        assert float(value) == expected, flag


def test_every_seed_flag_takes_the_same_seeds() -> None:
    """`train --seed` took 0 .. 2**32 - 1 and `shard --seed` 0 .. 2**63 - 1: one rule, written once."""
    import argparse

    from vitkit.train.config import MAX_SEED

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    seeded = {name: a for name, p in commands.items() for a in p._actions if a.dest == "seed"}
    assert {"train", "shard", "finetune", "pretrain-mpp"} <= set(seeded)
    for name, action in seeded.items():
        assert action.type(str(MAX_SEED)) == MAX_SEED and action.type("0") == 0, name
        for bad in (str(MAX_SEED + 1), "-1"):
            with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 4,294,967,295"):
                action.type(bad)
