"""What a head looks for: content roles against chance, the induction test on repeated spans."""

from __future__ import annotations

import math

import pytest
import torch

from microgpt.data.repeats import repeated_spans, span_for
from microgpt.heads.analyse import analyse, induction_test
from microgpt.heads.roles import class_members, pattern_sums, patterns_of, relation_masks
from microgpt.model import GPT, GPTConfig
from microgpt.tokenizer import CharTokenizer

BLOCK = 8


def describe(attention, x, y, tok):
    """Roles, mass and lift of hand-made attention (per layer (B, H, T, T)) on rows x, y."""
    chars = "".join(tok.chars)
    counts = torch.bincount(x.flatten(), minlength=tok.vocab_size)
    members = class_members(chars, tok.vocab_size, counts)
    sums = [pattern_sums(a, x, y >= 0, members, chars) for a in attention]
    found = patterns_of(sums)
    return found["roles"], found["scores"], found["mass"], found["lift"]


def uniform(x, H=1):
    B, T = x.shape
    causal = torch.ones(T, T).tril()
    return (causal / causal.sum(dim=1, keepdim=True)).expand(B, H, T, T).clone()


def attend(x, keys):
    """(B, T, T) bool keys each query looks at -> attention spread evenly over them (uniform
    over all its keys where a query has none), (B, 1, T, T)."""
    w = keys.double()
    none = w.sum(dim=-1, keepdim=True) == 0
    w = torch.where(none, uniform(x)[:, 0].double(), w)
    return (w / w.sum(dim=-1, keepdim=True))[:, None]


# ----------------------------------------------------------------------------- against chance


def test_uniform_attention_has_lift_one_for_every_pattern(rows):
    x, y, tok = rows
    _, _, mass, lift = describe([uniform(x, H=2)], x, y, tok)
    expected = {"previous", "start", "vowel", "consonant", "rare", "duplicate", "induction"}
    assert expected <= set(lift)
    assert "newline" not in lift and "line_start" not in lift  # names have no newline: left out
    for name, value in lift.items():
        torch.testing.assert_close(value, torch.ones_like(value), rtol=0, atol=1e-9, msg=name)
    roles, scores, _, _ = describe([uniform(x)], x, y, tok)
    assert roles == [["mixed"]] and scores[0, 0] == 0.0


def test_a_hand_made_duplicate_head_is_a_duplicate_head(rows):
    x, y, tok = rows
    T = x.shape[1]
    earlier = torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)  # key j < query i
    dup = (x[:, :, None] == x[:, None, :]) & earlier  # keys with the query's character
    assert torch.equal(relation_masks(x, None)["duplicate"], dup)
    roles, scores, mass, lift = describe([attend(x, dup)], x, y, tok)
    assert roles == [["duplicate"]]
    assert mass["duplicate"][0, 0] == pytest.approx(1.0) and lift["duplicate"][0, 0] > 2


def test_a_line_start_and_a_word_start_head_on_text():
    text = "the cat sat\non a mat\nand it saw\na dog run by\n" * 3
    tok = CharTokenizer(set(text))
    ids = torch.tensor(tok.encode(text))
    T = 24
    x = torch.stack([ids[s : s + T] for s in range(0, len(ids) - T - 1, 3)])  # (N, T) windows
    y = torch.stack([ids[s + 1 : s + T + 1] for s in range(0, len(ids) - T - 1, 3)])
    # by hand: the key after the last newline (or space or newline) before each query
    line = torch.zeros(x.shape[0], T, T, dtype=torch.bool)
    word = torch.zeros_like(line)
    for b in range(x.shape[0]):
        last_nl = last_ws = -1
        for q in range(T):
            if last_nl >= 0:
                line[b, q, last_nl + 1] = True
            if last_ws >= 0:
                word[b, q, last_ws + 1] = True
            c = tok.itos[int(x[b, q])]
            last_nl = q if c == "\n" else last_nl
            last_ws = q if c in " \n" else last_ws
    assert torch.equal(relation_masks(x, "".join(tok.chars))["line_start"], line)
    assert torch.equal(relation_masks(x, "".join(tok.chars))["word_start"], word)
    roles, _, mass, lift = describe([attend(x, line), attend(x, word)], x, y, tok)
    assert roles == [["line_start"], ["word_start"]]
    assert lift["line_start"][0, 0] > 5 and mass["newline"][0, 0] < 0.2
    assert {"space", "newline"} <= set(mass)  # whitespace classes exist for text


def vowel_model(tok, beta: float = 12.0) -> GPT:
    """One layer, one head whose key is 1 on vowels and whose query is constant: the token
    embedding is e_id + e_bias, so after RMSNorm every query reads the same bias channel."""
    V = tok.vocab_size
    C = V + 1  # one channel per token, then a bias channel
    sizes = {"block_size": BLOCK, "n_layer": 1, "n_embd": C, "n_head": 1}
    model = GPT(GPTConfig(vocab_size=V, norm="rmsnorm", **sizes))
    vowels = [tok.stoi[c] for c in "aeiou" if c in tok.stoi]
    with torch.no_grad():
        model.wpe.weight.zero_()
        model.wte.weight.copy_(torch.eye(V, C))
        model.wte.weight[:, V] = 1.0
        w = model.blocks[0].attn.qkv.weight  # (3C, C): Q, K, V rows
        w[: 2 * C].zero_()
        w[0, V] = beta  # q = beta * bias
        w[C, vowels] = 1.0  # k = [key is a vowel]
    return model.eval()


def test_a_vowel_head_is_named_vowel(rows):
    x, y, tok = rows
    report = analyse(vowel_model(tok), x, y, tok)
    assert report.roles == [["vowel"]]
    assert report.scores[0, 0] == report.mass["vowel"][0, 0] > 0.9
    assert report.lift["vowel"][0, 0] > 1.5
    data = report.to_dict()["heads"][0]
    assert data["patterns"]["vowel"]["mass"] == pytest.approx(float(report.mass["vowel"][0, 0]))
    assert set(data["patterns"]) == set(report.mass)  # every pattern's mass and lift, raw


# ----------------------------------------------------------------------------- repeats


def test_repeated_spans_repeat_distinct_characters():
    r = repeated_spans(50, 10, (2, 5), torch.Generator().manual_seed(0), block_size=12)
    for row, L in zip(r.x.tolist(), r.lengths.tolist()):
        span = row[1 : L + 1]
        assert row[0] == 0 and row[L + 1 : 2 * L + 1] == span and len(set(span)) == L
        assert all(0 < c < 10 for c in span) and set(row[2 * L + 1 :]) <= {0}
    assert r.first.sum(dim=1).tolist() == (r.lengths - 1).tolist() == r.repeat.sum(1).tolist()
    torch.testing.assert_close(r.y[:, :-1][r.x[:, 1:] > 0], r.x[:, 1:][r.x[:, 1:] > 0])
    again = repeated_spans(50, 10, (2, 5), torch.Generator().manual_seed(0), block_size=12)
    assert torch.equal(r.x, again.x)
    assert span_for(16) == 7
    with pytest.raises(ValueError, match="does not fit"):
        repeated_spans(1, 10, 8, block_size=16)


def induction_circuit(V: int, T: int = 16, beta: float = 30.0, heads: int = 1) -> GPT:
    """Two layers wired by hand (Elhage et al.): layer 0's head 0 attends to the previous position
    and copies its token into a 'previous token' subspace (its other heads output nothing); each of
    layer 1's `heads` heads has the current token as query and the previous-token subspace as key:
    it attends to the key after an earlier occurrence of the query's token and copies its token.
    Channels: [token (V) | position (T) | previous token (V)], then zeros up to heads * C; head h
    uses the C query, key and value channels of its own block."""
    C = 2 * V + T
    E = heads * C
    sizes = {"block_size": T, "n_layer": 2, "n_embd": E, "n_head": heads}
    model = GPT(GPTConfig(vocab_size=V, norm="rmsnorm", **sizes))
    tok, pos, prev = slice(0, V), slice(V, V + T), slice(V + T, C)
    eye_v, eye_t = torch.eye(V), torch.eye(T)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.wte.weight[:, tok] = eye_v
        model.wpe.weight[:, pos] = eye_t
        w0 = model.blocks[0].attn.qkv.weight  # (3E, E): Q, K, V rows
        w0[pos, pos] = beta * eye_t  # q_i = e_i
        w0[E + V + 1 : E + V + T, pos][:, : T - 1] = eye_t[: T - 1, : T - 1]  # k_j = e_{j+1}
        w0[2 * E + V + T : 2 * E + C, tok] = eye_v  # v = the token, in the previous-token channels
        model.blocks[0].attn.proj.weight[prev, prev] = 4.0 * eye_v
        w1, proj1 = model.blocks[1].attn.qkv.weight, model.blocks[1].attn.proj.weight
        for h in range(heads):
            at = h * C
            w1[at : at + V, tok] = beta * eye_v  # q = the current token
            w1[E + at : E + at + V, prev] = eye_v  # k = the previous token
            w1[2 * E + at : 2 * E + at + V, tok] = eye_v  # v = the key's token
            proj1[tok, at : at + V] = 20.0 * eye_v  # written loud over the previous-token channels
        model.lm_head.weight[:, tok] = 5.0 * eye_v
    return model.eval()


def test_a_hand_wired_induction_circuit_scores_high_and_its_previous_head_not():
    model = induction_circuit(V=12)
    test = induction_test(model)
    assert test.span == 7
    assert test.prefix[1, 0] > 0.9, test.prefix  # the induction head
    assert test.prefix[0, 0] < 0.05  # the previous-character head
    x = repeated_spans(64, 12, 7, torch.Generator().manual_seed(5)).x
    y = torch.cat([x[:, 1:], torch.full((64, 1), -1)], dim=1)
    report = analyse(model, x, y, induction=False)
    assert report.roles[0] == ["previous"] and report.roles[1] == ["induction"]
    assert math.isnan(report.summaries()["heads/induction_max"])  # no test: nan, same tag


def test_zeroing_the_induction_heads_together_undoes_the_repeat():
    # two induction heads that share the work: either one alone still predicts the repeat
    model = induction_circuit(V=12, heads=2)
    test = induction_test(model)
    assert test.induction_heads.nonzero().tolist() == [[1, 0], [1, 1]]
    single = float((test.ablated[1] - test.loss_repeat).max())
    together = test.induction_zeroed - test.loss_repeat
    assert single < 1.0 <= together, (single, together)
    # the same loss from the model with layer 1's W_O zeroed: the heads' writes removed by hand
    with torch.no_grad():
        model.blocks[1].attn.proj.weight.zero_()
    assert induction_test(model).loss_repeat == pytest.approx(test.induction_zeroed, rel=1e-5)
    x = repeated_spans(64, 12, 7, torch.Generator().manual_seed(5)).x
    y = torch.cat([x[:, 1:], torch.full((64, 1), -1)], dim=1)
    report = analyse(induction_circuit(V=12, heads=2), x, y)
    assert report.summaries()["heads/induction_ablation_all"] == pytest.approx(together)
    assert report.to_dict()["probe"]["induction_heads"] == [[1, 0], [1, 1]]
    # no head of prefix matching >= 0.5 (layer 1 attends uniformly): nothing to zero, nan
    with torch.no_grad():
        model.blocks[1].attn.qkv.weight.zero_()
    none = induction_test(model)
    assert not none.induction_heads.any() and math.isnan(none.induction_zeroed)
    assert none.to_dict()["loss_induction_zeroed"] is None
