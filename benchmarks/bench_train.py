"""Head training speed: `train-draft`'s steps with the trajectories run together (batched) and in bfloat16
(autocast), as ratios to float32 steps that run the trajectories one at a time, same data, same run.

    python -m benchmarks.bench_train                         # packaged SmolLM2-135M, CPU, about 6 minutes
    python -m benchmarks.bench_train --device cuda --steps 100 --per-category 10 --batch 16

Records a small cache with the states EAGLE-3 fuses (Spec-Bench, greedy, `--store stats`), then trains the same
EAGLE-3 head (same seed, settings and batches) three ways, in this order: float32 one trajectory at a time (the
baseline: how steps ran before they were batched), float32 batched, bfloat16 batched. It prints seconds per step of
each training loop, each way's steps per second over the baseline's (above 1: faster), and each head's held-out loss
and top-1 at depth 1 (evaluated in float32), so that a speed gain that costs the fit shows. Each way first runs
an untimed warm-up (`--warmup-steps`), whose seconds are printed: on an H200 bfloat16's first run cost about 30 s more
than float32's whatever its length (40 or 60 steps, 4 or 16 trajectories), which a timed run without it counts per
step (analyses/results/eagle3-gpu-h200-2026-11-27).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on a CPU")
    parser.add_argument("--per-category", type=int, default=2, help="Spec-Bench prompts per category recorded")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=40, help="training steps per precision")
    parser.add_argument("--draft-vocab", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=4, help="trajectories per step")
    parser.add_argument("--warmup-steps", type=int, default=2,
                        help="an untimed run of this many steps per way first (0: none): one-time costs, such as "
                             "kernels loaded or compiled at first use, show as the warm-up's seconds, not per step")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    import transformers

    from specsim.record.head_checkpoints import default_aux_layers
    from specsim.record.models import load_model
    from specsim.record.run import RecordRequest, record_cache
    from specsim.record.train import TrainConfig, train

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    target = load_model(args.target, device=args.device)
    aux = default_aux_layers(int(target.model.config.num_hidden_layers))
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        cache = Path(tmp) / "train.h5"
        started = time.perf_counter()
        record_cache(cache, RecordRequest(target=args.target, prompts="spec-bench", per_category=args.per_category,
                                          max_new_tokens=args.max_new_tokens, temperatures=(0.0,),
                                          device=args.device, store="stats",
                                          hidden=("last", *map(str, aux))), progress=False)
        print(f"recorded {args.per_category} Spec-Bench prompts per category x {args.max_new_tokens} tokens with "
              f"states last,{','.join(map(str, aux))} in {time.perf_counter() - started:.0f} s")
        results = {}
        ways = {"float32, one at a time": ("float32", False), "float32, batched": ("float32", True),
                "bfloat16, batched": ("bfloat16", True)}
        warmups = {}
        for i, (way, (precision, batched)) in enumerate(ways.items()):
            config = TrainConfig(kind="eagle3", steps=args.steps, batch=args.batch, lr=1e-3, holdout_every=5,
                                 ttt_steps=4, aux_layers=aux, draft_vocab=args.draft_vocab, precision=precision,
                                 batched=batched, save_every=args.steps + 1)
            if args.warmup_steps:
                warm = replace(config, steps=args.warmup_steps, save_every=args.warmup_steps + 1)
                warmups[way] = train(cache, target, Path(tmp) / f"w{i}", warm, progress=False).seconds
            results[way] = train(cache, target, Path(tmp) / str(i), config, progress=False)
    print(f"\nEAGLE-3 head for {args.target} on {args.device}"
          f"{f' ({torch.get_num_threads()} threads)' if args.device == 'cpu' else ''}, {args.steps} steps of "
          f"{args.batch} trajectories, draft vocabulary {args.draft_vocab}; load average {os.getloadavg()[0]:.2f}")
    base = results["float32, one at a time"]
    print(f"{'way':<24} {'s/step':>8} {'x baseline':>10} {'held-out loss':>14} {'top-1 d1':>9} "
          f"{f'warm-up ({args.warmup_steps} steps)':>20}")
    for way, outcome in results.items():
        warm = f"{warmups[way]:.1f} s" if way in warmups else "-"
        print(f"{way:<24} {outcome.seconds / outcome.steps:8.3f} {base.seconds / outcome.seconds:9.2f}x "
              f"{outcome.after['loss']:14.3f} {outcome.after['top1'][1]:9.3f} {warm:>20}")
    print("x baseline: steps per second over float32 one trajectory at a time (above 1: faster); one run each, in "
          "this order")


if __name__ == "__main__":
    main()
