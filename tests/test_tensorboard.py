import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from microgpt.draw import render_offset_profile
from microgpt.heads import attention_entropy
from microgpt.model import GPT, GPTConfig
from microgpt.tensorboard import (
    BOUNDARY_LABEL,
    TensorBoardLogger,
    labels_for,
    sanitize_hparams,
)
from microgpt.tokenizer import CharTokenizer

SIZE_GUIDANCE = {"images": 0, "scalars": 0, "tensors": 0}


def load(path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance=SIZE_GUIDANCE)
    acc.Reload()
    return acc


# ----------------------------------------------------------------------------- labels


def test_labels_for_shows_the_boundary_apart_from_a_real_dot():
    tok = CharTokenizer("aem")
    assert labels_for([0] + tok.encode("emma"), tok) == [BOUNDARY_LABEL, *"emma"]
    dotted = CharTokenizer("a.b")  # "." is a character of this data
    labels = labels_for([0, *dotted.encode("a.b")], dotted)
    assert labels == [BOUNDARY_LABEL, "a", ".", "b"] and BOUNDARY_LABEL != "."


# ----------------------------------------------------------------------------- entropy


def test_attention_entropy_uniform_one_hot_and_mask():
    B, H, T = 2, 3, 4
    uniform = torch.full((B, H, T, T), 1 / T)
    one_hot = torch.zeros(B, H, T, T)
    one_hot[..., 0] = 1.0
    every = torch.ones(B, T, dtype=torch.bool)
    ent = attention_entropy([uniform, one_hot], every)
    assert ent.shape == (2, H) and ent.dtype == torch.float32
    torch.testing.assert_close(ent[0], torch.full((H,), math.log(T)))
    torch.testing.assert_close(ent[1], torch.zeros(H))

    # queries 0..1 are one-hot, 2..3 uniform; masking out 2..3 leaves only the one-hot ones
    mixed = one_hot.clone()
    mixed[:, :, 2:] = 1 / T
    first_two = torch.tensor([[True, True, False, False]] * B)
    torch.testing.assert_close(attention_entropy([mixed], first_two), torch.zeros(1, H))
    torch.testing.assert_close(
        attention_entropy([mixed], every), torch.full((1, H), math.log(T) / 2)
    )


def test_attention_entropy_of_a_causal_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, block_size=6, n_layer=2, n_embd=16, n_head=2))
    x = torch.tensor([[0, 1, 2, 3, 4, 0], [0, 2, 0, 0, 0, 0]])
    y = torch.tensor([[1, 2, 3, 4, 0, -1], [2, 0, -1, -1, -1, -1]])
    _, _, att = model(x, y, return_attn=True)
    ent = attention_entropy(att, y >= 0)
    assert ent.shape == (2, 2)
    # query i sees i+1 keys: between 0 and log(i+1), so below the mean of log(i+1) over the queries
    bound = (sum(math.log(i + 1) for i in range(5)) + sum(math.log(i + 1) for i in range(2))) / 7
    assert (ent >= 0).all() and (ent <= bound + 1e-5).all()


# ----------------------------------------------------------------------------- the logger


def test_sanitize_hparams():
    hp = sanitize_hparams(
        {
            "lr": 1e-3,
            "n_head": 4,
            "bias": False,
            "n_kv_head": None,
            "betas": [0.9, 0.95],
            "model": {"norm": "rmsnorm"},
            "t": torch.tensor(2.0),
        }
    )
    assert hp == {
        "lr": 1e-3,
        "n_head": 4,
        "bias": "false",
        "n_kv_head": "none",
        "betas": "[0.9, 0.95]",
        "model.norm": "rmsnorm",
        "t": 2.0,
    }


def test_logger_writes_everything_into_the_run_folder(tmp_path):
    L, H, T = 2, 3, 5
    labels = list(".emma")
    attention = [torch.softmax(torch.randn(H, T, T), dim=-1) for _ in range(L)]
    with TensorBoardLogger(tmp_path) as tb:
        for step in (0, 10):
            tb.scalars(step, {"loss/train": 2.1 - step / 100, "lr": torch.tensor(1e-3)})
        tb.attention_maps(10, attention, labels)
        tb.attention_entropy(10, torch.rand(L, H))
        tb.samples(10, ["emma", "olivia (in train)", "zoe *new*"])
        tb.hparams({"n_head": H, "lr": 1e-3, "dropout": None}, {"hparams/best_val_loss": 1.9})

    assert [p.is_file() for p in tmp_path.iterdir()] == [True]  # one event file, no subfolder
    acc = load(tmp_path)
    tags = acc.Tags()
    assert {"loss/train", "lr", "hparams/best_val_loss"} <= set(tags["scalars"])
    assert [e.step for e in acc.Scalars("loss/train")] == [0, 10]
    assert acc.Scalars("hparams/best_val_loss")[0].value == pytest.approx(1.9)
    expected_images = {f"attention/layer{l}/head{h}" for l in range(L) for h in range(H)}
    expected_images |= {f"attention/layer{l}" for l in range(L)}
    assert set(tags["images"]) == expected_images
    head, layer = acc.Images("attention/layer0/head0")[0], acc.Images("attention/layer0")[0]
    assert head.step == 10 and layer.width > H * head.width * 0.9
    assert {f"attention_entropy/layer{l}/head{h}" for l in range(L) for h in range(H)} <= set(
        tags["scalars"]
    )
    text = acc.Tensors("samples")[0].tensor_proto.string_val[0].decode()
    assert "emma" in text and "olivia (in train)" in text and len(text.splitlines()) == 3
    hp = acc.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hp)


def test_logger_purge_step_on_an_existing_folder(tmp_path):
    with TensorBoardLogger(tmp_path) as tb:
        for step in range(10):
            tb.scalars(step, {"loss/train": 1.0})
    with TensorBoardLogger(tmp_path, purge_step=5) as tb:  # resumed from the step-5 checkpoint
        for step in range(5, 8):
            tb.scalars(step, {"loss/train": 2.0})
    points = [(e.step, e.value) for e in load(tmp_path).Scalars("loss/train")]
    assert points == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 8)]


def test_logger_writes_offset_profiles_per_layer(tmp_path):
    L, H, K = 2, 3, 4
    profiles = [torch.rand(H, K) / K for _ in range(L)]
    starts = [torch.rand(H) for _ in range(L)]
    with TensorBoardLogger(tmp_path) as tb:
        tb.offset_profiles(7, profiles, starts)
    acc = load(tmp_path)
    assert set(acc.Tags()["images"]) == {f"heads/offsets/layer{l}" for l in range(L)}
    event = acc.Images("heads/offsets/layer1")[0]
    expected = render_offset_profile(profiles[1].numpy(), starts[1].numpy(), "layer 1")
    assert event.step == 7 and (event.height, event.width) == expected.shape[:2]
