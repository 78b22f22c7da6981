"""The host policy's precision choice (vitkit.device): by capability, then by a measurement of the caller's model."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from vitkit import device as policy
from vitkit import host as hosts

CPU = torch.device("cpu")


def _timer(fp32: float, bf16: float, calls: list):
    def measure(dtype):
        calls.append(dtype)
        return bf16 if dtype == torch.bfloat16 else fp32

    return measure


def test_auto_without_native_bf16_is_fp32_and_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "native_bf16", lambda device: False)
    calls: list = []
    choice = policy.choose_precision("auto", CPU, _timer(1.0, 0.1, calls))
    assert (choice.precision, choice.dtype, calls) == ("fp32", None, [])
    assert choice.reason == "auto: this CPU has no native bf16"


@pytest.mark.parametrize(("fp32", "bf16", "expected"), [(2.0, 1.0, "bf16"), (1.0, 0.9, "fp32"), (1.0, 1.5, "fp32")])
def test_auto_with_native_bf16_follows_the_measurement(monkeypatch, fp32, bf16, expected) -> None:
    monkeypatch.setattr(policy, "native_bf16", lambda device: True)
    calls: list = []
    choice = policy.choose_precision("auto", CPU, _timer(fp32, bf16, calls))
    assert choice.precision == expected and choice.speedup == pytest.approx(fp32 / bf16)
    assert calls == [None, torch.bfloat16] * policy.PRECISION_ROUNDS  # alternated
    assert f"{fp32 / bf16:.2f}x" in choice.reason
    assert policy.choose_precision("auto", CPU).precision == "bf16"  # nothing to time: capability alone


def test_a_burst_of_other_work_during_one_measurement_does_not_decide(monkeypatch) -> None:
    """The bf16 pass timed 9x slow once (another process took the cores) and at its speed the next time:
    the fastest of the alternated rounds decides, 2x, not 0.11x."""
    monkeypatch.setattr(policy, "native_bf16", lambda device: True)
    seconds = iter([1.0, 4.5, 1.0, 0.5])  # fp32, bf16 (disturbed), fp32, bf16
    choice = policy.choose_precision("auto", CPU, lambda dtype: next(seconds))
    assert choice.precision == "bf16" and choice.speedup == pytest.approx(2.0)


def test_explicit_bf16_without_native_bf16_is_kept_and_warned_once(monkeypatch, caplog) -> None:
    monkeypatch.setattr(policy, "native_bf16", lambda device: False)
    monkeypatch.setattr(policy, "_warned", set())
    calls: list = []
    with caplog.at_level(logging.WARNING, logger="vitkit.device"):
        first = policy.choose_precision("bf16", CPU, _timer(1.0, 12.5, calls))
        again = policy.choose_precision("bf16", CPU, _timer(1.0, 12.5, calls))
    assert first.precision == again.precision == "bf16" and "12.5x slower than fp32 here" in first.reason
    warnings = [r.message for r in caplog.records if "without native bf16" in r.message]
    assert len(warnings) == 1 and "12.5x slower" in warnings[0] and "precision auto" in warnings[0]
    assert policy.choose_precision("fp32", CPU).reason == "fp32 as requested"
    faster = policy.choose_precision(
        "bf16", CPU, _timer(1.0, 0.6, calls)
    )  # measured faster: said so, not "0.6x slower"
    assert "measured 1.67x as fast as fp32 here" in faster.reason and "slower" not in faster.reason
    with pytest.raises(ValueError, match="unknown precision"):
        policy.choose_precision("fp16", CPU)  # type: ignore[arg-type]


def test_the_host_reads_what_torch_will_use() -> None:
    host = hosts.current()
    assert host.isa == torch.backends.cpu.get_cpu_capability() and host.threads == torch.get_num_threads()
    assert host.native_bf16 == policy.native_bf16(CPU) and host.torch == torch.__version__
    assert host.label == (
        "AMX"
        if host.amx
        else f"{host.isa}-BF16"
        if host.native_bf16 and host.isa.startswith("AVX512")
        else f"{host.isa}, native bf16"
        if host.native_bf16
        else f"{host.isa}, no native bf16"
    )
    assert host.to_dict()["host_class"] == host.label and host.describe().startswith(f"host: {host.cpu} ({host.isa}")


def test_the_cpu_id_tells_generations_apart_where_the_model_name_does_not() -> None:
    """A virtual machine's model name may be the brand alone ("AMD EPYC"): Zen 3, 4 and 5 then read the same."""
    zen5 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n\n"
    second = "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\n"
    assert hosts.cpu_id(zen5 + second) == "family 26 model 2"
    assert hosts.cpu_id("processor\t: 0\nHardware\t: BCM2835\n") == ""  # no x86 family: ARM
    assert hosts.cpu_id("") == "" and hosts.current().to_dict()["cpu_id"] == hosts.cpu_id(hosts._cpuinfo())


def test_time_pass_takes_the_fastest_of_its_repeats(monkeypatch) -> None:
    readings = iter([0.0, 5.0, 10.0, 12.0, 20.0, 21.5])  # repeats of 5, 2 and 1.5 s after an untimed call
    monkeypatch.setattr(policy.time, "perf_counter", lambda: next(readings))
    calls = []
    assert policy.time_pass(lambda: calls.append(1), CPU, repeats=3) == pytest.approx(1.5) and len(calls) == 4


@pytest.mark.skipif(
    os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() != "AVX2",
    reason="the emulated host of .ci/run's second step (ONEDNN_MAX_CPU_ISA=AVX2)",
)
def test_the_emulated_host_is_a_cpu_without_native_bf16() -> None:
    host = hosts.current()
    assert not host.native_bf16 and host.label.endswith("no native bf16")
    assert policy.choose_precision("auto", CPU).precision == "fp32"


@pytest.mark.skipif(
    os.environ.get("ATEN_CPU_CAPABILITY", "").lower() != "default",
    reason="the emulated host of .ci/run's third step (ATEN_CPU_CAPABILITY=default, ONEDNN_MAX_CPU_ISA=SSE41)",
)
def test_the_emulated_host_without_avx2_reads_default_and_trains_in_fp32() -> None:
    host = hosts.current()
    assert (host.isa, host.label, host.native_bf16, host.amx) == ("DEFAULT", "DEFAULT, no native bf16", False, False)
    assert policy.choose_precision("auto", CPU).precision == "fp32"


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_a_process_beyond_the_machines_gpus_is_told_what_to_do(monkeypatch, requested) -> None:
    # `torchrun --nproc_per_node 2` on a one-GPU machine: rank 1 must not die on "invalid device ordinal"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert policy.pick_device(requested, local_rank=0) == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"GPU 1 .* 1 CUDA device.*--nproc_per_node 1.*run\.device=cpu"):
        policy.pick_device(requested, local_rank=1)
    with pytest.raises(ValueError, match=r"'cuda:3': the machine has 1 CUDA device\(s\), cuda:0 to cuda:0$"):
        policy.pick_device("cuda:3")  # named by number (as serve --device takes it): no torchrun advice


def test_a_thread_count_beyond_the_host_s_cpus_is_capped_with_a_warning(monkeypatch, caplog) -> None:
    """run.threads=100000 crashed torch (SIGSEGV, no message) and 5,000 hung: threads are capped at the CPUs this
    process may run on, with a warning; `set_threads` is the one place train, serve and bench set them."""
    monkeypatch.setattr(hosts, "cpus", lambda: 2)
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING):
            assert hosts.set_threads(100_000) == 2 and torch.get_num_threads() == 2
        assert "100000 threads asked for; this host runs 2 at once: using 2" in caplog.text
        caplog.clear()
        assert hosts.set_threads(1) == 1 and torch.get_num_threads() == 1 and not caplog.text
        assert hosts.set_threads(0) == 1  # 0: torch's setting, left as it is
    finally:
        torch.set_num_threads(before)
    assert hosts.cpus() >= 1


def test_the_memory_available_is_bounded_by_the_process_s_address_space_limit() -> None:
    """Under `prlimit --as=6G` on a 24 GB machine the checks said 24 GB were available, and the allocations they
    allowed failed later as "out of memory: lower --batch-size"."""
    import subprocess
    import sys

    script = (  # a limit 1 GiB above what the process maps, whatever the machine has free
        "import os, resource; from vitkit.host import available_memory; "
        "mapped = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE'); "
        "resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), mapped + (1 << 30))); "
        "print(available_memory() if resource.getrlimit(resource.RLIMIT_AS)[0] > 0 else -1)"
    )
    bounded = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    if bounded < 0:  # qemu's user-mode emulation keeps the limit from the process (and from getrlimit)
        pytest.skip("this host does not apply RLIMIT_AS to the process")
    assert (1 << 30) - (64 << 20) < bounded <= 1 << 30  # less what the few lines above mapped


def test_a_containers_reclaimable_page_cache_counts_as_available(tmp_path) -> None:
    """A cgroup's memory.current counts the page cache of the files it read: in a long-lived container it sits
    near memory.max, and every file checked against the memory available was refused."""
    from vitkit.host import cgroup_free

    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("900000\n")
    assert cgroup_free(tmp_path) == 100_000  # no memory.stat: what is used counts whole
    (tmp_path / "memory.stat").write_text("anon 300000\nfile 600000\nactive_file 100000\ninactive_file 500000\n")
    assert cgroup_free(tmp_path) == 600_000
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_free(tmp_path) == float("inf") and cgroup_free(tmp_path / "absent") == float("inf")


def test_amx_is_read_where_torch_reports_it_and_onednn_may_use_it(monkeypatch) -> None:
    """torch 2.13 has no `torch._C._cpu._is_amx_tile_supported`: an AMX host read as AVX512-BF16 in its records."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_tile": True}, raising=False)
    assert hosts.amx_tiles()
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_tile": False}, raising=False)
    assert not hosts.amx_tiles()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert hosts._onednn_limit() == "AVX2"  # oneDNN reads its new name first ...
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "")
    assert hosts._onednn_limit() == "AVX512_CORE_AMX"  # ... and the older one where the new is unset or empty
    for limit, allowed in [
        (None, True),
        ("", True),
        ("ALL", True),
        ("avx512_core_amx", True),
        ("AVX10_1_512_AMX_FP16", True),
        ("AVX512_BF16", True),  # not a oneDNN name: oneDNN ignores it and uses every ISA
        ("AVX512_CORE_BF16", False),
        ("avx512_core_fp16", False),
        ("AVX2", False),
    ]:
        assert hosts.onednn_allows_amx(limit) is allowed, limit


def _cpuinfo_flags() -> set[str]:
    for line in hosts._cpuinfo().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_the_amx_flag_agrees_with_the_operating_system_on_this_host(monkeypatch) -> None:
    """Against /proc/cpuinfo, not torch: the flag reads AMX tiles where the kernel lists them, and a oneDNN limit
    below AMX turns it off."""
    flags = _cpuinfo_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags here")
    host = hosts.current()
    expected = "amx_tile" in flags and host.native_bf16 and host.isa.startswith("AVX512")
    expected = expected and hosts.onednn_allows_amx(hosts._onednn_limit())
    assert host.amx is expected and (host.label == "AMX") is expected
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    hosts._cpu_facts.cache_clear()
    try:
        assert not hosts.current().amx
    finally:
        monkeypatch.undo()
        hosts._cpu_facts.cache_clear()
