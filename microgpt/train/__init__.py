"""Training: the Trainer and its loop (trainer), what hears its events (listeners), what it is
built from (state), the optimizer and schedule (optim), the loss (loss), how a run
stops early (stopping).
"""
