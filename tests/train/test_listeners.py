"""The Trainer's events: a listener hears each point of the loop, in order, and what it carries."""

from microgpt.config import load_config
from microgpt.train.listeners import Listener
from microgpt.train.trainer import Trainer


class Recorder(Listener):
    """Each event as (name, step, what it carried)."""

    def __init__(self):
        self.heard = []

    def on_start(self, trainer):
        self.heard.append(("start", trainer.step))

    def on_step(self, trainer, result, window):
        self.heard.append(("step", trainer.step, window is not None, result.lr > 0))

    def on_evaluated(self, trainer, metrics):
        self.heard.append(("evaluated", trainer.step, metrics["step"]))

    def on_saved(self, trainer, path):
        self.heard.append(("saved", trainer.step, path.name))

    def on_step_end(self, trainer):
        self.heard.append(("step_end", trainer.step))

    def on_finished(self, trainer, metrics, model):
        self.heard.append(("finished", trainer.step, "test_loss" in metrics, model is not None))

    def close(self):
        self.heard.append(("closed",))


def test_a_listener_hears_every_event_in_the_order_of_the_loop(tiny_cfg):
    settings = ("train.max_steps=3", "train.log_every=2", "train.eval_every=3")
    trainer = Trainer(load_config(tiny_cfg(*settings, "train.save_every=2")))
    recorder = Recorder()
    trainer.listeners.append(recorder)
    trainer.run()
    assert recorder.heard == [
        ("start", 0),
        ("step", 1, False, True),
        ("step_end", 1),
        ("step", 2, True, True),  # a window ends every 2 steps
        ("saved", 2, "step-000002.pt"),  # train.save_every=2
        ("step_end", 2),
        ("step", 3, True, True),  # and at the last step
        ("evaluated", 3, 3),
        ("saved", 3, "best.pt"),  # the first evaluation is the best so far
        ("saved", 3, "last.pt"),
        ("step_end", 3),
        ("finished", 3, True, True),
        ("closed",),
    ]
