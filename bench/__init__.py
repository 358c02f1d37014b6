"""Benchmarks of microgpt: `python bench/run.py --help`.

One module per section; run.py prints them."""
