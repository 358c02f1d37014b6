"""microgpt: train character-level GPTs and see each attention head at work."""

__version__ = "0.1.0"
