"""Live speculative decoding speed: tokens/s of chain and tree decoding as ratios to plain decoding.

    python -m benchmarks.bench_live                      # packaged SmolLM2-135M, CPU, a few minutes
    python -m benchmarks.bench_live --drafts int8,layers:8 --tree chain:4 --tree kary:2,3 --max-new-tokens 64

Plain greedy decoding of the same prompts (same KV-cache code) is measured in the
same run; each configuration prints its tokens/s, tokens per target call, and its
tokens/s divided by plain's (above 1 is faster). Greedy, float32, so every live
output is also checked token-identical to plain output.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from specsim.live.decoder import LiveConfig, Target, plain_decode, speculative_decode
from specsim.live.runs import build_drafter
from specsim.prompts import encode, load_prompts
from specsim.record.models import eos_token_ids, load_model
from specsim.specs import parse_tree


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafts", default="int8,layers:8")
    parser.add_argument("--tree", dest="trees", action="append", help="repeatable  [default: chain:4, widths:3,2,1]")
    parser.add_argument("--prompts", type=int, default=3, help="first N Spec-Bench prompts (one per category)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    loaded = load_model(args.target, device=args.device)
    target = Target(loaded.model, eos_token_ids(loaded))
    prompts = [np.asarray(encode(loaded.tokenizer, p.text)) for p in load_prompts(per_category=1).prompts[: args.prompts]]
    rng = np.random.default_rng(0)

    def plain_rate() -> tuple[float, list]:
        outs = [plain_decode(target, p, temperature=0.0, max_new_tokens=args.max_new_tokens, rng=rng) for p in prompts]
        return sum(len(o.tokens) for o in outs) / sum(o.seconds for o in outs), outs

    plain_decode(target, prompts[0], temperature=0.0, max_new_tokens=4, rng=rng)  # warm-up
    base, plain = plain_rate()
    print(f"target {args.target} on {args.device} ({torch.get_num_threads()} threads), {len(prompts)} prompts x "
          f"{args.max_new_tokens} new tokens, greedy float32")
    print(f"{'draft':<10} {'tree':<14} {'tok/s':>7} {'tok/call':>8} {'draft ms':>9} {'verify ms':>9} "
          f"{'vs plain':>9}  identical")
    print(f"{'-':<10} {'plain':<14} {base:7.1f} {1.0:8.2f} {0.0:9.1f} {1000 / base:9.1f} {1.0:9.2f}x")
    for spec in args.drafts.split(","):
        drafter = build_drafter(spec, loaded, device=args.device, dtype="float32")
        for tree_spec in args.trees or ["chain:4", "widths:3,2,1"]:
            config = LiveConfig(tree=parse_tree(tree_spec), max_new_tokens=args.max_new_tokens)
            started = time.perf_counter()
            outs = [speculative_decode(target, drafter, p, config, rng) for p in prompts]
            steps = [s for o in outs for s in o.steps]
            tokens = sum(len(o.tokens) for o in outs)
            rate = tokens / sum(o.seconds for o in outs)
            same = all(np.array_equal(o.tokens, q.tokens) for o, q in zip(outs, plain))
            print(f"{spec:<10} {tree_spec:<14} {rate:7.1f} {tokens / len(steps):8.2f} "
                  f"{1000 * np.mean([s.draft_s for s in steps]):9.1f} {1000 * np.mean([s.verify_s for s in steps]):9.1f} "
                  f"{rate / base:9.2f}x  {same}  ({time.perf_counter() - started:.0f} s)")
    end_rate, _ = plain_rate()  # plain once more: how far the machine drifted during the run
    print(f"plain re-measured at the end: {end_rate:.1f} tok/s ({end_rate / base:.2f}x the first measurement)")

if __name__ == "__main__":
    main()
