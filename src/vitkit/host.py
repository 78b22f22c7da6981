"""The host a run is on: its CPU, the instruction set torch dispatches to, whether bf16 is native, threads.

Every figure vitkit reports holds for a host class (STYLE.md section 8), and the host policy (DESIGN.md "The
host decides how") chooses precision, kernels and compilation from these facts.  They are what torch and
oneDNN will actually use, so a host restricted by their own settings (`ATEN_CPU_CAPABILITY=avx2`,
`ONEDNN_MAX_CPU_ISA=AVX2`: an AVX2 machine without native bf16, emulated) reads as that class.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import logging
import math
import os
import platform
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Host:
    """What this process runs on."""

    cpu: str  # the CPU model (/proc/cpuinfo's "model name"), or the GPU's name on CUDA
    isa: str  # the CPU kernels torch dispatches to: "AVX512", "AVX2", "DEFAULT", "NEON", "SVE256", ... ("CUDA")
    native_bf16: bool  # bf16 matrix products in hardware (AVX512-BF16 / AMX through oneDNN; CUDA)
    amx: bool  # Intel AMX tiles usable for bf16 (implies native_bf16)
    threads: int  # torch intra-op threads
    torch: str  # torch version
    cpu_id: str = ""  # the x86 "family F model M" (/proc/cpuinfo), which tells CPU generations apart; "" elsewhere

    @property
    def label(self) -> str:
        """The host class in the words figures are quoted with, e.g. "AVX2, no native bf16" or "AMX"."""
        if self.isa == "CUDA":
            return self.cpu
        if self.amx:
            return "AMX"
        if self.native_bf16:
            return f"{self.isa}-BF16" if self.isa.startswith("AVX512") else f"{self.isa}, native bf16"
        return f"{self.isa}, no native bf16"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "host_class": self.label}

    def describe(self) -> str:
        """One line for the plan: the class and where it comes from."""
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        return f"host: {self.cpu} ({self.isa}, {bf16}{', AMX' if self.amx else ''}), {self.threads} thread(s)"


def cpu_model() -> str:
    """The CPU's model name, as the operating system reports it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip() or platform.machine()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_id(cpuinfo: str) -> str:
    """ "family F model M" of an x86 /proc/cpuinfo text: a virtual machine's model name is often just the brand
    ("AMD EPYC"), and these two tell the generations apart (AMD family 25 is Zen 3 and 4, 26 is Zen 5)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
        if not key.strip():  # the first processor's block ends
            break
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    return f"family {family} model {model}" if family.isdigit() and model.isdigit() else ""


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return info.read(1 << 16)
    except OSError:
        return ""


@functools.cache
def cpu_native_bf16() -> bool:
    """Whether oneDNN multiplies bf16 natively on this CPU (AVX512-BF16 / AMX), read once per process."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def amx_tiles() -> bool:
    """Whether the CPU has AMX tiles, as torch's cpuinfo reads it (`torch.cpu.get_capabilities`, or the private
    check of torch releases before it)."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        return bool(capabilities().get("amx_tile", False))
    check = getattr(torch._C._cpu, "_is_amx_tile_supported", None)
    return bool(check and check())


ONEDNN_BELOW_AMX = {  # oneDNN's ISA limits that keep it off AMX; any other value (an AMX level, ALL, or one it
    # does not know, which it ignores) leaves AMX to it
    *("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_MIC", "AVX512_MIC_4OPS", "AVX512_CORE"),
    *("AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512"),
}


def onednn_allows_amx(limit: str | None) -> bool:
    """Whether oneDNN's ISA limit (the value of ONEDNN_MAX_CPU_ISA, or of its older name DNNL_MAX_CPU_ISA) lets it
    use AMX: unset, an AMX level (AVX512_CORE_AMX, AVX10_1_512_AMX_FP16, ...), or a value oneDNN ignores."""
    return (limit or "").strip().upper() not in ONEDNN_BELOW_AMX


def _onednn_limit() -> str | None:
    return os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")


@functools.cache
def _cpu_facts() -> tuple[str, str, bool, bool, str]:
    isa = str(torch.backends.cpu.get_cpu_capability())
    native = cpu_native_bf16()
    amx = native and isa.startswith("AVX512") and onednn_allows_amx(_onednn_limit()) and amx_tiles()
    return cpu_model(), isa, native, amx, cpu_id(_cpuinfo())


def current(device: torch.device | str = "cpu") -> Host:
    """The host of `device` (the CPU, or a CUDA device); the CPU facts are read once per process."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return Host(
            cpu=torch.cuda.get_device_name(index),
            isa="CUDA",
            native_bf16=torch.cuda.is_bf16_supported(),
            amx=False,
            threads=torch.get_num_threads(),
            torch=torch.__version__,
        )
    cpu, isa, native, amx, family = _cpu_facts()
    return Host(
        cpu=cpu,
        isa=isa,
        native_bf16=native,
        amx=amx,
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        cpu_id=family,
    )


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def processes_here() -> int:
    """The processes of this job on this machine (torchrun's LOCAL_WORLD_SIZE; 1 without it), which share its
    memory and /dev/shm."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def set_threads(requested: int) -> int:
    """Set torch's intra-op threads to `requested` (0: leave torch's setting), capped at `cpus()` with a warning:
    torch crashes (SIGSEGV) or hangs at tens of thousands.  The threads now set."""
    if requested > 0:
        usable = min(requested, cpus())
        if usable < requested:
            log.warning("%d threads asked for; this host runs %d at once: using %d", requested, usable, usable)
        torch.set_num_threads(usable)
    return torch.get_num_threads()


def process_seconds() -> float:
    """Seconds since this process started, its interpreter and imports included, where the OS says (Linux's
    /proc); else 0.  A time budget counts from there: importing torch alone takes seconds."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, clock ticks since boot
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


FALLBACK_BYTES = 8 << 30  # where the system says nothing about its memory


def available_memory() -> int:
    """Bytes of memory available now: MemAvailable, capped by a cgroup (container) limit and by what the
    process's address-space limit (RLIMIT_AS, `ulimit -v`) leaves it."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        free = None
    if free is None and hasattr(os, "sysconf"):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            free = None
    free = FALLBACK_BYTES if free is None or free <= 0 else free
    return min(free, cgroup_free(), _address_space_left())


def cgroup_free(root: Path = Path("/sys/fs/cgroup")) -> float:
    """Bytes a cgroup v2 (container) limit leaves: memory.max less what the group uses but cannot reclaim (its
    memory.current counts the page cache of every file read, which the kernel drops before it refuses memory:
    the inactive part is counted free).  No bound (inf) without a limit."""
    try:
        cap = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
        if cap == "max":
            return math.inf
        limit = int(cap)
    except (OSError, ValueError):
        return math.inf
    try:
        stat = (root / "memory.stat").read_text().split()
        inactive = int(stat[stat.index("inactive_file") + 1])
    except (OSError, ValueError, IndexError):
        inactive = 0
    return max(limit - used + inactive, 0)


def _address_space_left() -> int:
    """Bytes this process may still map under its RLIMIT_AS (`ulimit -v`, `prlimit --as`), or no bound: memory
    the machine has is not the process's beyond its limit, and an allocation past it fails as out of memory."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return 1 << 62
        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(limit - mapped, 0)
    except (ImportError, OSError, ValueError, IndexError):  # no resource module (Windows), no /proc
        return 1 << 62


def default_cache_dir() -> str:
    """Inductor's own cache directory, where TORCHINDUCTOR_CACHE_DIR is unset: torch's function where this
    release has it (torch 2.5 and later), else the directory releases before it use (the temporary directory's
    torchinductor_USER)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torchs
    except ImportError:
        try:
            user = getpass.getuser()
        except (KeyError, ModuleNotFoundError, OSError):  # no name for this uid (a container's)
            user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
        return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return torchs()


def use_compile_cache(device: torch.device) -> str:
    """Point inductor's cache at a directory of this host class (unless the user chose one); returns it.  Every
    torch.compile of vitkit's runs under it: with torch 2.13, kernels cached under ATEN_CPU_CAPABILITY=avx2
    corrupt the heap of an AVX-512 process that loads them (an abort in malloc)."""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return chosen
    host = current(device)
    name = re.sub(
        r"[^A-Za-z0-9_.-]+", "-", f"vitkit-{host.isa}-{'bf16' if host.native_bf16 else 'nobf16'}-{host.torch}"
    )
    path = os.path.join(default_cache_dir(), name)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path
