"""Training: the Trainer and its loop (trainer), the optimizer and schedule (optim), the loss
(loss), checkpoints (checkpoint), signals (stopping), the run's end (summary).
"""
