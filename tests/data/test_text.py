"""The text format (data.format=text): reading, splits, windows, exact evaluation, memorisation,
training, resume, sampling and the head analysis on a text run."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from microgpt.checkpoint import Checkpoint
from microgpt.commands.sample import run_sampling
from microgpt.config import DataConfig
from microgpt.data.dataset import DataError, load_data
from microgpt.data.text import TextWindows, VerbatimIndex, encode_text
from microgpt.tokenizer import CharTokenizer
from microgpt.train.loss import evaluate
from microgpt.train.stopping import Interrupted
from microgpt.train.trainer import train
from tests.conftest import REPO, TINY, compose_config
from tests.e2e.test_reliability import EXACT, run_trainer, sigint_at


def make_play(n_lines: int = 400, seed: int = 0) -> str:
    """A small made-up play: speakers in capitals, lines of words, blank lines between speeches."""
    rng = random.Random(seed)
    words = "thou art my lord and the king shall not be so fair a night of love".split()
    out = []
    for _ in range(n_lines // 4):
        out.append(rng.choice(["ROMEO:", "JULIET:", "NURSE:"]))
        for _ in range(3):
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))).capitalize())
        out.append("")
    return "\n".join(out) + "\n"


@pytest.fixture
def play_file(tmp_path) -> Path:
    path = tmp_path / "play.txt"
    path.write_text(make_play(), encoding="utf-8")
    return path


TEXT_TINY = ["data.format=text", "model.block_size=16"]


@pytest.fixture
def text_cfg(tmp_path, play_file):
    def make(*extra, out: Path | None = None):
        out = out or tmp_path / "run"
        data = [*TEXT_TINY, f"data.path={play_file}"]
        return compose_config([*TINY, *data, f"out_dir={out}", *extra])

    return make


# ----------------------------------------------------------------------------- reading, splits


def test_a_text_shorter_than_three_windows_is_refused_with_the_sizes(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 200)
    with pytest.raises(DataError) as e:
        load_data(DataConfig(str(path), "text"), 16)
    # 200 characters: 180 / 10 / 10, each needing block_size + 1 = 17
    assert "200 characters" in str(e.value) and "180 / 10 / 10" in str(e.value)
    assert "at least 340" in str(e.value)  # 17 / 0.05


def test_each_preset_names_the_file_its_prepare_command_builds():
    """data/format.check_data_file names `prepare` for a missing file it builds (--out PATH)."""
    for preset in (REPO / "conf" / "data").glob("*.yaml"):
        data = yaml.safe_load(preset.read_text())
        assert not data.get("prepare") or data["path"] in data["prepare"].split(), preset.name


def test_the_vocabulary_is_the_whole_files_and_ids_are_compact(tmp_path):
    text = "ab" * 1000 + "Z"  # Z occurs only in the test slice
    path = tmp_path / "t.txt"
    path.write_text(text)
    data = load_data(DataConfig(str(path), "text"), 8)
    assert data.tokenizer.chars == ["Z", "a", "b"]
    assert data.train_ids.dtype == torch.uint8
    wide = CharTokenizer([chr(0x4E00 + i) for i in range(300)])
    assert encode_text(chr(0x4E00 + 299), wide).dtype == torch.int16
    assert encode_text(chr(0x4E00 + 299), wide).tolist() == [300]


def test_splits_are_contiguous_disjoint_slices_in_order(play_file):
    data = load_data(DataConfig(str(play_file), "text"), 16)
    ids = encode_text(play_file.read_text(), data.tokenizer)
    train, val, test = data.split.sizes()
    n = len(ids)
    assert (train, val) == (int(n * 0.9), int(n * 0.05)) and train + val + test == n
    assert torch.equal(data.train_ids, ids[:train])
    assert torch.equal(data.datasets["val"].ids, ids[train : train + val])
    assert torch.equal(data.datasets["test"].ids, ids[train + val :])
    # the seed does not move a text split
    again = load_data(DataConfig(str(play_file), "text", split_seed=99), block_size=16)
    assert again.split == data.split


def test_training_windows_come_from_the_train_slice_only(play_file):
    data = load_data(DataConfig(str(play_file), "text"), 16)
    batches = data.train_batches(global_batch=64, seed=3)
    every = data.train_ids.long().unfold(0, 17, 1)  # (n_train - 16, 17): every window there is
    for _ in range(20):
        x, y, n_mine, n_global = batches.next(0, 64)
        assert x.shape == y.shape == (64, 16) and n_mine == n_global == 64 * 16
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x one character on
        drawn = torch.cat([x, y[:, -1:]], dim=1)  # (64, 17)
        found = (every[:, None, :] == drawn[None]).all(dim=-1).any(dim=0)  # (64,)
        assert bool(found.all()), "a window that is not a slice of the training text"


def test_window_batches_resume_the_exact_sequence_and_split_between_ranks(play_file):
    data = load_data(DataConfig(str(play_file), "text"), 16)
    a = data.train_batches(global_batch=8, seed=5)
    for _ in range(3):
        a.next(0, 8)
    state = a.state_dict()
    b = data.train_batches(global_batch=8, seed=123)  # another seed: the state must win
    b.load_state_dict(state)
    for _ in range(4):
        xa, _, _, _ = a.next(0, 8)
        xb, _, _, _ = b.next(0, 8)
        assert torch.equal(xa, xb)
    # two ranks of 4 take the two halves of the same global batch of 8
    whole = data.train_batches(8, seed=1).next(0, 8)[0]
    r0 = data.train_batches(8, seed=1).next(0, 4)
    r1 = data.train_batches(8, seed=1).next(1, 4)
    assert torch.equal(torch.cat([r0[0], r1[0]]), whole) and (r0[2], r0[3]) == (64, 128)


# ----------------------------------------------------------------------------- evaluation


def test_evaluation_windows_cover_every_character_once():
    ids = torch.arange(1, 12, dtype=torch.uint8)  # 11 characters: 10 targets
    windows = TextWindows(ids, block_size=4)
    assert len(windows) == 3  # 4 + 4 + 2 targets
    x, y = windows.batch(torch.arange(3))
    assert x.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 0]]  # 11: no target after it
    assert y.tolist() == [[2, 3, 4, 5], [6, 7, 8, 9], [10, 11, -1, -1]]


class Bigram(nn.Module):
    """A model whose next-character distribution depends on the current character only."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.logits = nn.Parameter(table)

    def forward(self, x, y=None):
        logits = self.logits[x]  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1)
        return logits, loss


def test_evaluate_over_a_text_split_is_the_exact_mean_over_its_characters():
    torch.manual_seed(0)
    V = 5
    table = torch.randn(V, V)
    ids = torch.tensor([1, 2, 3, 1, 4, 2, 2, 1, 3, 4, 1, 2, 4], dtype=torch.uint8)
    # by hand: -log softmax(table[a])[b] over every consecutive pair, averaged
    logp = [math.log(math.exp(table[a, b]) / sum(math.exp(v) for v in table[a])) for a, b in
            zip(ids[:-1].tolist(), ids[1:].tolist())]  # fmt: skip
    expected = -sum(logp) / len(logp)
    for block_size, batch_size in ((4, 1), (5, 2), (16, 8)):
        got = evaluate(Bigram(table), TextWindows(ids, block_size), batch_size)
        assert got == pytest.approx(expected, abs=1e-6)


# ----------------------------------------------------------------------------- memorisation


def test_verbatim_index_finds_the_longest_stretch_in_the_training_text():
    text = "the cat sat on the mat. a dog ran."
    tok = CharTokenizer(set(text + "xzq"))
    index = VerbatimIndex(torch.tensor(tok.encode(text), dtype=torch.uint8), tok.vocab_size)
    assert index.longest(tok.encode("xxcat sat ozz")) == (9, 2)  # "cat sat o"
    assert index.longest(tok.encode("qqq"))[0] == 0
    assert index.longest(tok.encode("zran."))[0] == 4  # the text's very end: "ran."
    assert index.longest(tok.encode("qn."))[0] == 2  # "n." is only in the last 3 characters
    assert index.longest(tok.encode(text))[0] == len(text)
    assert index.contains(tok.encode(".")) and not index.contains(tok.encode("mat. a cat"))
    assert index.longest(tok.encode("he mat"))[0] == 6 and index.longest([])[0] == 0


def test_verbatim_index_of_a_text_shorter_than_its_grams():
    tok = CharTokenizer(set("abz"))
    for text in ("a", "ab", "aba"):
        index = VerbatimIndex(torch.tensor(tok.encode(text), dtype=torch.uint8), tok.vocab_size)
        assert index.longest(tok.encode("z" + text + "z")) == (len(text), 1)
        assert not index.contains(tok.encode(text + "a"))


# ----------------------------------------------------------------------------- training


def test_a_text_run_with_cr_line_ends_trains_evaluates_and_writes_passages(text_cfg, tmp_path):
    cr = tmp_path / "cr.txt"
    cr.write_bytes(make_play().replace("\n", "\r").encode())
    metrics = train(text_cfg(f"data.path={cr}", "train.num_samples=2"))
    run = tmp_path / "run"
    vocab = len(set(make_play())) + 1  # + the boundary token
    assert metrics["test_loss"] < math.log(vocab)  # better than uniform: it learned something
    samples = (run / "samples.txt").read_text()
    assert samples.count("--- passage") == 2 and "longest stretch found" in samples
    ckpt = Checkpoint.load(run / "checkpoints" / "best.pt")
    assert ckpt.split["format"] == "text" and ckpt.train_config["data"]["format"] == "text"
    assert ckpt.tokenizer["chars"] == "".join(sorted(set(make_play())))  # \r became \n


def test_a_text_run_resumes_bit_exactly_from_inside_a_window(text_cfg, tmp_path):
    whole, whole_losses, stopped = run_trainer(text_cfg(*EXACT, out=tmp_path / "whole"))
    assert stopped is None and len(whole_losses) == 8
    run = tmp_path / "split"
    first, first_losses, stopped = run_trainer(text_cfg(*EXACT, out=run), on_step=sigint_at(5))
    assert isinstance(stopped, Interrupted) and first.step == 5
    second, second_losses, stopped = run_trainer(text_cfg(*EXACT, "resume=true", out=run))
    assert stopped is None and second.step == 8
    assert first_losses + second_losses == whole_losses
    a, b = whole.model.state_dict(), second.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_probe_is_a_validation_passage_from_a_line_start(play_file):
    data = load_data(DataConfig(str(play_file), "text"), 128)
    probe = data.tokenizer.decode(data.probe_ids(None))
    assert len(probe) == 64 and probe in play_file.read_text()
    short = load_data(DataConfig(str(play_file), "text"), 16).probe_ids(None)
    assert len(short) == 16  # never longer than the context
    val = data.tokenizer.decode(data.datasets["val"].ids.tolist())
    assert probe in val and val[val.index(probe) - 1] == "\n"


# ----------------------------------------------------------------------------- sampling, heads


@pytest.fixture
def text_run(text_cfg, tmp_path) -> Path:
    train(text_cfg("train.num_samples=0"))
    return tmp_path / "run"


def test_sample_continues_a_prompt_and_scores_its_verbatim_stretches(text_run, play_file):
    sample = dict(run=str(text_run), prefix="ROMEO:", max_len=40, num_samples=2, seed=0)
    result = run_sampling(**sample)
    passages = result.names
    assert len(passages) == 2 and all(p.startswith("ROMEO:") and len(p) == 46 for p in passages)
    assert run_sampling(**sample, use_cache=False).names == passages  # the same, uncached
    text = play_file.read_text()
    train_text = text[: int(len(text) * 0.9)]
    headers = [line for line in result.lines if line.startswith("--- passage")]
    for passage, header in zip(passages, headers):  # by brute force: the longest stretch in train
        new = passage[len("ROMEO:") :]
        spans = ((i, j) for i in range(len(new)) for j in range(i + 1, len(new) + 1))
        longest = max((j - i for i, j in spans if new[i:j] in train_text), default=0)
        assert header.endswith(f"longest stretch found in the training text {longest} characters")
    assert result.lines[-1].startswith("2 passage(s); longest verbatim stretch")


def test_sample_refuses_unknown_characters_and_cuts_a_long_prompt(text_run):
    with pytest.raises(ValueError, match=r"does not know: '€', 'ü'"):
        run_sampling(run=str(text_run), prefix="ROMEO€ü", max_len=5)
    long = "ROMEO: thou art " * 3  # 48 characters; block_size 16 reads 15
    result = run_sampling(run=str(text_run), prefix=long, max_len=5, num_samples=1, seed=0)
    assert any("continues the last 15" in line for line in result.lines)
    assert result.names[0].startswith(long[-15:]) and len(result.names[0]) == 20


def test_sample_without_the_text_file_still_samples_and_says_why(text_run, play_file):
    play_file.rename(play_file.with_suffix(".moved"))
    result = run_sampling(run=str(text_run), max_len=10, num_samples=1, seed=0)
    assert any("memorisation not measured" in line for line in result.lines)
    assert len(result.names[0]) == 11  # the default prompt, a new line, and 10 characters
