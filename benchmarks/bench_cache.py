"""Recording: throughput, the statistics' share of it, and cache size per storage, against plain generation.

    python -m benchmarks.bench_cache                       # ~3 min on a 2-core CPU
    python -m benchmarks.bench_cache --draft int8 --prompts 4 --max-new-tokens 64
    python -m benchmarks.bench_cache --device cuda --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct

In one run, on the same prompts: records the trajectories with `--store full` and with
`--store stats` (target + drafts, through the same code path as the CLI, HDF5 writes
included; greedy and sampled), then generates the greedy ones with Hugging Face
``generate`` (exactly as many new tokens) and, where vLLM's environment exists (`make vllm`),
with vLLM too (its CPU build on a CPU, as a subprocess: plain decoding, batch 1, the same
prompt token ids, timed over --vllm-rounds calls after a warm-up), and checks that the tokens
agree. Prints
positions per second of each, time(record) / time(plain generate) for greedy, the
seconds spent computing the per-position statistics on the device (the overhead against
recording the logits alone), bytes per position of each storage and their ratio (goal:
stats at least 100x smaller than full), and whether both storages hold identical
statistics.
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
    parser.add_argument("--draft", action="append", help="repeatable; default int8")
    parser.add_argument("--prompts", type=int, default=4, help="first prompt of this many Spec-Bench categories")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, action="append", help="repeatable; default 0 and 0.7")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=1, help="prompts recorded together (as `specsim cache`)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vllm-rounds", type=int, default=3, help="timed vLLM generate calls (0: skip vLLM)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    from specsim.cache.layout import CacheSpec
    from specsim.cache.reader import CacheReader
    from specsim.cache.writer import CacheWriter
    from specsim.prompts import load_prompts
    from specsim.record.models import load_draft, load_model, resolve_device
    from specsim.record.recorder import RecordConfig, prompt_records, record

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    device = resolve_device(args.device)
    drafts_specs = args.draft or ["int8"]
    temperatures = tuple(args.temperature or (0.0, 0.7))
    target = load_model(args.target, device=device)
    drafts = [load_draft(d, target, device=device) for d in drafts_specs]
    prompt_set = load_prompts("spec-bench", per_category=1)
    records = prompt_records(prompt_set.prompts[: args.prompts], target.tokenizer)
    config = RecordConfig(max_new_tokens=args.max_new_tokens, temperatures=temperatures, batch_size=args.batch_size)

    # Warm both paths once so neither pays first-call costs.
    warm = [records[0].token_ids.tolist()]
    with torch.inference_mode():
        target.model.generate(torch.tensor(warm, device=device), max_new_tokens=2, do_sample=False)

    runs, stats_arrays = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for storage in ("full", "stats"):
            path = Path(tmp) / f"{storage}.h5"
            spec = CacheSpec(vocab_size=target.vocab_size, drafts=tuple(drafts_specs), temperatures=temperatures,
                             storage=storage)
            cpu0 = time.process_time()
            with CacheWriter.create(path, spec, records) as writer:
                outcome = record(writer, target, drafts, config, progress=False)
            with CacheReader(path) as reader:
                n = reader.n_positions
                stats_arrays[storage] = {(c, name): reader.stats(c, name, 0, n) for c in reader.spec.columns
                                         for name in reader.stat_names(c)}
                greedy = [(r.prompt_index, reader.tokens(r.start, r.stop)) for r in reader.iter_trajectories(0.0)]
                runs[storage] = (outcome, reader.size_bytes, time.process_time() - cpu0)

    t0 = time.perf_counter()
    mismatches, greedy_positions = 0, 0
    with torch.inference_mode():
        for prompt_index, tokens in greedy:
            ids = torch.tensor([records[prompt_index].token_ids.tolist()], device=device)
            n = len(tokens)
            greedy_positions += n
            out = target.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                        pad_token_id=target.tokenizer.pad_token_id or 0)
            mismatches += int(not np.array_equal(out[0, ids.shape[1] :].cpu().numpy(), tokens))
    plain = time.perf_counter() - t0

    full, stats = runs["full"], runs["stats"]
    positions = full[0].positions
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"target {args.target}, drafts {', '.join(drafts_specs)}, device {device}, threads {args.threads}, "
          f"batch size {args.batch_size}, load {load}")
    print(f"{full[0].trajectories} trajectories at T={', '.join(f'{t:g}' for t in temperatures)}, {positions} positions "
          f"(Spec-Bench, first prompt of {args.prompts} categories, up to {args.max_new_tokens} new tokens)")
    for name, (outcome, size, cpu) in runs.items():
        print(f"--store {name:5s}: {outcome.seconds:6.2f} s wall, {cpu:6.2f} s CPU, "
              f"{positions / outcome.seconds:6.1f} positions/s; statistics on the device {outcome.stats_seconds:5.2f} s "
              f"({outcome.stats_seconds / (outcome.seconds - outcome.stats_seconds):.1%} over the rest of the "
              f"recording); {size / positions:>9,.0f} bytes/position ({size / 1e6:.2f} MB)")
    print(f"size full / stats: {full[1] / stats[1]:.0f}x  (goal >= 100x; vocab {target.vocab_size:,}, "
          f"{1 + len(drafts)} columns)")
    same = stats_arrays["full"].keys() == stats_arrays["stats"].keys() and all(
        np.array_equal(stats_arrays["full"][k], stats_arrays["stats"][k], equal_nan=True) for k in stats_arrays["full"])
    print(f"statistics identical in both files: {same}")
    share = greedy_positions / positions
    print(f"plain HF generate of the {len(greedy)} greedy trajectories: {plain:.2f} s, "
          f"{greedy_positions / plain:.1f} positions/s; record (full) / plain generate, per position: "
          f"{full[0].seconds / positions / (plain / greedy_positions):.2f}  (greedy share {share:.0%})")
    print(f"greedy tokens identical to HF generate: {len(greedy) - mismatches}/{len(greedy)} trajectories")
    if args.vllm_rounds > 0:
        _vllm_baseline(args, target, records, greedy, full[0].seconds / positions)


def _vllm_baseline(args, target, records, greedy, record_per_position: float) -> None:
    """Plain greedy decoding of the same trajectories in vLLM (a subprocess in its own environment)."""
    from specsim.engines.export import model_directory
    from specsim.engines.vllm import VllmRun, run_vllm, vllm_python
    from specsim.errors import EngineError

    try:
        python = vllm_python()
    except EngineError as exc:
        print(f"vLLM: skipped ({exc})")
        return
    n = max(len(tokens) for _, tokens in greedy)
    prompts = tuple(tuple(int(x) for x in records[i].token_ids) for i, _ in greedy)
    run = VllmRun(model=model_directory(args.target), prompts=prompts, max_tokens=n, configs={"plain": None},
                  rounds=args.vllm_rounds, batch=1, threads=args.threads,
                  max_model_len=max(len(p) for p in prompts) + n + 16)
    try:
        result = run_vllm(run, python=python)
    except EngineError as exc:
        print(f"vLLM: failed ({exc})")
        return
    outs = [r["tokens"] for r in result["runs"]["plain"][0]["requests"]]
    same = sum(np.array_equal(np.asarray(o[: len(t)]), t) for o, (_, t) in zip(outs, greedy))
    made = sum(len(o) for o in outs)
    wall = float(np.median([t["plain"]["seconds"] for t in result["timings"]]))
    decode = float(np.median([t["plain"]["decode_s"] for t in result["timings"]]))
    print(f"vLLM {result['vllm']} plain generate of the same {len(greedy)} prompts ({made} tokens, median of "
          f"{args.vllm_rounds} calls): {wall:.2f} s wall with prefill, {decode:.2f} s decoding, "
          f"{made / wall:.1f} positions/s; record (full) / vLLM generate, per position: "
          f"{record_per_position / (wall / made):.2f}")
    print(f"greedy tokens identical to vLLM: {same}/{len(greedy)} trajectories (up to the cached length)")


if __name__ == "__main__":
    main()
