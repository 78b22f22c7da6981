"""torch.compile in training: the phases compiled ahead, a warm-up that changes nothing, the compiler check."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_config
from safetensors.torch import load_file

from vitkit import host as hosts
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.train import compiled, trainer
from vitkit.train.budget import warm_up
from vitkit.train.schedule import Schedule


@pytest.mark.parametrize(
    ("rate", "until", "start", "expected"),
    [
        (0.5, 0.8, 0.0, [(0.5, 28), (0.0, 28)]),
        (0.5, 0.8, 0.85, [(0.0, 28)]),  # resumed after the PatchDropout phase
        (0.5, 0.8, 0.79, [(0.5, 28), (0.0, 28)]),
        (0.0, 0.8, 0.0, [(0.0, 28)]),  # no PatchDropout: the rate is 0 throughout
        (0.5, 1.0, 0.0, [(0.5, 28)]),  # never switched off
        (0.5, 0.0, 0.0, [(0.0, 28)]),  # switched off from the first step
    ],
)
def test_phases_follow_the_loops_rules(rate, until, start, expected) -> None:
    schedule = Schedule(total_steps=100, peak_lr=1.0, patch_dropout=rate, patch_until=until, side=28)
    assert schedule.phases(start=start) == expected
    # the loop reads each step's phase with the same rule
    steps = [schedule.at(step) for step in range(int(start * 100), 100)]
    assert sorted({(s.patch_dropout, s.side) for s in steps}, key=expected.index) == expected


def _vit() -> torch.nn.Module:
    return build_model(
        ViTConfig(
            img_size=16,
            patch_size=4,
            in_chans=1,
            num_classes=3,
            hidden_size=16,
            depth=1,
            num_heads=2,
            mlp_dim=32,
            pool="gap",
            dropout=0.1,
            patch_dropout=0.5,
        )
    )


def test_warm_up_runs_each_phase_and_leaves_no_trace() -> None:
    module = _vit().eval()
    seen: list[tuple[int, int, bool]] = []
    module.blocks[0].register_forward_pre_hook(
        lambda m, inputs: seen.append((inputs[0].shape[1], inputs[0].shape[0], m.training))
    )
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    torch.manual_seed(3)
    rng = torch.get_rng_state()

    def run_once(rate: float, side: int) -> None:
        module(torch.zeros(5, 1, side, side), patch_dropout=rate).float().sum().backward()

    _, timings = warm_up(module, [(0.5, 16), (0.0, 16), (0.0, 8)], run_once, torch.device("cpu"), timed=1)
    # 16 patches (8 kept under PatchDropout 0.5), then all 16, then 4 at 8 px; each twice (one untimed); training mode
    assert seen == [(8, 5, True)] * 2 + [(16, 5, True)] * 2 + [(4, 5, True)] * 2
    assert set(timings) == {(0.5, 16), (0.0, 16), (0.0, 8)} and all(t > 0 for t in timings.values())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in module.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in module.state_dict().items())
    assert not module.training


@pytest.fixture
def a_cpp_compiler(monkeypatch) -> None:
    """The decision weighs compile time only where a C++ compiler is found: these tests weigh it on a host
    without one too (they failed there, five of them, reading "no C++ compiler")."""
    monkeypatch.setattr(compiled, "cpp_compiler", lambda: "/usr/bin/c++")


def test_compiling_pays_for_itself_or_the_run_trains_eagerly(a_cpp_compiler) -> None:
    cpu = torch.device("cpu")
    at = {"graph_s": (30.0, "estimated")}  # 30 s a graph
    short = compiled.decide("auto", cpu, graphs=2, eager_step_s=0.5, steps=3, budget_s=None, **at)  # ~1.5 s
    assert short[0] is False and "compiling 2 graph(s) costs ~60 s" in short[1] and "run.compile=on forces" in short[1]
    # eager time t saves t (1 - 1/1.3) compiled: it pays from t > 60 / 0.2308 = 260 s
    assert compiled.decide("auto", cpu, graphs=2, eager_step_s=1.0, steps=250, budget_s=None, **at)[0] is False
    assert compiled.decide("auto", cpu, graphs=2, eager_step_s=1.0, steps=270, budget_s=None, **at)[0] is True
    budgeted = compiled.decide("auto", cpu, graphs=2, eager_step_s=1.0, steps=None, budget_s=600.0, **at)  # 10 min
    assert budgeted[0] is True and "saves ~2.3 min" in budgeted[1]
    assert compiled.decide("auto", cpu, graphs=2, eager_step_s=1.0, steps=10_000, budget_s=60.0, **at)[0] is False
    # a host that compiles at 71 s a graph: 3 minutes of eager training save ~42 s, less than one graph costs
    slow = compiled.decide("auto", cpu, graphs=1, eager_step_s=1.0, steps=None, budget_s=180.0, graph_s=(71.0, "m"))
    assert slow[0] is False and "costs ~71 s into a cold cache (m)" in slow[1]
    assert compiled.decide("off", cpu, graphs=1, eager_step_s=9.0, steps=10**6, budget_s=None) == (
        False,
        "run.compile=off",
    )
    assert compiled.decide("on", cpu, graphs=9, eager_step_s=0.0, steps=1, budget_s=None) == (True, "run.compile=on")


def test_the_compile_time_measured_on_this_host_class_is_remembered(tmp_path, monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert compiled.graph_seconds(cpu) == (compiled.COMPILE_SECONDS, "estimated")
    compiled.remember_graph_seconds(cpu, 71.04, cold=True)
    compiled.remember_graph_seconds(cpu, 12.0, cold=False)  # a warm cache's compile says nothing of a cold one
    assert compiled.graph_seconds(cpu) == (71.0, "measured on this host class")
    # the slowest compile ever seen was kept: one made under load (65 s where 15 is usual) held every later
    # decision at 65 s; the median of the last five cold compiles lets it go
    for seconds in (15.0, 16.0):
        compiled.remember_graph_seconds(cpu, seconds, cold=True)
    assert compiled.graph_seconds(cpu) == (16.0, "measured on this host class")  # median of 71, 15, 16
    for seconds in (14.0, 15.0, 17.0):
        compiled.remember_graph_seconds(cpu, seconds, cold=True)
    assert compiled.graph_seconds(cpu) == (15.0, "measured on this host class")  # 71 is no longer among the last 5
    (tmp_path / compiled.MEASURED_FILE).write_text('{"per_graph_s": 64.7}')  # the earlier file: one figure
    assert compiled.graph_seconds(cpu) == (64.7, "measured on this host class")
    (tmp_path / compiled.MEASURED_FILE).write_text('{"per_graph_s": "nonsense"}')
    assert compiled.graph_seconds(cpu) == (compiled.COMPILE_SECONDS, "estimated")
    (tmp_path / compiled.MEASURED_FILE).write_text('{"per_graph_s": -3}')
    assert compiled.graph_seconds(cpu) == (compiled.COMPILE_SECONDS, "estimated")


def test_unsupported_python_keeps_the_eager_model(monkeypatch) -> None:
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    on, why = compiled.decide("on", torch.device("cpu"), graphs=1, eager_step_s=1.0, steps=10**6, budget_s=None)
    assert not on and "not supported" in why


def test_no_compiler_keeps_the_eager_model(monkeypatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    on, why = compiled.decide("auto", torch.device("cpu"), graphs=1, eager_step_s=1.0, steps=10**6, budget_s=None)
    assert not on and "no C++ compiler" in why


def test_inductors_cache_is_kept_per_host_class(monkeypatch) -> None:
    from vitkit.host import default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    path = hosts.use_compile_cache(torch.device("cpu"))
    host = compiled.hosts.current()
    assert path.startswith(default_cache_dir()) and host.isa in path and torch.__version__.split("+")[0] in path
    assert ("nobf16" in path) is (not host.native_bf16) and os.environ["TORCHINDUCTOR_CACHE_DIR"] == path
    other_isa = "SVE256" if host.isa != "SVE256" else "NEON"
    monkeypatch.setattr(
        compiled.hosts, "current", lambda device=None: dataclasses.replace(host, isa=other_isa, native_bf16=False)
    )
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # torch writes its default back: still ours
    other = hosts.use_compile_cache(torch.device("cpu"))
    assert other != path and other.endswith(f"vitkit-{other_isa}-nobf16-" + torch.__version__.replace("+", "-"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/my-cache")  # the user's choice stands
    assert hosts.use_compile_cache(torch.device("cpu")) == "/tmp/my-cache"


def test_the_cache_directory_of_a_torch_release_without_cache_dir_utils(monkeypatch) -> None:
    """torch before 2.5 has no `torch._inductor.runtime.cache_dir_utils`: every compiled run (and bench --compile)
    died with ModuleNotFoundError there (seen with torch 2.4.1); its default directory is the temporary one's
    torchinductor_USER, which the host-class directory goes under."""
    import tempfile

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert hosts.default_cache_dir() == default_cache_dir()  # torch's own, where it has one
    monkeypatch.setitem(sys.modules, "torch._inductor.runtime.cache_dir_utils", None)  # import fails: an older torch
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(hosts.getpass, "getuser", lambda: "ada/lovelace")
    older = os.path.join(tempfile.gettempdir(), "torchinductor_ada_lovelace")
    assert hosts.default_cache_dir() == older
    assert hosts.use_compile_cache(torch.device("cpu")).startswith(older + os.sep + "vitkit-")


def test_a_short_run_decides_not_to_compile_and_says_why(tmp_path: Path, a_cpp_compiler) -> None:
    # the cost is this host class's stored measurement where one exists: seconds, or minutes from 60 s
    result = trainer.train(tiny_config(tmp_path / "run", "data.steps=3", "run.compile=auto"))
    plan = result["plan"]
    assert result["status"] == "finished" and plan["compiled"] is False
    assert re.match(
        r"auto: ~\d+ s of eager training.* costs ~[\d.]+ (s|min) into a cold cache "
        r"\((estimated|measured on this host class)\)",
        plan["compile_reason"],
    ), plan["compile_reason"]


def test_the_compile_decision_weighs_the_budget_left_after_start_up(tmp_path: Path, a_cpp_compiler) -> None:
    """It weighed the whole --max-minutes: a run whose data took most of a budget to load could compile for
    longer than it had left to train."""
    result = trainer.train(
        tiny_config(tmp_path / "run", "run.max_minutes=1", "data.epochs=0", "data.steps=0", "run.compile=auto"),
        spent_s=57,
    )
    weighed = re.match(r"auto: ~(\d+) s of eager training", result["plan"]["compile_reason"])
    assert weighed is not None and int(weighed.group(1)) <= 3, result["plan"]["compile_reason"]


def test_a_resumed_run_keeps_its_first_invocations_compile_choice(tmp_path: Path, monkeypatch) -> None:
    """The choice was made again at every resume: under another load one run trained part compiled and part
    eager, and was not bit-identical to an uninterrupted one, as the precision, kept since, had been."""
    from helpers import sigterm_after

    run, settings = tmp_path / "run", ("data.steps=6", "run.compile=auto", "run.checkpoint_every=100")
    monkeypatch.setattr(trainer, "train_step", sigterm_after(3, trainer.train_step))
    first = trainer.train(tiny_config(run, *settings))
    assert first["status"] == "interrupted" and first["plan"]["compiled"] is False
    monkeypatch.undo()

    def decide_again(*args, **kwargs):
        raise AssertionError("a resumed run decided compilation again")

    monkeypatch.setattr(compiled, "decide", decide_again)
    result = trainer.train(tiny_config(run, *settings))
    assert result["status"] == "finished" and result["plan"]["compiled"] is False
    assert result["plan"]["compile_reason"] == "auto: as this run's first invocation chose"


@pytest.mark.skipif(compiled.cpp_compiler() is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_run_compiles_before_the_loop_and_matches_eager(tmp_path: Path, caplog) -> None:
    """A compiled run: both PatchDropout graphs compiled in the warm-up, none in the loop; same weights as eager.

    Inductor draws random numbers its own way; `fallback_random` makes it draw as eager does, so the
    PatchDropout subsets are the same in both runs.
    """
    overrides = ("data.steps=6", "model.dropout=0", "model.patch_dropout=0.5", "model.patch_dropout_until=0.5")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    # (config.patch, not monkeypatch: monkeypatch's undo deletes inductor's config entry for later tests)
    with caplog.at_level(logging.INFO, logger="vitkit.train"), torch._inductor.config.patch(fallback_random=True):
        trainer.train(tiny_config(tmp_path / "compiled", *overrides, "run.compile=on"))
    assert "torch.compile: 2 graph(s)" in caplog.text
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # the loop added none
    trainer.train(tiny_config(tmp_path / "eager", *overrides))
    final = [
        load_file(str(tmp_path / run / "checkpoints" / "final" / "model.safetensors")) for run in ("compiled", "eager")
    ]
    # Fused kernels round differently; after 6 Adam steps the weights agree to ~5e-5, 1% of one step's
    # size (the learning rate); different patch subsets would differ by ~1e-2.
    for key, value in final[0].items():
        torch.testing.assert_close(value, final[1][key], rtol=0, atol=2e-4)


class _Exploding(torch.nn.Module):
    """Stands in for a compiled model whose compiler fails on the first call."""

    def forward(self, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("C++ compile failed: g++ exited with status 1")


def test_failed_compilation_trains_eagerly(tmp_path: Path, caplog, monkeypatch, a_cpp_compiler) -> None:
    """The warm-up's failure is reported and the run goes on eagerly: same weights as a plain eager run."""
    monkeypatch.setattr(compiled, "compile_for_training", lambda model, device: _Exploding())
    overrides = ("data.steps=4", "model.patch_dropout=0.5", "model.patch_dropout_until=0.5")
    with caplog.at_level(logging.WARNING, logger="vitkit.train"):
        result = trainer.train(tiny_config(tmp_path / "fallback", *overrides, "run.compile=on"))
    assert "torch.compile failed (RuntimeError: C++ compile failed" in caplog.text and result["status"] == "finished"
    trainer.train(tiny_config(tmp_path / "eager", *overrides))
    final = [
        load_file(str(tmp_path / run / "checkpoints" / "final" / "model.safetensors")) for run in ("fallback", "eager")
    ]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(value, final[1][key]) for key, value in final[0].items())


def test_a_runs_precision_follows_the_host(tmp_path) -> None:
    """precision auto in a real (tiny) run on the CPU: fp32 without native bf16; with it, what the model measured."""
    config = tiny_config(tmp_path / "run", "run.precision=auto", "data.steps=2", "run.device=cpu")
    plan = trainer.train(config)["plan"]
    if compiled.hosts.current().native_bf16:
        assert plan["precision_reason"].startswith("auto: native bf16")
    else:
        assert (plan["precision"], plan["precision_reason"]) == ("fp32", "auto: this CPU has no native bf16")
    host = compiled.hosts.current()
    assert (
        plan["host"]
        == f"host: {host.cpu} ({host.isa}, "
        + ("native bf16" if host.native_bf16 else "no native bf16")
        + (", AMX" if host.amx else "")
        + "), 1 thread(s)"
    )  # the tiny config trains on one thread


def test_a_compiled_runs_precision_is_measured_at_its_own_matmul(monkeypatch, a_cpp_compiler) -> None:
    """Compiled, the casts autocast adds are fused away: the choice weighs the model's MLP matmul at its rows."""
    from vitkit.device import PRECISION_ROUNDS
    from vitkit.train import choices
    from vitkit.train.config import apply_overrides

    config = apply_overrides(
        tiny_config(Path("/unused"), "run.precision=auto", "run.compile=on"), ["model.patch_dropout=0.75"]
    )  # 8 px on 2 px patches: 16 patches, 4 kept
    assert choices.matmul_shape(config.model, 32) == (32 * 4, 32, 64)
    seen = []

    def timed(rows, inner, outer, device, dtype):
        seen.append((rows, inner, outer, dtype))
        return 1.0 if dtype is None else 0.4  # bf16 2.5x as fast

    monkeypatch.setattr(choices, "matmul_seconds", timed)
    picked = _choose_on_native_bf16(monkeypatch, config, steps=10)
    assert picked.compiled and picked.precision == "bf16" and "2.50x" in picked.precision_reason
    assert seen == [(128, 32, 64, None), (128, 32, 64, torch.bfloat16)] * PRECISION_ROUNDS  # alternated


def test_an_eager_runs_precision_is_timed_alternately_too(monkeypatch) -> None:
    """Eagerly, each precision's pass was timed once and reused: the fp32 pass, timed first and cold for the
    compile decision, stood for fp32 in every round, and one burst of other work chose the precision (plans
    said "91.09x as fast" and "0.18x" within one sweep)."""
    from vitkit.device import PRECISION_ROUNDS
    from vitkit.train import choices

    config = tiny_config(Path("/unused"), "run.precision=auto", "run.compile=auto")
    passes = {None: [9.0, 1.0, 1.0], torch.bfloat16: [0.5, 5.0]}  # fp32 cold, then warm; bf16 hit by a burst
    seen = []

    def probe(model, model_config, images, device, dtype):
        seen.append(dtype)
        return passes[dtype].pop(0)

    monkeypatch.setattr(choices, "probe_pass", probe)
    picked = _choose_on_native_bf16(monkeypatch, config, steps=1)  # one step: compiling cannot pay, timed eagerly
    assert seen == [None] + [None, torch.bfloat16] * PRECISION_ROUNDS  # the compile decision's, then alternated
    assert not picked.compiled and picked.precision == "bf16" and "2.00x" in picked.precision_reason  # 1.0 / 0.5


def _choose_on_native_bf16(monkeypatch, config, steps: int):
    """choices.choose for `config` at micro-batch 32 on this CPU taken for one with native bf16 (AVX512-BF16, AMX)."""
    from vitkit.train import choices

    native = dataclasses.replace(compiled.hosts.current(), native_bf16=True)
    monkeypatch.setattr(compiled.hosts, "current", lambda device=None: native)
    model = build_model(config.model)
    device = torch.device("cpu")
    return choices.choose(config, model, device, micro_batch=32, accumulation=1, graphs=1, steps=steps, budget_s=None)


def test_a_bf16_run_resumed_on_a_host_without_native_bf16_goes_on_in_fp32(monkeypatch) -> None:
    """Kept as its first invocation chose, it had trained 3.5x slower in emulated bf16 without a word."""
    from vitkit.train import choices

    config = tiny_config(Path("unused"), "run.compile=off", "run.precision=auto")
    model, cpu = build_model(config.model), torch.device("cpu")
    kept = choices.choose(config, model, cpu, micro_batch=4, accumulation=1, graphs=1, steps=10, budget_s=None,
                          stored_precision="fp32")  # fmt: skip
    assert (kept.precision, kept.precision_reason) == ("fp32", "auto: as this run's first invocation chose")
    emulated = dataclasses.replace(compiled.hosts.current(), native_bf16=False)
    monkeypatch.setattr(compiled.hosts, "current", lambda device=None: emulated)
    moved = choices.choose(config, model, cpu, micro_batch=4, accumulation=1, graphs=1, steps=10, budget_s=None,
                           stored_precision="bf16")  # fmt: skip
    assert moved.precision == "fp32" and "no native bf16" in moved.precision_reason
    assert "earlier invocations trained in bf16" in moved.precision_reason


def test_an_eager_run_of_a_set_length_times_one_pass_a_phase(tmp_path: Path, monkeypatch) -> None:
    """Its warm-up only feeds the estimate line: three passes a phase had cost 40 s of a 600-image epoch."""
    seen = []

    def recording(*args, timed=2, **kwargs):
        seen.append(timed)
        return warm_up(*args, timed=timed, **kwargs)

    monkeypatch.setattr(compiled, "warm_up", recording)
    trainer.train(tiny_config(tmp_path / "a", "data.steps=2", "run.compile=off"))
    trainer.train(
        tiny_config(tmp_path / "b", "data.steps=0", "data.epochs=0", "run.max_minutes=0.01", "run.compile=off")
    )
    assert seen == [1, 2]  # a budget's fit reads the timings: kept at two
