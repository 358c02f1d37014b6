"""The machine's precision: which CPUs multiply bf16 in hardware, what `auto` picks there, and
the autocast that training and evaluation run under."""

from __future__ import annotations

import pytest
import torch

from microgpt import system
from microgpt.system import native_bf16

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "flags, native",
    [
        ("fpu sse avx2 avx512f avx512_bf16 avx512_vnni", True),  # AMD Zen 4/5, Intel Cooper Lake
        ("fpu sse avx2 avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
        ("fpu sse avx2 avx512f avx512bw", False),  # AVX-512 without bf16: emulated, slow
        ("fpu sse avx2 fma", False),
        (None, False),  # no flags line
    ],
)
def test_native_bf16_reads_the_cpus_flags(tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    assert native_bf16(CPU, str(cpuinfo)) is False  # no cpuinfo (not Linux)
    line = f"flags\t\t: {flags}\n" if flags else ""
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: a CPU\n{line}\n")
    assert native_bf16(CPU, str(cpuinfo)) is native
    assert native_bf16(torch.device("mps"), str(cpuinfo)) is False


@pytest.mark.parametrize(
    "device, native, train, muon",
    [
        ("cpu", True, "bf16", "bf16"),
        ("cpu", False, "fp32", "fp32"),
        ("cuda", True, "bf16", "bf16"),
        ("cuda", False, "fp16", "fp32"),  # a T4: Muon's iteration has no fp16
    ],
)
def test_auto_is_one_rule_bf16_where_the_device_multiplies_it(
    monkeypatch, device, native, train, muon
):
    monkeypatch.setattr(system, "native_bf16", lambda device: native)
    where = torch.device(device)
    assert system.Precision.resolve("auto", where) == train
    assert system.Precision.resolve("auto", where, fp16=False) == muon
    assert system.Precision.resolve("fp32", where) is system.Precision.FP32


def test_cpu_bf16_autocast_leaves_attention_to_the_math_kernel():
    """PyTorch's CPU flash-attention backward is ~10x slower in bf16: attention takes the math
    kernel while bf16 autocast is on, and the flash kernel again after it."""
    a = torch.randn(4, 4)
    with system.autocast(CPU, "bf16"):
        assert (a @ a).dtype == torch.bfloat16
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    with system.autocast(CPU, "fp32"):
        assert (a @ a).dtype == torch.float32 and torch.backends.cuda.flash_sdp_enabled()
