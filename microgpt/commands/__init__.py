"""What the commands do, a layer above the library: `python -m microgpt.heads` (heads.py),
`python -m microgpt.compare` (compare.py), `sample.py` (sample.py) and the TensorBoard tab's
backend (tab/). Each takes plain arguments; the entry points call them behind microgpt.entry."""
