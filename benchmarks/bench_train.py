"""Head training speed: `train-draft`'s steps in bfloat16 (autocast) as a ratio to float32, same data, same run.

    python -m benchmarks.bench_train                         # packaged SmolLM2-135M, CPU, about 4 minutes
    python -m benchmarks.bench_train --device cuda --steps 100 --per-category 10

Records a small cache with the states EAGLE-3 fuses (Spec-Bench, greedy, `--store stats`), then trains the same
EAGLE-3 head (same seed, settings and batches) once per precision, float32 first, and prints seconds per step of
each training loop, bfloat16's steps per second over float32's (above 1: bfloat16 is faster), and each head's
held-out loss and top-1 at depth 1 (evaluated in float32), so that a speed gain that costs the fit shows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
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
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    import transformers

    from specsim.record.heads import default_aux_layers
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
        for precision in ("float32", "bfloat16"):
            config = TrainConfig(kind="eagle3", steps=args.steps, batch=4, lr=1e-3, holdout_every=5, ttt_steps=4,
                                 aux_layers=aux, draft_vocab=args.draft_vocab, precision=precision,
                                 save_every=args.steps + 1)
            results[precision] = train(cache, target, Path(tmp) / precision, config, progress=False)
    print(f"\nEAGLE-3 head for {args.target} on {args.device}"
          f"{f' ({torch.get_num_threads()} threads)' if args.device == 'cpu' else ''}, {args.steps} steps of 4 "
          f"trajectories, draft vocabulary {args.draft_vocab}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'precision':<10} {'s/step':>8} {'held-out loss':>14} {'top-1 d1':>9}")
    for precision, outcome in results.items():
        print(f"{precision:<10} {outcome.seconds / outcome.steps:8.3f} {outcome.after['loss']:14.3f} "
              f"{outcome.after['top1'][1]:9.3f}")
    ratio = results["float32"].seconds / results["bfloat16"].seconds
    verdict = "the same within 2%" if abs(ratio - 1) < 0.02 else "bfloat16 faster" if ratio > 1 else "bfloat16 slower"
    print(f"bfloat16 steps per second / float32's: {ratio:.2f}x ({verdict}; one run each, in this order)")


if __name__ == "__main__":
    main()
