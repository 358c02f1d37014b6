"""Configs compose for every preset and group; bad settings stop with a message naming them."""

import os

import pytest
from omegaconf import OmegaConf

from microgpt.config import ConfigError, load_config
from tests.conftest import compose_config


@pytest.mark.parametrize(
    "preset,layers,embd,heads", [("micro", 1, 16, 4), ("small", 4, 64, 4), ("base", 6, 384, 6)]
)
def test_model_presets_compose(preset, layers, embd, heads):
    config = load_config(compose_config([f"model={preset}", "out_dir=."]))
    assert (config.model.n_layer, config.model.n_embd, config.model.n_head) == (layers, embd, heads)
    assert config.model.name == preset


def test_default_config_is_small_on_names():
    config = load_config(compose_config(["out_dir=."]))
    assert config.model.name == "small"
    assert config.data.path == "data/names.txt"
    # issue 27's recipe: Muon, weight averaging, names packed into rows
    assert (config.optim.name, config.optim.weight_decay) == ("muon", 0.1)
    assert (config.train.ema, config.train.pack) == (0.995, 32)


def test_experiments_measured_with_adamw_keep_it():
    """The induction, microgpt.py and long experiments' figures were measured with AdamW,
    unaveraged, padded: they pin that recipe whatever the defaults."""
    for name in ("induction", "microgpt", "long"):
        config = load_config(compose_config([f"experiment={name}", "out_dir=."]))
        assert (config.optim.name, config.train.ema, config.train.pack) == ("adamw", 0.0, 0)


def test_heads_sets_the_models_head_count():
    config = load_config(compose_config(["heads=8", "out_dir=."]))
    assert config.model.n_head == 8 and config.heads == 8


def test_micro_preset_matches_microgpt_py():
    m = load_config(compose_config(["model=micro", "out_dir=."])).model
    assert (m.norm, m.activation, m.bias, m.tie_weights, m.block_size) == (
        "rmsnorm",
        "relu",
        False,
        False,
        16,
    )


def test_experiment_microgpt_composes():
    config = load_config(compose_config(["experiment=microgpt", "out_dir=."]))
    assert config.model.name == "micro"
    assert config.train.batch_size == 1 and config.train.max_steps == 1000
    assert config.optim.lr == 0.01 and list(config.optim.betas) == [0.85, 0.99]
    assert config.optim.decay == "linear" and config.optim.min_lr_ratio == 0.0


def test_resolved_config_round_trips_through_yaml():
    config = load_config(compose_config(["out_dir=/tmp/x"]))
    again = load_config(OmegaConf.create(OmegaConf.to_yaml(OmegaConf.structured(config))))
    assert again == config


def test_typo_in_a_key_is_refused_by_the_schema():
    with pytest.raises(Exception, match="modle|not in struct|Could not override"):
        compose_config(["modle.n_head=4"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["heads=3"],
            r"n_embd=64 is not divisible by heads=3.*heads in \[1, 2, 4, 8, 16, 32, 64\]",
        ),
        (["model.n_head=5"], r"model.n_embd=64 is not divisible by model.n_head=5"),
        (["model.n_kv_head=3"], r"model.n_kv_head=3.*\[1, 2, 4\]"),
        (["model.n_layer=0"], r"model.n_layer=0 must be a positive integer"),
        (["model.attn_impl=flash"], r"model.attn_impl='flash' is unknown.*loop.*batched.*sdpa"),
        (["model.norm=batchnorm"], r"model.norm='batchnorm' is unknown"),
        (["model.activation=tanh"], r"model.activation='tanh' is unknown"),
        (["model.dropout=1.5"], r"model.dropout=1.5 must be in \[0, 1\)"),
        (["train.max_steps=0"], r"train.max_steps=0 must be at least 1"),
        (["train.batch_size=-1"], r"train.batch_size=-1 must be at least 1"),
        (["optim.lr=0"], r"optim.lr=0.0 must be > 0"),
        (["optim.decay=step"], r"optim.decay='step' is unknown"),
        (["optim.betas=[0.9]"], r"optim.betas=\[0.9\] must be two numbers"),
        (["device=tpu"], r"device='tpu' is unknown"),
        (["optim.eps=-1"], r"optim.eps=-1.0 must be > 0"),
        (["seed=-5"], r"seed=-5 must be in \[0, 2\*\*63\)"),
        # settings that can only train nothing, or would be ignored, are refused with why
        (["optim.eps=1e300"], r"optim.eps=1e\+300 divides every update .* would not move"),
        (["optim.eps=1.0"], r"optim.eps=1.0 divides every update"),
        (["train.num_samples=1000000000"], r"train.num_samples=1000000000 would sample for abo"),
        (["model.vocab_size=50"], r"model.vocab_size=50: the vocabulary comes from the data"),
    ],
)
def test_bad_settings_stop_with_a_clear_message(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(compose_config([*overrides, "out_dir=."]))


def test_a_warmup_longer_than_the_run_is_cut_to_a_tenth_of_it_and_said():
    from microgpt.train.optim import fit_warmup

    config = load_config(
        compose_config(["optim.warmup_steps=100", "train.max_steps=40", "out_dir=."])
    )
    fitted, line = fit_warmup(config)
    assert fitted.optim.warmup_steps == 4
    assert line == "optim.warmup_steps=100 is longer than the run (train.max_steps=40): using 4"
    assert fit_warmup(fitted) == (fitted, None)  # a warmup that fits is kept as it is


def test_wrong_type_is_refused_while_composing():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="train.max_steps=lots"):
        compose_config(["train.max_steps=lots"])


def test_wrong_type_in_a_plain_dict_names_the_setting():
    with pytest.raises(ConfigError, match="train.max_steps"):
        load_config({"train": {"max_steps": "lots"}})


@pytest.mark.parametrize("preset,params", [("micro", 4192), ("small", None), ("base", None)])
def test_preset_yaml_builds_the_promised_model(preset, params):
    from microgpt.model import GPT

    config = load_config(compose_config([f"model={preset}", "out_dir=."]))
    block = config.model.block_size or 16
    model = GPT(config.model_for_data(vocab_size=27, block_size=block))
    if params is not None:
        assert model.num_params() == params
    elif preset == "small":
        assert 180_000 < model.num_params() < 220_000
    else:
        assert model.config.block_size == 256 and model.config.n_head == 6


def test_a_signal_during_the_conversion_is_delivered_after_it(monkeypatch):
    """SIGTERM arriving inside OmegaConf (a run stopped while it starts) is raised once the
    conversion is done, as the handler's own exception, not inside OmegaConf (where it left an
    AttributeError and a traceback), even while another thread lives (tqdm's monitor): the OS may
    hand the signal to that thread, and Python still runs the handler in the main one."""
    import signal
    import threading

    from omegaconf import OmegaConf

    real, reached = OmegaConf.to_object, []

    def convert_while_a_signal_arrives(cfg):  # called again for each nested group
        if not reached:
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after the signal")
        return real(cfg)

    def stop(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(OmegaConf, "to_object", convert_while_a_signal_arrives)
    previous = signal.signal(signal.SIGTERM, stop)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            load_config(compose_config(["out_dir=."]))
    finally:
        done.set()
        other.join()
        signal.signal(signal.SIGTERM, previous)
    assert reached == ["after the signal"]
