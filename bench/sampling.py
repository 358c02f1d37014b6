"""Sampling: names (microgpt.sample.generate.sample_items) as one batch and one at a time, with
and without the KV cache; and the base preset filling long contexts (generate)."""

from pathlib import Path

import torch

from bench.common import compose, figure, make_trainer, time_steps, timed
from microgpt.checkpoint import Checkpoint
from microgpt.config import load_config
from microgpt.model import GPT
from microgpt.sample.generate import generate, sample_items


def names_model(args, device, tmp: Path):
    """The model of --run, else the small preset trained here for --sample-steps steps."""
    if args.run:
        model, tokenizer = Checkpoint.load(args.checkpoint).build_model(device)
        return model.eval(), tokenizer, f"checkpoint {args.checkpoint}"
    tr = make_trainer(["model=small"], args, tmp)
    time_steps(tr, args.sample_steps)
    return tr.model.eval(), tr.tokenizer, f"small preset trained here for {args.sample_steps} steps"


def decode(model: GPT, context: int, use_cache: bool, generator: torch.Generator) -> None:
    """Fill `context` positions: the boundary token, then sampled tokens, block_size permitting,
    not stopping at a boundary."""
    fill = {"max_new_tokens": context - 1, "stop_at_boundary": False}
    generate(model, 1, generator=generator, use_cache=use_cache, **fill)


def run_sampling(args, device, tmp: Path) -> dict:
    model, tok, source = names_model(args, device, tmp)
    n, figures = args.names, {}
    for batch_size, how, limit in ((None, "as one batch", 0.8), (1, "one at a time", 12.0)):
        for use_cache in (True, False):
            kw, runs = {"batch_size": batch_size, "use_cache": use_cache}, range(args.repeats)
            times = [timed(lambda: sample_items(model, tok, n, seed=r, **kw), device) for r in runs]
            target = ("<", limit) if n == 1000 and use_cache and not args.quick else None
            cache = "cache" if use_cache else "no cache"
            figures[f"{n} names {how}, {cache}"] = figure(times, "s", target)
    cfg = load_config(compose(["model=base", "device=cpu", "out_dir=."]))
    base = GPT(cfg.model_for_data(tok.vocab_size, cfg.model.block_size)).to(device).eval()
    for context in args.contexts:
        per = {True: [], False: []}
        for r in range(args.repeats):
            for use_cache in per:
                g = torch.Generator(device=device).manual_seed(r)
                per[use_cache].append(timed(lambda: decode(base, context, use_cache, g), device))
        sampled = min(context, cfg.model.block_size) - 1
        for cache, times in zip(("cache", "no cache"), per.values()):
            speed = [sampled / t for t in times]
            figures[f"base {context} tokens, {cache}"] = figure(speed, "tokens/s")
        target = (">=", 5.0) if context == 256 and not args.quick else None
        speedup = [nc / c for c, nc in zip(per[True], per[False])]
        figures[f"base {context} tokens, cache speedup"] = figure(speedup, "x", target)
    info = {
        "names": f"{n} names from the {source}",
        "base": f"base preset, random weights ({base.num_params():,} parameters), batch 1",
    }
    return {"figures": figures, "info": info}
