"""Sampling: choosing the next token and KV-cache decoding (generate), what a run shows of its
samples (report), what `python sample.py` does (command).
"""
