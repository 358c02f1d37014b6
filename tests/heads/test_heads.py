"""microgpt.heads and its head interventions (the hook before W_O): roles, importance, pruning,
the command."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from microgpt.heads import circuits
from microgpt.heads.analyse import analyse, length_batches
from microgpt.heads.report import ROLES
from microgpt.heads.roles import roles_of
from microgpt.model import GPT, GPTConfig

BLOCK = 8


def random_model(tok, impl="sdpa", n_head=4, n_layer=2, seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    sizes = {"block_size": BLOCK, "n_layer": n_layer, "n_embd": 16, "n_head": n_head}
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, attn_impl=impl, **sizes, **kw))
    with torch.no_grad():  # the default init gives near-uniform attention: make heads differ
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model.eval()


@torch.no_grad()
def batches_loss(model: GPT, batches) -> float:
    """The mean loss per real target over every batch from whole passes of model(x, y)."""
    total, count = 0.0, 0
    for x, y in batches:
        n = int((y >= 0).sum())
        total, count = total + float(model(x, y)[1]) * n, count + n
    return total / max(count, 1)


def scaled(model: GPT, scales: dict) -> GPT:
    """A copy of `model` whose heads {(layer, head): s} write s times their output, by scaling
    their columns of W_O: another mechanism than the hook point, so the expected values do not
    repeat the code under test."""
    other, hd = copy.deepcopy(model), model.config.head_dim
    with torch.no_grad():
        for (layer, h), s in scales.items():
            other.blocks[layer].attn.proj.weight[:, h * hd : (h + 1) * hd] *= s
    return other


# ----------------------------------------------------------------------------- roles


def forced_model(tok, beta: float = 2.0) -> GPT:
    """One layer, five heads of 8 channels, each made to look where its name says: the token
    embedding is 0 and position i's embedding is the unit vector e_i (RMSNorm scales it), so
    q_i . k_j is large exactly where head h's Q reads the position its role names."""
    C, hd = 40, 8
    sizes = {"block_size": BLOCK, "n_layer": 1, "n_embd": C, "n_head": 5}
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, **sizes, norm="rmsnorm"))
    with torch.no_grad():
        model.wte.weight.zero_()
        model.wpe.weight.zero_()
        model.wpe.weight[:, :BLOCK] = torch.eye(BLOCK)  # position i -> e_i
        w = model.blocks[0].attn.qkv.weight  # (3C, C): rows [0, C) Q, [C, 2C) K, [2C, 3C) V
        w[: 2 * C].zero_()
        shift = {0: 1, 1: None, 2: 0, 3: 2, 4: "uniform"}  # q_i = e_{i - shift}
        for h, s in shift.items():
            q, k = w[h * hd : (h + 1) * hd], w[C + h * hd : C + (h + 1) * hd]  # (hd, C) each
            k[:, :BLOCK] = torch.eye(BLOCK)  # k_j = e_j
            if s is None:  # start: q_i = e_0 whatever i
                q[0, :BLOCK] = beta
            elif s != "uniform":  # q[c] = x[c + s]: q_i = e_{i - s}
                q[:, :BLOCK] = beta * torch.eye(BLOCK).roll(s, dims=1)
                q[:, :s] = 0.0
    return model.eval()


def test_forced_heads_get_their_roles(rows):
    x, y, tok = rows
    model = forced_model(tok)
    report = analyse(model, x, y)
    assert report.roles == [["previous", "start", "self", "two_back", "mixed"]]
    assert (report.scores[0, :4] > 0.95).all(), report.scores
    # uniform: query i spreads 1 / (i + 1) over i + 1 keys, entropy log(i + 1), the most there is
    real = y >= 0
    i = torch.arange(BLOCK).expand_as(y)
    assert report.entropy[0, 4] == pytest.approx(float(torch.log(i[real] + 1.0).mean()), abs=1e-5)
    assert report.spread[0, 4] == pytest.approx(1.0)
    assert report.scores[0, 4] == 0.0  # uniform: no pattern above chance
    # previous, start, self: all on one key, 0 nats
    assert (report.entropy[0, :3] < 1e-6).all()
    assert report.offsets[0, 0, 1] > 0.95 and report.offsets[0, 0, 0] < 0.05  # previous, not self
    assert report.start[0, 1] > 0.95 and report.start[0, 0] < 0.05
    counts = report.role_counts()
    named = {k: v for k, v in counts.items() if v}
    assert named == {"self": 1, "previous": 1, "two_back": 1, "start": 1, "mixed": 1}
    # the profile is the mean weight per offset over the queries where that key is a character
    _, _, att = model.forward_with_attention(x)
    i = torch.arange(BLOCK)
    previous = att[0][:, 0, i[2:], i[2:] - 1]  # (N, T-2): head 0, queries i >= 2, key i - 1
    expected = previous[real[:, 2:]].mean()
    assert report.offsets[0, 0, 1] == pytest.approx(float(expected), abs=1e-6)


# ----------------------------------------------------------------------------- importance


def test_a_head_with_zero_wo_columns_has_importance_exactly_zero(rows):
    """Every importance measure of a head that writes nothing is 0, of the others not; analyse
    leaves the model in its mode and the weights' .grad untouched."""
    x, y, tok = rows
    model = random_model(tok).train()
    hd = model.config.head_dim
    with torch.no_grad():
        model.blocks[1].attn.proj.weight[:, 2 * hd : 3 * hd] = 0.0
    report = analyse(model, x, y)
    assert model.training and all(p.grad is None for p in model.parameters())
    others = torch.ones(2, 4, dtype=torch.bool)
    others[1, 2] = False
    for field in ("zero_importance", "mean_importance", "position_importance"):
        measure = getattr(report, field)
        assert measure[1, 2] == 0.0 and (measure[others].abs() > 1e-6).all(), field


def test_the_analysis_agrees_across_implementations(rows):
    x, y, tok = rows
    loop = random_model(tok, "loop")
    sdpa = GPT(GPTConfig(**{**loop.config.to_dict(), "attn_impl": "sdpa"}))
    sdpa.load_state_dict(loop.state_dict())
    expected, got = analyse(loop, x, y), analyse(sdpa.eval(), x, y)
    for field in ("zero_importance", "mean_importance", "offsets", "entropy"):
        a, b = getattr(expected, field), getattr(got, field)
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=field)
    assert got.roles == expected.roles
    assert expected.zero_importance.abs().max() > 1e-3  # not trivially equal


def test_mean_ablation_equals_folding_the_mean_into_wo_bias(rows):
    """Mean-ablating head h = zero its W_O columns and add W_O[:, h] @ mean_h to W_O's bias."""
    x, y, tok = rows
    model = random_model(tok, bias=True)
    hd, layer, h = model.config.head_dim, 0, 1
    captured = []
    attn = model.blocks[layer].attn
    hook = attn.proj.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    model(x)
    hook.remove()
    # W_O's input, read here by another mechanism than the hook point under test
    z = captured[0][..., h * hd : (h + 1) * hd]  # (N, T, hd): the head's output
    mean = z[y >= 0].mean(dim=0).detach()  # over the real positions
    folded = copy.deepcopy(model)
    with torch.no_grad():
        w = folded.blocks[layer].attn.proj
        w.bias += w.weight[:, h * hd : (h + 1) * hd] @ mean
        w.weight[:, h * hd : (h + 1) * hd] = 0.0
    batches = length_batches(x, y)
    expected = batches_loss(folded, batches) - batches_loss(model, batches)
    got = analyse(model, x, y, induction=False).mean_importance
    assert got[layer, h] == pytest.approx(expected, abs=1e-5)
    # the hook itself: replacing the head by its mean gives the same logits as the fold
    drop, value = torch.zeros(2, 4, dtype=torch.bool), torch.zeros(2, 4, hd)
    drop[layer, h], value[layer, h] = True, mean
    with torch.no_grad(), circuits.replaced_heads(model, drop, value):
        torch.testing.assert_close(model(x)[0], folded(x)[0], rtol=0, atol=1e-5)
    assert not attn.hook_z._forward_hooks  # hooks removed


def test_ablations_run_from_their_first_layer_equal_whole_passes(rows):
    """ablated_losses runs an ablation only from the first layer where it differs from the run
    before, on that run's streams: the same losses as whole passes of the model with the heads
    replaced (by zero, a value per head, or per position), on batches of several widths."""
    x, y, tok = rows
    model = random_model(tok, n_layer=3)
    L, H, hd = 3, 4, model.config.head_dim
    batches = length_batches(x, y, batch_size=64)
    assert len({b.shape[1] for b, _ in batches}) > 1
    drops = list(torch.eye(L * H, dtype=torch.bool).view(L * H, L, H))
    # after head 11 (layer 2), heads 5 and 11: from the run before, at layer 1
    drops.append(drops[5] | drops[11])
    values = (None, torch.randn(L, H, hd), torch.randn(L, H, x.shape[1], hd))
    ablations = [(drop, value) for value in values for drop in drops]
    # layer 0's head with another value, and a head of layer 2: from layer 0
    ablations += [(drops[1], None), (drops[1] | drops[8], values[1])]
    got = circuits.ablated_losses(model, batches, ablations)
    expected = [batches_loss(model, batches)]
    for drop, value in ablations:
        with circuits.replaced_heads(model, drop, value):
            expected.append(batches_loss(model, batches))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=got.dtype), rtol=0, atol=1e-5)
    assert (got[1:] - got[0]).abs().min() > 1e-4  # every ablation changes the loss


def test_pruning_removes_heads_least_important_first_and_counts_the_prunable(rows):
    """The pruning curve, rebuilt from whole-row losses of models with W_O columns zeroed: the
    order is by single-head importance, each point removes one more head (cumulative), and
    prunable is where the rise first reaches the tolerance. A wrong order, a mask that is not
    cumulative or an off-by-one count fails."""
    x, y, tok = rows
    model = random_model(tok)
    L, H = 2, 4
    heads = [(a, b) for a in range(L) for b in range(H)]
    with torch.no_grad():
        base = float(model(x, y)[1])
        single = {k: float(scaled(model, {k: 0.0})(x, y)[1]) - base for k in heads}
        order = sorted(heads, key=lambda k: single[k])
        curve = [
            float(scaled(model, dict.fromkeys(order[:n], 0.0))(x, y)[1]) for n in range(L * H + 1)
        ]
    rises = [loss - base for loss in curve[1:]]
    assert len(set(single.values())) == L * H  # distinct: the order is well defined
    tolerance = sorted(rises)[L * H // 2]  # a tolerance inside the curve: 0 < prunable < L*H
    expected = next(n for n, rise in enumerate(rises) if rise >= tolerance)
    assert 0 < expected < L * H

    report = analyse(model, x, y, tolerance=tolerance)
    assert report.pruning_order == order
    assert report.pruning_losses == pytest.approx(curve, abs=1e-5)
    assert report.prunable == expected
    assert report.loss == pytest.approx(base, abs=1e-5)
    for (a, b), value in single.items():
        assert float(report.zero_importance[a, b]) == pytest.approx(value, abs=1e-5)


def test_report_is_json_summaries_do_not_depend_on_head_count(rows):
    x, y, tok = rows
    one = analyse(random_model(tok, n_head=1), x, y)
    eight = analyse(random_model(tok, n_head=8), x, y)
    assert one.summaries().keys() == eight.summaries().keys()
    assert {f"heads/role/{r}" for r in ROLES} <= set(one.summaries())
    assert sum(eight.role_counts().values()) == 16
    data = json.loads(json.dumps(eight.to_dict()))
    assert len(data["heads"]) == 16 and data["pruning"]["prunable"] == eight.prunable
    # nan where a measure does not apply (no induction head to zero), null in JSON
    summaries = eight.summaries().items()
    assert data["summaries"] == {
        k: None if math.isnan(v) else pytest.approx(v) for k, v in summaries
    }
    text = eight.markdown()
    # ... and said in words in the notes, never printed as a number
    assert "no head reaches prefix matching 0.5" in text and "nan" not in text
    table = text.splitlines()
    assert table[0].startswith("| layer | head | role | score | lift | entropy")
    head_rows = table[2 : 2 + 16]  # then the notes
    assert len([line for line in head_rows if line.startswith("| 1 |")]) == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_importance_moves_the_rows_to_the_models_device(rows):
    """issue 22, item 5: the analysis ran a GPU model on CPU rows and crashed: no more."""
    x, y, tok = rows
    model = random_model(tok)
    on_cpu = analyse(model, x, y).zero_importance
    on_gpu = analyse(model.cuda(), x, y).zero_importance  # rows stay on the CPU
    torch.testing.assert_close(on_gpu, on_cpu, rtol=0, atol=1e-4)


def test_a_role_needs_the_majority_of_the_attention_above_chance():
    mass = {"previous": torch.tensor([[0.6, 0.45, 0.3]]), "vowel": torch.tensor([[0.7, 0.2, 0.8]])}
    lift = {"previous": torch.tensor([[5.0, 4.0, 3.0]]), "vowel": torch.tensor([[1.2, 0.5, 2.0]])}
    roles, scores = roles_of(mass, lift)
    # 0.7 on vowels at 1.2 times chance is no role; 0.45 on the previous character no majority
    assert roles == [["previous", "mixed", "vowel"]]
    torch.testing.assert_close(scores, torch.tensor([[0.6, 0.45, 0.8]], dtype=torch.float64))


# ----------------------------------------------------------------------------- copying


def hand_model() -> GPT:
    """One layer, one head, V = 3 tokens, C = 4 channels, every weight 0 but the embeddings:
    token a is 2 e_a, of RMS 1, which RMSNorm (norm1) leaves as it is."""
    model = GPT(GPTConfig(vocab_size=3, block_size=4, n_layer=1, n_embd=4, n_head=1,
                          norm="rmsnorm"))  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.wte.weight.copy_(2.0 * torch.eye(3, 4))
    return model


def test_position_mean_ablation_spares_heads_that_see_positions_only(rows):
    """With every token embedded as 0, each head's output depends on its position alone: its
    mean at each position is its output, and replacing it by that changes nothing, while its
    mean over all positions does."""
    x, y, tok = rows
    model = random_model(tok)
    with torch.no_grad():
        model.wte.weight.zero_()
    report = analyse(model, x, y, induction=False)
    assert report.position_importance.abs().max() < 1e-5
    assert report.mean_importance.abs().max() > 1e-3


def test_layer0_copying_matches_a_hand_computation():
    """hand_model's head: its OV table by hand, then its copying score."""
    model = hand_model()
    with torch.no_grad():
        w = model.blocks[0].attn.qkv.weight  # (12, 4): rows [8, 12) are V's
        w[8, 2] = 1.0  # v[0] = x[2]
        w[9, 0] = -1.0  # v[1] = -x[0]
        model.blocks[0].attn.proj.weight[3, 0] = 1.0  # out[3] = v[0]
        model.blocks[0].attn.proj.weight[2, 1] = 1.0  # out[2] = v[1]
        model.lm_head.weight.copy_(torch.tensor([[0, 0, 0, 1.0], [0, 0, 1.0, 0], [0, 0, 0, 0]]))
    # e_a = 2 one_hot(a); token 2: v = (2, 0) -> out[3] = 2 -> logit of token 0 = 2; token 0:
    # v = (0, -2) -> out[2] = -2 -> logit of token 1 = -2: OV = [[0, -2, 0], [0, 0, 0], [2, 0, 0]]
    # is nilpotent: every eigenvalue 0, no preference
    assert circuits.copying(model)[0] == 0.0
    with torch.no_grad():  # a copying head: OV = diag(2, 2, 0), each token raises itself
        w[8:12].zero_()
        w[8, 0] = w[9, 1] = 1.0
    assert circuits.copying(model)[0] == pytest.approx(1.0)


def test_copying_score_of_known_matrices():
    torch.manual_seed(0)
    V = 27
    near_identity = torch.eye(V) * 3 + 0.1 * torch.randn(V, V)
    assert float(circuits.copying_score(near_identity)) > 0.95
    assert float(circuits.copying_score(-torch.eye(V))) == pytest.approx(-1.0)
    assert float(circuits.copying_score(torch.zeros(V, V))) == 0.0
    # a rotation by 90 degrees: eigenvalues +/- i, nothing raised or lowered
    rotation = torch.tensor([[0.0, -1], [1, 0]])
    assert float(circuits.copying_score(rotation)) == pytest.approx(0.0, abs=1e-9)
    # random matrices: no copying on average (the old positive-mass share gave 0.33 here)
    scores = torch.stack([circuits.copying_score(torch.randn(V, V)) for _ in range(200)])
    assert abs(float(scores.mean())) < 0.02
    assert float(scores.abs().max()) < 0.5
