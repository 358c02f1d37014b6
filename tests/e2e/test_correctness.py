"""Correctness where no test looked before: resume state on the CPU, precision, memory bounds,
data normalisation, and empty samples. Each test names the bug it guards against."""

from __future__ import annotations

import pytest
import torch

import microgpt.checkpoint
import microgpt.train.state
from microgpt import system
from microgpt.checkpoint import Checkpoint
from microgpt.config import ConfigError, DataConfig, load_config
from microgpt.data.dataset import DataError, load_data
from microgpt.model import GPT, GPTConfig
from microgpt.sample.generate import (
    CACHE_BUDGET,
    DEFAULT_BATCH,
    SamplingError,
    default_batch,
    sample_items,
)
from microgpt.sample.report import format_marked, mark_items
from microgpt.tokenizer import CharTokenizer
from microgpt.train.loss import evaluate
from microgpt.train.trainer import Trainer, train
from tests.e2e.harness import run

# ----------------------------------------------------------------------------- resume on a GPU


# loading CPU weights into the meta model is a no-op, which torch says once per parameter
@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter:UserWarning")
def test_resume_state_is_loaded_on_the_cpu_whatever_the_device(tiny_cfg, monkeypatch):
    """Bug: last.pt was loaded with map_location=<the training device>, so on CUDA the saved RNG
    states landed on the GPU and torch.set_rng_state raised a TypeError. Without a GPU, the
    resumed run here trains on the meta device, as unusable for an RNG state as CUDA: the
    resume must restore CPU byte tensors and never ask torch.load for another device."""
    train(tiny_cfg("device=cpu", "train.max_steps=3", "train.num_samples=0"))
    locations, restored = [], []
    real_load, real_set = torch.load, torch.set_rng_state

    def recording_load(path, map_location=None, **kw):
        locations.append(str(map_location))
        return real_load(path, map_location=map_location, **kw)

    monkeypatch.setattr(microgpt.checkpoint.torch, "load", recording_load)
    monkeypatch.setattr(torch, "set_rng_state", lambda s: (restored.append(s), real_set(s)))
    monkeypatch.setattr(system, "pick_device", lambda name, error=None: torch.device("meta"))
    cfg = tiny_cfg("device=cpu", "train.max_steps=4", "train.num_samples=0", "resume=true")
    trainer = Trainer(load_config(cfg))
    assert trainer.device.type == "meta" and trainer.step == 3
    assert locations == ["cpu"]
    assert restored and all(s.device.type == "cpu" and s.dtype == torch.uint8 for s in restored)


def test_set_rng_state_takes_states_of_any_dtype_and_device_type_kept_as_bytes():
    state = microgpt.train.state.rng_state()
    as_long = {**state, "torch": state["torch"].long()}  # what a careless copy might leave
    microgpt.train.state.set_rng_state(as_long)
    assert torch.equal(torch.get_rng_state(), state["torch"])


# ----------------------------------------------------------------------------- precision


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla T4")
    with pytest.raises(ConfigError, match=r"Tesla T4 has no bf16 support; use train.precision=fp"):
        system.pick_precision("bf16", torch.device("cuda"), ConfigError)


def test_fp16_scaler_state_resumes_exactly(tiny_cfg, tmp_path):
    """fp16 autocast on the CPU with a gradient scaler: stopped after 4 of 8 steps and resumed,
    the scaler's state is the one step 4 left."""
    fp16 = ("device=cpu", "train.precision=fp16", "train.num_samples=0", "train.eval_every=4")
    first = Trainer(load_config(tiny_cfg(*fp16, "train.max_steps=4")))
    first.run()
    second = Trainer(load_config(tiny_cfg(*fp16, "train.max_steps=8", "resume=true")))
    assert first.scaler.is_enabled() and second.scaler.state_dict() == first.scaler.state_dict()
    assert second.scaler.state_dict()["_growth_tracker"] == 4


# ----------------------------------------------------------------------------- memory


def test_one_causal_mask_for_all_layers_and_no_block_sized_buffers():
    """Bug: every layer registered its own block_size x block_size mask (1.6 GB for a 20,000-
    character line over 4 layers). Now no buffer depends on block_size."""
    model = GPT(GPTConfig(block_size=4096, n_layer=4))
    assert sum(b.numel() for b in model.buffers()) == 0


def test_default_sampling_batch_is_bounded_by_the_cache_budget():
    small = GPT(GPTConfig(block_size=16))
    assert default_batch(small, 5000) == DEFAULT_BATCH
    long = GPT(GPTConfig(block_size=8192, n_layer=4, n_embd=64))
    per_row = 2 * 4 * 4 * 8192 * 16 * 4  # keys + values, layers, heads, positions, hd, float32
    assert default_batch(long, 5000) == CACHE_BUDGET // per_row < DEFAULT_BATCH


def test_a_sampling_batch_no_memory_holds_is_refused():
    model = GPT(GPTConfig(block_size=16))
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz")
    with pytest.raises(SamplingError, match=r"batch_size=\d+ with the KV cache needs about .* GiB"):
        sample_items(model, tok, 10**12, batch_size=10**12)


def test_a_batch_no_memory_holds_is_refused_before_allocating(tiny_cfg):
    """(A block of the same size: the harness's block-too-large-for-memory.)"""
    with pytest.raises(ConfigError, match=r"train.batch_size=1000000000 needs about"):
        Trainer(load_config(tiny_cfg("device=cpu", "train.batch_size=1000000000")))


# ----------------------------------------------------------------------------- data


def test_a_long_item_is_named_by_its_number_and_first_characters(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("anna\nbob\ncarl\n" + "x" * 20_000 + "\n")
    with pytest.raises(DataError) as e:
        load_data(DataConfig(str(path)), block_size=16)
    message = str(e.value)
    assert "item 4 ('xxxxxxxxxx" in message and len(message) < 400


# ----------------------------------------------------------------------------- samples


def test_an_empty_sample_is_reported_as_empty_and_not_as_new():
    """Bug: an item that ended at once (the boundary first) was counted as a new name."""
    marked = mark_items(["", "anna", "zed"], None)
    assert marked == [("", "empty"), ("anna", "new"), ("zed", "new")]
    assert format_marked(marked)[-1] == "2 of 3 new, 2 unique, 1 empty"


# ----------------------------------------------------------------------------- weight averaging


def test_weight_average_is_evaluated_kept_as_best_and_resumes_exactly(tiny_cfg, tmp_path):
    """train.ema: the average (not the trained weights) is what is evaluated and what best.pt
    holds; a resume restores the average too, so stopping after 4 of 8 steps changes nothing."""

    ema = ("device=cpu", "train.ema=0.9", "train.num_samples=0", "train.eval_every=4")
    ema += ("optim.decay=constant", "optim.warmup_steps=0")  # the same schedule for 4 or 8 steps
    whole = Trainer(load_config(tiny_cfg(*ema, "train.max_steps=8", out=tmp_path / "whole")))
    metrics = whole.run()
    averaged = whole.ema.state_dict()
    assert not torch.equal(whole.model.state_dict()["lm_head.weight"], averaged["lm_head.weight"])
    best = Checkpoint.load(tmp_path / "whole" / "checkpoints" / "best.pt")
    if best.step == 8:  # the last evaluation was the best: best.pt is the final average
        assert torch.equal(best.model["lm_head.weight"], averaged["lm_head.weight"])
    assert metrics["val_loss"] == pytest.approx(
        evaluate(whole.ema.model, whole.datasets["val"], 1000), abs=1e-6
    )
    train(tiny_cfg(*ema, "train.max_steps=4", out=tmp_path / "split"))
    resumed = tiny_cfg(*ema, "train.max_steps=8", "resume=true", out=tmp_path / "split")
    second = Trainer(load_config(resumed))
    second.run()
    for k, v in averaged.items():
        assert torch.equal(v, second.ema.state_dict()[k]), k


# ------------------------------------------------------------------------- resume across versions


def test_a_run_saved_before_a_setting_existed_resumes_and_the_data_may_move(
    tiny_cfg, tmp_path, names_file
):
    """A checkpoint written before train.ema existed holds no such key: it counts as off (0), the
    only value there was (a library caller resumes it with train.ema=0; the command line takes
    the checkpoint's settings itself).
    The same data at another path is the same data (its items and split are compared)."""

    ema = "train.ema=0"
    train(tiny_cfg("device=cpu", "train.max_steps=3", "train.num_samples=0", ema))
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    old = Checkpoint.load(last)
    del old.train_config["train"]["ema"]
    old.save(last)
    moved = tmp_path / "elsewhere.txt"
    moved.write_bytes(names_file.read_bytes())
    cfg = tiny_cfg("device=cpu", "train.max_steps=5", "resume=true", f"data.path={moved}", ema)
    trainer = Trainer(load_config(cfg))
    assert trainer.step == 3
    names = names_file.read_text().split()
    moved.write_text("\n".join(names[1:]) + "\n")  # other data at that path: refused
    with pytest.raises(ConfigError, match=r"the data of a run cannot change"):
        Trainer(load_config(cfg))


def test_seeds_share_the_split_and_a_run_from_before_split_seed_resumes_on_its_own(
    tiny_cfg, tmp_path
):
    """The split has its own seed (data.split_seed): runs of other seeds are scored on the same
    validation and test items. A run from before it split its items by `seed`: its checkpoint
    says so (data.split_seed = its seed) and the command line resumes it on that split."""

    splits = {}
    for seed in (7, 8):
        cfg = tiny_cfg("train.max_steps=2", "train.num_samples=0", f"seed={seed}",
                       out=tmp_path / f"seed{seed}")  # fmt: skip
        train(cfg)
        splits[seed] = Checkpoint.load(tmp_path / f"seed{seed}/checkpoints/last.pt").split
    assert splits[7] == splits[8]
    cfg = tiny_cfg("train.max_steps=2", "train.num_samples=0", "seed=7", "data.split_seed=7")
    train(cfg)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    old = Checkpoint.load(last)
    assert old.split != splits[7]  # split_seed moves the split
    del old.train_config["data"]["split_seed"]  # as written before data.split_seed existed
    old.save(last)
    assert Checkpoint.load(last).data["split_seed"] == 7
    r = run("train.py", f"resume={last}", "train.max_steps=3", cwd=tmp_path)
    assert r.code == 0 and "split seed 7" in r.stdout, r.text[-2000:]


def test_sampling_builds_no_autograd_graph():
    """Bug: sample_items called the decoding loop without no_grad, so every step recorded a
    graph (25% slower one name at a time)."""
    model = GPT(GPTConfig(block_size=8))
    recorded = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: recorded.append(out.requires_grad))
    sample_items(model, CharTokenizer("abcdefghijklmnopqrstuvwxyz"), 3, seed=0, batch_size=1)
    assert recorded and not any(recorded)


# ---------------------------------------------------------------- checkpoints along the way


def test_save_every_keeps_step_checkpoints_that_sample_and_heads_accept(tiny_cfg, tmp_path):
    from microgpt.commands.sample import run_sampling

    # train.ema=0: a step checkpoint holds the trained weights, as last.pt does
    save = ("device=cpu", "train.save_every=4", "train.num_samples=0", "train.ema=0")
    train(tiny_cfg(*save))
    folder = tmp_path / "run" / "checkpoints"
    steps = sorted(p.name for p in folder.glob("step-*.pt"))
    assert steps == ["step-000004.pt", "step-000008.pt", "step-000012.pt"]
    first = Checkpoint.load(folder / "step-000004.pt")
    assert first.step == 4 and first.resume is None  # weights and config, no optimizer
    last = Checkpoint.load(folder / "last.pt")
    twelve = Checkpoint.load(folder / "step-000012.pt")
    assert all(torch.equal(twelve.model[k], last.model[k]) for k in last.model)
    assert not torch.equal(first.model["lm_head.weight"], twelve.model["lm_head.weight"])
    result = run_sampling(ckpt=str(folder / "step-000004.pt"), num_samples=3, seed=0)
    assert len(result.names) == 3 and result.step == 4  # heads': tests/heads/test_heads.py
