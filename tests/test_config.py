"""Configs compose for every preset and group; each schema (config.Config, config.SampleConfig)
refuses a bad setting with a message naming it. The schema's own checks are tested here as unit
tests of the dataclasses (no Hydra); tests/e2e/test_bad_inputs.py runs a few through the real
command line, one per kind of failure."""

import os
import signal
import threading

import pytest
from omegaconf import OmegaConf

from microgpt.config import ConfigError, SampleConfig, load_config
from microgpt.errors import UserError
from tests.conftest import compose_config


@pytest.mark.parametrize(
    "preset,layers,embd,heads", [("micro", 1, 16, 4), ("small", 4, 64, 4), ("base", 6, 384, 6)]
)
def test_model_presets_compose_and_build_the_promised_model(preset, layers, embd, heads):
    from microgpt.model import GPT

    config = load_config(compose_config([f"model={preset}", "out_dir=."]))
    m = config.model
    assert (m.name, m.n_layer, m.n_embd, m.n_head) == (preset, layers, embd, heads)
    model = GPT(config.model_for_data(vocab_size=27, block_size=m.block_size or 16))
    params = {"micro": (4192, 4192), "small": (180_000, 220_000)}.get(preset, (0, 10**9))
    assert params[0] <= model.num_params() <= params[1]
    assert model.config.block_size == {"base": 256}.get(preset, model.config.block_size)


def test_default_config_is_small_on_names_with_issue_27s_recipe():
    config = load_config(compose_config(["out_dir=."]))
    assert (config.model.name, config.data.path) == ("small", "data/names.txt")
    assert (config.optim.name, config.optim.weight_decay) == ("muon", 0.1)
    assert (config.train.ema, config.train.pack) == (0.995, 32)


def test_experiments_measured_with_adamw_keep_it_and_microgpt_is_microgpt_py():
    """The induction, microgpt.py and long experiments' figures were measured with AdamW,
    unaveraged, padded: they pin that recipe whatever the defaults."""
    for name in ("induction", "long", "microgpt"):
        config = load_config(compose_config([f"experiment={name}", "out_dir=."]))
        assert (config.optim.name, config.train.ema, config.train.pack) == ("adamw", 0.0, 0)
    m, train, optim = config.model, config.train, config.optim  # microgpt.py's own settings
    assert (m.name, m.norm, m.activation, m.bias, m.tie_weights) == (
        "micro", "rmsnorm", "relu", False, False)  # fmt: skip
    assert (train.batch_size, train.max_steps, optim.lr, list(optim.betas)) == (
        1, 1000, 0.01, [0.85, 0.99])  # fmt: skip


def test_heads_sets_the_models_head_count_and_the_config_round_trips_through_yaml():
    config = load_config(compose_config(["model=base", "heads=8", "out_dir=/tmp/x"]))
    assert config.model.n_head == 8 and config.heads == 8  # the preset's 6 replaced
    # a head count given twice, whoever builds the config (a dict: both keys given)
    with pytest.raises(ConfigError, match=r"^heads=4 and model.n_head=2 differ; give one of them"):
        load_config({"heads": 4, "model": {"n_head": 2}})
    again = load_config(OmegaConf.create(OmegaConf.to_yaml(OmegaConf.structured(config))))
    assert again == config


def test_a_warmup_longer_than_the_run_is_cut_to_a_tenth_of_it_and_said():
    from microgpt.train.optim import fit_warmup

    config = load_config({"optim": {"warmup_steps": 100}, "train": {"max_steps": 40}})
    fitted, line = fit_warmup(config)
    assert fitted.optim.warmup_steps == 4
    assert line == "optim.warmup_steps=100 is longer than the run (train.max_steps=40): using 4"
    assert fit_warmup(fitted) == (fitted, None)  # a warmup that fits is kept as it is


# Each schema check: settings as on the command line (OmegaConf's dotlist), a regex of the error.
# "sample:" rows are sample.py's SampleConfig; the rest train.py's Config.
BAD = [
    ("heads=3", r"n_embd=64 is not divisible by heads=3.*heads in \[1, 2, 4, 8, 16, 32, 64\]"),
    ("heads=0", r"heads=0 must be a positive integer"),
    ("model.n_head=5", r"model.n_embd=64 is not divisible by model.n_head=5"),
    ("model.n_layer=0", r"model.n_layer=0 must be a positive integer"),
    ("model.attn_impl=flash", r"model.attn_impl='flash' is unknown.*loop.*sdpa"),
    ("model.vocab_size=50", r"model.vocab_size=50: the vocabulary comes from the data"),
    ("train.max_steps=0", r"train.max_steps=0 must be at least 1"),
    ("train.max_steps=lots", r"bad setting train.max_steps: Value 'lots'"),
    ("train.batch_size=0", r"train.batch_size=0 must be at least 1"),
    ("train.pack=-1", r"train.pack=-1 must be at least 0"),
    ("train.ema=1.0", r"train.ema=1.0 must be in \[0, 1\)"),
    ("train.num_samples=-1", r"train.num_samples=-1 must be at least 0"),
    ("train.num_samples=1000000000", r"train.num_samples=1000000000 would sample for about"),
    ("train.precision=fp8", r"train.precision='fp8' is unknown"),
    ("optim.muon_precision=fp8", r"optim.muon_precision='fp8' is unknown"),
    ("optim.muon_ortho=svd", r"optim.muon_ortho='svd' is unknown; choose one of \['polar-express'"),
    ("optim.lr=0", r"optim.lr=0.0 must be > 0"),
    ("optim.lr=nan", r"optim.lr=nan must be a finite number"),
    ("optim.eps=0", r"optim.eps=0.0 must be > 0"),
    ("optim.eps=1e300", r"optim.eps=1e\+300 divides every update .* would not move"),
    ("optim.betas=[0.9]", r"optim.betas=\[0.9\] must be two numbers"),
    ("optim.betas=[1.5,0.9]", r"optim.betas=\[1.5, 0.9\] must be two numbers in \[0, 1\)"),
    ("optim.weight_decay=-1", r"optim.weight_decay=-1.0 must be at least 0"),
    ("optim.warmup_steps=-1", r"optim.warmup_steps=-1 must be at least 0"),
    ("optim.decay=step", r"optim.decay='step' is unknown"),
    ("optim.min_lr_ratio=2", r"optim.min_lr_ratio=2.0 must be in \[0, 1\]"),
    ("optim.grad_clip=-1", r"optim.grad_clip=-1.0 must be at least 0"),
    ("optim.name=sgd", r"optim.name='sgd' is unknown"),
    ("log.attn_every=0", r"log.attn_every=0 must be at least 1"),
    ("device=tpu", r"device='tpu' is unknown"),
    ("seed=-1", r"seed=-1 must be in \[0, 2\*\*63\)"),
    ("threads=100000", r"threads=100000 is more threads than"),
    ("resume=''", r"resume='' must be false, true, or the path"),
    ("resume=3", r"resume=3 must be false, true, or the path"),
    ("data.format=csv", r"data.format='csv' is unknown"),
    ("data.format=text model.block_size=1", r"model.block_size=1 with data.format=text: .*at le"),
    ("data.format=repeats data.repeats.chars=''", r"data.repeats.chars='' must be distinct"),
    ("data.format=repeats data.repeats.chars=abca", r"data.repeats.chars='abca' must be distinct"),
    ("data.format=repeats data.repeats.items=2", r"data.repeats.items=2 must be at least 3 \(one"),
    ("data.format=repeats data.repeats.span=[5,2]", r"data.repeats.span=\[5, 2\] must be \[lo, "),
    ("data.format=repeats data.repeats.span=[2,20]", r"span=\[2, 20\] .*length=32 \(hi <= 16\)"),
    ("data.format=repeats data.repeats.length=0", r"data.repeats.length=0 \(hi <= 0\)"),
    ("data.format=repeats data.repeats.seed=-1", r"data.repeats.seed=-1 must be in \[0, 2\*\*63"),
    (
        "data.format=repeats data.repeats.items=10000000000",
        r"items=10,000,000,000 .* needs about .* GiB",
    ),
    ("sample: num_samples=0", r"num_samples=0 must be at least 1"),
    ("sample: num_samples=many", r"num_samples"),
    ("sample: temperature=-1", r"temperature=-1"),
    ("sample: temperature=nan", r"temperature=nan must be >= 0"),
    ("sample: top_k=0", r"top_k=0 must be at least 1 \(or null\)"),
    ("sample: top_p=1.5", r"top_p=1.5 must be in \(0, 1\]"),
    ("sample: max_len=0", r"max_len=0 must be at least 1"),
    ("sample: max_len=10000000", r"max_len=10,000,000 would take 10,000,000 steps .*at most"),
    ("sample: batch_size=0", r"batch_size=0 must be at least 1"),
    ("sample: seed=-1", r"seed=-1 must be at least 0 \(or null\)"),
    ("sample: device=tpu", r"device='tpu' is unknown"),
    ("sample: threads=1.5", r"threads=1.5"),
    ("sample: ckpt=a.pt run=b", r"give ckpt=PATH or run=FOLDER, not both"),
    ("sample: out=/", r"out='/' must name a file, not a folder"),
    ("sample: out=/nowhere/x.txt", r"out=/nowhere/x.txt: folder /nowhere does not exist"),
]


@pytest.mark.parametrize("settings,message", BAD, ids=[s for s, _ in BAD])
def test_a_bad_setting_is_refused_by_its_schema_naming_it(settings, message):
    schema = SampleConfig if "sample: " in settings else None
    dotlist = settings.removeprefix("sample: ").split()
    with pytest.raises(UserError, match=message) as info:
        load_config(OmegaConf.from_dotlist(dotlist), *([schema] if schema else []))
    assert "\n" not in str(info.value)


def test_a_signal_during_the_conversion_is_delivered_after_it(monkeypatch):
    """SIGTERM arriving inside OmegaConf (a run stopped while it starts) is raised once the
    conversion is done, as the handler's own exception, not inside OmegaConf (where it left an
    AttributeError and a traceback), even while another thread lives (tqdm's monitor): the OS may
    hand the signal to that thread, and Python still runs the handler in the main one."""
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
            load_config({})
    finally:
        done.set()
        other.join()
        signal.signal(signal.SIGTERM, previous)
    assert reached == ["after the signal"]
