"""The CUDA path on the `base` preset's shape: flash attention in bf16, bf16 against fp32, the KV
cache on the GPU. Skipped without a GPU (bench/gpu.sh runs them on one)."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from microgpt.kv_cache import KVCache
from microgpt.model import GPT, GPTConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
BASE = {"vocab_size": 65, "block_size": 256, "n_layer": 6, "n_embd": 384, "n_head": 6}


def base(dropout=0.0) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**BASE, dropout=dropout))


def tokens(B: int, T: int) -> torch.Tensor:
    return torch.randint(0, 65, (B, T), generator=torch.Generator().manual_seed(1))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_a_text_batch_trains_through_flash_attention_in_bf16():
    """A text batch (no packed documents) is plain causal attention: sdpa's flash kernel takes it,
    forward and backward, dropout on, with every other kernel switched off (else: no kernel)."""
    model = base(dropout=0.2).cuda().train()
    x = tokens(8, 256).cuda()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", torch.bfloat16):
        _, loss = model(x, x)
        loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())


def test_bf16_logits_on_the_gpu_are_the_fp32_logits_on_the_cpu():
    model, x = base().eval(), tokens(4, 256)
    with torch.no_grad():
        reference, _ = model(x)  # float32 on the CPU
        with torch.autocast("cuda", torch.bfloat16):
            logits, _ = model.cuda()(x.cuda())
    assert 0 < relative(logits.float().cpu(), reference) < 2e-2  # bf16's operands: 1e-3 to 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_decoding_on_the_gpu_equals_the_full_forward(dtype):
    """A 100-token prompt prefilled, then a token a step up to the block size."""
    model, x = base().cuda().eval(), tokens(3, 256).cuda()
    with torch.no_grad(), torch.autocast("cuda", dtype, enabled=dtype != torch.float32):
        full, _ = model(x)
        cache = KVCache.for_model(model, batch_size=3)
        steps = [model(x[:, :100], kv_cache=cache)[0]]
        steps += [model(x[:, t : t + 1], kv_cache=cache)[0] for t in range(100, 256)]
    assert relative(torch.cat(steps, 1), full) < (1e-5 if dtype == torch.float32 else 2e-2)
