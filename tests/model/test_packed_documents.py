"""Rows of packed documents (doc_starts): each document computed as if it were alone."""

from __future__ import annotations

import pytest
import torch

from microgpt.model import GPT, GPTConfig, document_positions


def test_positions_restart_and_attention_stays_inside_each_document():
    starts = torch.tensor([[1, 0, 0, 1, 0, 1]], dtype=torch.bool)
    positions, mask = document_positions(starts)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0]]
    # query 4 (the second document's second token) sees keys 3 and 4 only
    assert mask[0, 0, 4].tolist() == [False, False, False, True, True, False]
    assert mask.shape == (1, 1, 6, 6)


@pytest.mark.parametrize("impl", ["sdpa", "batched", "loop"])
def test_a_packed_row_gives_each_documents_own_logits_and_loss(impl):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=27, block_size=8, attn_impl=impl)).eval()
    docs = [torch.tensor([[0, 5, 13, 13, 1]]), torch.tensor([[0, 15, 12, 9, 22, 9, 1]])]
    docs.append(torch.tensor([[0, 1, 22, 1]]))
    # 16 tokens: longer than block_size, which only bounds each document
    row = torch.cat(docs, dim=1)
    targets = torch.cat([torch.roll(d, -1, dims=1) for d in docs], dim=1)
    logits, loss = model(row, targets, doc_starts=row == 0)
    alone = [model(d, torch.roll(d, -1, dims=1)) for d in docs]
    torch.testing.assert_close(logits, torch.cat([lg for lg, _ in alone], dim=1))
    # the mean over all 16 targets: each document's mean weighted by its length
    sizes = torch.tensor([d.size(1) for d in docs], dtype=torch.float)
    expected = (torch.stack([lo for _, lo in alone]) * sizes).sum() / sizes.sum()
    torch.testing.assert_close(loss, expected)
