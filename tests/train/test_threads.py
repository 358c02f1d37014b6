"""threads=auto by measurement (microgpt/train/threads.py): the choice from step times (a clock
that advances by a made-up cost per thread count: no timing), and a probe that leaves the run as
it was."""

from __future__ import annotations

import pytest
import torch

from microgpt.config import load_config
from microgpt.train.threads import candidates, fastest, measured_threads
from microgpt.train.trainer import Trainer


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])]
)
def test_candidates(cores, expected):
    assert candidates(cores) == expected


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        ({1: 0.020, 2: 0.032}, 1),  # small bf16 steps: a second thread only waits
        ({1: 0.020, 2: 0.015}, 2),  # clearly faster
        ({1: 0.020, 2: 0.019}, 1),  # within the margin: the fewer (a run's bits follow its count)
        ({1: 0.040, 2: 0.020, 4: 0.019, 8: 0.050}, 2),  # walking up: 4 is not 10% faster than 2
    ],
)
def test_the_fastest_count_clearly_faster_wins(cost, expected, request):
    request.addfinalizer(lambda n=torch.get_num_threads(): torch.set_num_threads(n))
    now = [0.0]

    def step():
        now[0] += cost[torch.get_num_threads()]

    chosen, medians = fastest(step, list(cost), clock=lambda: now[0])
    assert chosen == expected == torch.get_num_threads()
    assert medians == pytest.approx(cost)


def test_the_probe_leaves_the_model_and_the_random_streams_as_they_were(tiny_cfg, request):
    request.addfinalizer(lambda n=torch.get_num_threads(): torch.set_num_threads(n))
    trainer = Trainer(load_config(tiny_cfg("model.dropout=0.1")))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rng = torch.get_rng_state()
    chosen, line = measured_threads(trainer, 2)
    assert chosen in (1, 2) and f"threads=auto chose {chosen} of 2 cores" in line
    assert torch.equal(torch.get_rng_state(), rng)
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
