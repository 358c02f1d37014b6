"""The machine's precision: which CPUs multiply bf16 in hardware (Muon's iteration runs there)."""

from __future__ import annotations

import pytest
import torch

from microgpt.system import native_bf16

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "flags, native",
    [
        ("fpu sse avx2 avx512f avx512_bf16 avx512_vnni", True),  # AMD Zen 4/5, Intel Cooper Lake
        ("fpu sse avx2 avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
        ("fpu sse avx2 avx512f avx512bw", False),  # AVX-512 without bf16: emulated, slow
        ("fpu sse avx2 fma", False),
    ],
)
def test_native_bf16_reads_the_cpus_flags(tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a CPU\nflags\t\t: {flags}\n\n")
    assert native_bf16(CPU, str(cpuinfo)) is native
    assert native_bf16(torch.device("mps"), str(cpuinfo)) is False


def test_no_cpuinfo_means_no_bf16(tmp_path):
    assert native_bf16(CPU, str(tmp_path / "none")) is False
    (tmp_path / "no-flags").write_text("processor\t: 0\n")
    assert native_bf16(CPU, str(tmp_path / "no-flags")) is False
