"""The induction experiment (experiment=induction): generated repeated spans, an attention-only
model, the induction test logged during training."""

from __future__ import annotations

from microgpt.config import load_config
from microgpt.data.dataset import load_data
from microgpt.data.repeats import repeat_items
from microgpt.model import GPT, GPTConfig
from microgpt.runs import RunFolder
from tests.conftest import compose_config

# the experiment made small: 10 characters, spans of 2..6 in items of 12, 32 channels, 200 steps
SMALL = (
    "experiment=induction data.repeats.chars=abcdefghij data.repeats.span=[2,6] "
    "data.repeats.length=12 data.repeats.items=1000 model.n_embd=32 heads=2 optim.lr=3e-3 "
    "train.batch_size=32 train.max_steps=200 train.eval_every=200 train.num_samples=0 "
    "log.attn_every=200 log.head_items=64"
).split()


def test_repeat_items_are_generated_from_their_own_seed():
    items = repeat_items(20, "abcdefgh", (2, 4), 10, seed=3)
    assert items == repeat_items(20, "abcdefgh", (2, 4), 10, seed=3)
    assert items != repeat_items(20, "abcdefgh", (2, 4), 10, seed=4)
    assert all(len(item) == 10 and set(item) <= set("abcdefgh") for item in items)

    # each item holds some span of >= 2 distinct characters twice in a row
    def has_repeat(s):
        return any(
            s[a : a + n] == s[a + n : a + 2 * n] and len(set(s[a : a + n])) == n
            for n in range(2, 5)
            for a in range(len(s) - 2 * n + 1)
        )

    assert all(has_repeat(item) for item in items)


def test_the_repeats_format_loads_like_lines_without_a_file(tmp_path):
    cfg = load_config(compose_config([*SMALL, f"out_dir={tmp_path}"]))
    data = load_data(cfg.data)
    assert data.block_size == 13 and data.tokenizer.vocab_size == 11
    assert len(data.split.val) == len(data.split.test) == 100


def test_an_attention_only_model_has_no_mlp_and_old_configs_keep_theirs():
    config = GPTConfig(vocab_size=5, block_size=4, n_layer=2, n_embd=8, n_head=2, mlp=False)
    model = GPT(config)
    assert not any("mlp" in name or "norm2" in name for name, _ in model.named_parameters())
    old = {k: v for k, v in config.to_dict().items() if k != "mlp"}  # a checkpoint before mlp
    assert GPTConfig(**old).mlp is True


def test_the_small_induction_experiment_learns_to_copy_the_repeat(tmp_path):
    from microgpt.train.trainer import train

    cfg = compose_config([*SMALL, f"out_dir={tmp_path}"])
    train(cfg)
    last = [m for m in RunFolder(tmp_path).metrics() if "heads/repeat_loss" in m][-1]
    assert last["step"] == 200
    # the first copy stays near ln(10) = 2.30; the repeat is predicted from its first copy
    assert last["heads/repeat_loss_first"] > 2.1
    assert last["heads/repeat_loss"] < last["heads/repeat_loss_first"] - 0.2
    assert last["heads/repeat_loss_gain"] > 0.2
