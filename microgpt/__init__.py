"""microgpt: train character-level GPTs and see each attention head at work."""

import os

# Idle OpenMP threads sleep instead of spinning, so that processes sharing the cores slow each
# other down gracefully (microgpt/threads.py). OpenMP reads this once, when torch loads it: every
# microgpt module imports torch after this line. A value already set (ACTIVE) is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
