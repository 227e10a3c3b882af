"""Recording overhead: `specsim cache` against plain target generation of the same tokens.

    python -m benchmarks.bench_cache                       # ~1-2 min on a 2-core CPU
    python -m benchmarks.bench_cache --draft int8 --prompts 4 --max-new-tokens 64
    python -m benchmarks.bench_cache --device cuda --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct

Records N greedy trajectories (target + drafts, through the same code path as the
CLI, HDF5 writes included), then in the same run generates the same prompts with
Hugging Face ``generate`` (greedy, exactly as many new tokens) and checks that the
tokens agree. Prints time(record) / time(plain generate) — goal <= 1.3 on CPU with
the packaged pair — and the cache's bytes per position.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", action="append", help="repeatable; default layers:20")
    parser.add_argument("--prompts", type=int, default=4, help="first prompt of this many Spec-Bench categories")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top-k", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    from specsim.cache.store import CacheSpec, CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.models import load_draft, load_model, resolve_device
    from specsim.record.recorder import RecordConfig, prompt_records, record

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    device = resolve_device(args.device)
    drafts_specs = args.draft or ["layers:20"]
    target = load_model(args.target, device=device)
    drafts = [load_draft(d, target, device=device) for d in drafts_specs]
    prompt_set = load_prompts("spec-bench", per_category=1)
    records = prompt_records(prompt_set.prompts[: args.prompts], target.tokenizer)
    config = RecordConfig(max_new_tokens=args.max_new_tokens, temperatures=(0.0,))

    # Warm both paths once so neither pays first-call costs.
    warm = [records[0].token_ids.tolist()]
    with torch.inference_mode():
        target.model.generate(torch.tensor(warm, device=device), max_new_tokens=2, do_sample=False)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.h5"
        spec = CacheSpec(vocab_size=target.vocab_size, drafts=tuple(drafts_specs), temperatures=(0.0,),
                         storage="topk" if args.top_k else "full", top_k=args.top_k)
        with CacheWriter.create(path, spec, records) as writer:
            stats = record(writer, target, drafts, config, progress=False)
        from specsim.cache.store import CacheReader

        with CacheReader(path) as reader:
            trajectories = [(r.prompt_index, reader.tokens(r.start, r.stop)) for r in reader.iter_trajectories()]
            size = reader.size_bytes

    t0 = time.perf_counter()
    mismatches = 0
    with torch.inference_mode():
        for prompt_index, tokens in trajectories:
            ids = torch.tensor([records[prompt_index].token_ids.tolist()], device=device)
            n = len(tokens)
            out = target.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                        pad_token_id=target.tokenizer.pad_token_id or 0)
            mismatches += int(not np.array_equal(out[0, ids.shape[1] :].cpu().numpy(), tokens))
    plain = time.perf_counter() - t0

    positions = stats.positions
    print(f"target {args.target}, drafts {', '.join(drafts_specs)}, device {device}, threads {args.threads}")
    print(f"{len(trajectories)} greedy trajectories, {positions} positions (Spec-Bench, first prompt of "
          f"{args.prompts} categories, up to {args.max_new_tokens} new tokens)")
    print(f"record (target KV loop + {len(drafts)} teacher-forced draft pass(es) + HDF5): {stats.seconds:.2f} s, "
          f"{positions / stats.seconds:.1f} positions/s")
    print(f"plain HF generate of the same tokens:                 {plain:.2f} s, {positions / plain:.1f} positions/s")
    print(f"ratio record / plain generate: {stats.seconds / plain:.2f}  (goal <= 1.3)")
    print(f"storage {spec.storage}: {size / positions:,.0f} bytes per position ({size / 1e6:.1f} MB file, "
          f"vocab {target.vocab_size:,}, {1 + len(drafts)} columns)")
    print(f"greedy tokens identical to HF generate: {len(trajectories) - mismatches}/{len(trajectories)} trajectories")


if __name__ == "__main__":
    main()
