"""3. Sampling: names from the small preset (microgpt.sample.generate.sample_items) and long
contexts decoded by the base preset (microgpt.sample.generate.generate, every row filled to
its length)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.common import figure, make_trainer, preset_model_config, step, sync
from microgpt.model import GPT
from microgpt.sample.generate import generate, sample_items
from microgpt.train.loss import evaluate


def sampling_model(args, device: torch.device, tmp: Path):
    """The small preset: from --ckpt, or trained here for --sample-train-steps steps."""
    if args.ckpt:
        from microgpt.train.checkpoint import Checkpoint

        model, tok = Checkpoint.load(args.ckpt).build_model(device)
        return model, tok, f"checkpoint {args.ckpt}"
    tr = make_trainer(["model=small"], args, tmp)
    for _ in range(args.sample_train_steps):
        step(tr)
    loss = evaluate(tr.model, tr.datasets["val"], 1000, tr.autocast)
    return (
        tr.model.eval(),
        tr.tokenizer,
        f"small preset trained here for {args.sample_train_steps} steps (val loss {loss:.3f})",
    )


def decode(model: GPT, context: int, use_cache: bool, generator: torch.Generator) -> int:
    """Fill a context of `context` positions: the boundary token, then context - 1 sampled tokens
    (fewer where block_size - 1 is less), not stopping at a boundary. Returns the tokens sampled."""
    rows = generate(
        model,
        1,
        generator=generator,
        use_cache=use_cache,
        max_new_tokens=context - 1,
        stop_at_boundary=False,
    )  # (1, sampled)
    return rows.size(1)


def time_names(model, tok, n: int, repeats: int, device, one_at_a_time: bool, use_cache: bool):
    """Seconds per run of sample_items(n), and the lengths of the names sampled."""
    times, lengths = [], []
    for r in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        items = sample_items(
            model, tok, n, seed=r, batch_size=1 if one_at_a_time else None, use_cache=use_cache
        )
        sync(device)
        times.append(time.perf_counter() - t0)
        lengths += [len(s) for s in items]
    return times, lengths


def run_sampling(args, device, tmp: Path) -> dict:
    model, tok, source = sampling_model(args, device, tmp)
    n = args.names
    full = n == 1000 and not args.quick
    figures, info = {}, {"model": source, "names": n}
    lengths = []
    for one_at_a_time in (False, True):
        for use_cache in (True, False):
            times, lens = time_names(model, tok, n, args.repeats, device, one_at_a_time, use_cache)
            lengths += lens
            limit = 12.0 if one_at_a_time else 0.8
            how = "one at a time" if one_at_a_time else "as one batch"
            figures[f"{n} names {how}, {'cache' if use_cache else 'no cache'}"] = figure(
                times, "s", ("<", limit) if full and use_cache else None
            )
    info["mean_name_length"] = sum(lengths) / len(lengths)

    base = GPT(preset_model_config("base", tok.vocab_size)).to(device).eval()
    info["base"] = (
        f"base preset, random weights ({base.num_params():,} parameters), batch 1: a context "
        f"of N positions is the boundary token then N-1 sampled tokens (generate with "
        f"stop_at_boundary=False), one forward each; tokens/s = tokens sampled / time"
    )
    info["sampled_tokens"] = {}
    for context in args.contexts:
        per = {True: [], False: []}
        for r in range(args.repeats):
            for use_cache in (True, False):
                g = torch.Generator(device=device).manual_seed(r)
                sync(device)
                t0 = time.perf_counter()
                sampled = decode(base, context, use_cache, g)
                sync(device)
                per[use_cache].append(time.perf_counter() - t0)
        info["sampled_tokens"][context] = sampled  # context - 1 unless block_size cuts it
        for use_cache in (True, False):
            figures[f"base {context} tokens, {'cache' if use_cache else 'no cache'}"] = figure(
                [sampled / t for t in per[use_cache]], "tokens/s"
            )
        speedup = [nc / c for c, nc in zip(per[True], per[False])]
        figures[f"base {context} tokens, cache speedup"] = figure(
            speedup, "x", (">=", 5.0) if context == 256 and not args.quick else None
        )
    return {"figures": figures, "info": info}
