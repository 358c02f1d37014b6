"""Moved to microgpt.checkpoint (every reader imports it from there); this name goes once the
importers outside train/ are updated."""

from microgpt.checkpoint import *  # noqa: F403
from microgpt.checkpoint import Checkpoint, CheckpointError, checksum  # noqa: F401
