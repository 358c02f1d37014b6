"""microgpt: train character-level GPTs and see each attention head at work."""

import os

# Idle OpenMP threads sleep instead of spinning, so that processes sharing the cores slow each
# other down gracefully (microgpt/threads.py). OpenMP reads this once, when torch loads it: every
# microgpt module imports torch after this line. A wait the user chose is kept: OMP_WAIT_POLICY, or
# GOMP_SPINCOUNT (how long GNU OpenMP's threads spin before they sleep).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

__version__ = "0.1.0"
