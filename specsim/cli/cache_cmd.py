"""`specsim cache`: record target trajectories and draft logits into an HDF5 cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from specsim import specs as registry
from specsim.cli import _common as c
from specsim.record.recorder import MAX_OVERHANG, OVERHANG, phases_line


@c.command("cache")
@click.option("--target", required=True, help="Target model: packaged short name, GGUF file, HF directory or hub id.")
@click.option("--draft", "drafts", multiple=True, callback=c.names,
              help="Draft (repeatable or comma-separated): a model spec like --target; layers:K or int8 (derived "
                   f"from the target); {registry.head_specs()} (heads on the target's hidden states: ours "
                   "from `specsim train-draft`, or a published checkpoint directory / hub id: safetensors, or "
                   "pytorch_model.bin read with torch.load(weights_only=True)).")
@click.option("--prompts", default="spec-bench", show_default=True,
              help="'spec-bench', or a JSONL file (turns/prompt/text field, optional category) or a text file (one prompt a line).")
@click.option("--categories", multiple=True, callback=c.names, help="Only these categories (comma-separated or repeated).")
@click.option("--per-category", type=click.IntRange(min=1), default=None, help="Take the first N prompts of each category.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", "temperatures", multiple=True, callback=c.numbers(float, minimum=0),
              help="Sampling temperature (repeatable or comma-separated); 0 = greedy.  [default: 0]")
@c.seed_option
@c.device_option
@click.option("--dtype", type=c.choice(registry.DTYPES), default="float32", show_default=True,
              help="The models' dtype. " + registry.vocab_help(registry.DTYPES) + ".")
@click.option("--batch-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="Prompts generated together (left-padded; on a CPU each prompt's first pass runs alone). Faster "
                   "on a CPU too: 8 prompts x 96 tokens recorded 2.3x faster at 8 than at 1 (2-core Xeon); the demo's "
                   "13 prompts x 32 tokens at T = 0 and 0.7 1.6x faster at 13 (2-core AVX2 EPYC). Greedy tokens are "
                   "the same, the statistics within 3e-5 (padded batches round differently in float32); a sampled "
                   "token can differ where that rounding moves a draw across a boundary (1 of the demo's 13 "
                   "trajectories at T = 0.7).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Cache file to write (.h5).")
@click.option("--resume", is_flag=True, help="Continue an interrupted cache (same settings), skipping finished trajectories.")
@click.option("--overwrite", is_flag=True, help="Replace an existing cache file.")
@click.option("--store", type=c.choice(registry.STORES), default="full", show_default=True,
              help=registry.vocab_help(registry.STORES) + ".")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="With --store full: keep only the top-K logits per position plus the log-sum-exp of the rest "
                   "(0 = all logits).")
@click.option("--candidates", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Sampling trees: record the acceptance of up to this many candidates per node (i.i.d. exact; "
                   "without replacement: exact for two, Monte-Carlo beyond).")
@click.option("--swor-samples", type=click.IntRange(min=16), default=256, show_default=True,
              help="Monte-Carlo samples per position for candidates drawn without replacement (a multiple of 16).")
@click.option("--lossy", "lossy", multiple=True, callback=c.specs,
              help="Lossy rules whose acceptance and distortion to record (repeatable) "
                   "[default: p>=q, p>=lq:0.5, typical:0.09,0.3].")
@click.option("--expand", "expand", default=None, metavar="topk=K,depth=D",
              help="Also record each draft's EAGLE-2 tree expansion at every position (beam of K by cumulative "
                   "log-prob, D levels), draft models and heads alike (EAGLE-3 is served with these trees): "
                   "replays dynamic:topk=K,depth=D',tokens=N for any D' <= D and N <= K + (D-1)K². Costs D-1 "
                   "extra draft forwards per chunk of positions (none for Medusa heads, whose one pass has "
                   "every level; D <= their head count).")
@click.option("--expand-target", "expand_target", type=click.IntRange(1, 16), default=None, metavar="K",
              help="Also record the target along the draft's own proposals: at every position of a T > 0 "
                   "trajectory, --proposal-chains chains of K drafts drawn from each draft model, and the target "
                   "at every prefix of them (one batched target forward per chunk of positions). Replays "
                   "`--policy block` (block verification of chains up to K drafted from q) without bias, with a "
                   "standard error from the chains. About K - 1 extra draft forwards and one target forward of "
                   "R(K - 1) tokens per position, per chunk.")
@click.option("--proposal-chains", type=click.IntRange(2, 64), default=8, show_default=True, metavar="R",
              help="With --expand-target: chains drawn per position (the replay's Monte-Carlo error falls as "
                   "1/sqrt(R)).")
@click.option("--head-depth", type=click.IntRange(1, 16), default=None,
              help="Depths recorded for head drafts: their law is recorded per call start and depth, so trees up "
                   "to this deep replay  [default: Medusa's head count; EAGLE 5].")
@click.option("--hidden-states", "hidden", default=None, metavar="LAYERS",
              help="Also store the target's hidden states per position (float16): 'last' (the LM head's input, "
                   "what `specsim train-draft` trains on), 'prenorm' (before the final norm: MiMo-style MTP) "
                   "and/or decoder layer numbers, comma-separated.")
@c.hidden_batch_option(
    "Compute the target's hidden states (--hidden-states, head drafts) for a batch's trajectories in "
    "right-padded forwards of up to TOKENS tokens instead of one forward per trajectory. For a GPU: "
    "on an H200, 65536 recorded SmolLM2-135M 1.45x faster (its hidden states 3.3 -> 0.5 s for 128 "
    "trajectories); on a 2-core CPU it was slower (4.4 against 2.8 s). The states equal the "
    "unbatched ones up to rounding.")
@click.option("--shard", default=None, metavar="I/N|auto",
              help="Record every N-th prompt from the I-th (0-based) into its own file; `auto` reads torchrun's "
                   "RANK/WORLD_SIZE or a SLURM array's task id. --out may contain {i} and {n}. Join the shards "
                   "with `specsim merge`.")
@click.option("--overhang", type=click.IntRange(0, MAX_OVERHANG), default=OVERHANG, show_default=True,
              help="Positions recorded past each trajectory's end (the target decodes on past max_new_tokens and "
                   "EOS). An engine that drafts and verifies past the end (vLLM) counts drafts accepted there; "
                   "replaying its counters exactly for chains of k drafts needs k - 1. Not part of any trajectory.")
@c.quiet_option
@c.friendly_errors
def cache(target, drafts, prompts, categories, per_category, max_new_tokens, temperatures, seed, device, dtype,
          batch_size, out, resume, overwrite, store, top_k, candidates, swor_samples, lossy, expand, expand_target,
          proposal_chains, head_depth, hidden, hidden_batch, shard, overhang, quiet):
    """Record what the target and each draft predict along target-sampled trajectories.

    For every prompt and temperature the target samples a trajectory (greedy at T=0),
    and the cache keeps, at each generated position, what exact replay needs of the
    target's and every draft's next-token distributions (ranks, log-probabilities,
    multi-draft acceptance, lossy rules' acceptance), computed on the recording device
    in float32 — and with --store full the logits themselves. `specsim simulate` then
    replays any draft tree, budget and policy on it exactly, on a CPU.

    \b
    Examples:
      specsim cache --target smollm2-135m --draft int8 --draft layers:20 \\
          --per-category 1 --max-new-tokens 48 --temperature 0 --temperature 0.7 \\
          --out cache/demo.h5
      specsim cache --target Qwen/Qwen2.5-7B-Instruct --draft Qwen/Qwen2.5-0.5B-Instruct \\
          --device cuda --dtype bfloat16 --batch-size 8 --store stats --out cache/qwen7b.h5
      specsim cache ... --expand topk=4,depth=4 --out cache/eagle.h5   # dynamic trees
      specsim cache ... --temperature 0.7 --expand-target 4 --out cache/block.h5   # --policy block
      specsim cache --target smollm2-135m --hidden-states last --out cache/train.h5
      specsim cache --target smollm2-135m --draft medusa:heads/medusa --draft eagle:heads/eagle \\
          --out cache/heads.h5                            # heads from `specsim train-draft`
      specsim cache ... --out cache/demo.h5 --resume     # after an interruption
      torchrun --nproc-per-node 8 -m specsim cache ... --store stats --shard auto \\
          --out cache/big-{i}-of-{n}.h5                    # one shard per GPU
      specsim merge cache/big.h5 cache/big-*-of-8.h5

    Ctrl-C (or SIGTERM) keeps every finished trajectory; rerun the same command with
    --resume. One process records a file at a time: a second one refuses at once.
    """
    from specsim.cache.stats import LOSSY_RULES, StatsSpec
    from specsim.record.run import RecordRequest, parse_hidden, parse_shard, record_cache, shard_device, shard_path

    from specsim.sim.dynamic import parse_expansion

    expansion = parse_expansion(expand) if expand is not None else None
    stats = StatsSpec(candidates=candidates, swor_samples=swor_samples, lossy=tuple(lossy) or LOSSY_RULES,
                      expand=None if expansion is None else (expansion.topk, expansion.depth),
                      expand_target=None if expand_target is None else (expand_target, proposal_chains))
    shard = parse_shard(shard)
    out = shard_path(out, shard)
    device = shard_device(device) if shard else device
    request = RecordRequest(target=target, drafts=tuple(drafts), prompts=prompts, categories=tuple(categories) or None,
                            per_category=per_category, max_new_tokens=max_new_tokens,
                            temperatures=tuple(temperatures) or (0.0,), seed=seed, device=device, dtype=dtype,
                            batch_size=batch_size, top_k=top_k, store=store, stats=stats, shard=shard,
                            hidden=parse_hidden(hidden), head_depth=head_depth, overhang=overhang,
                            hidden_batch_tokens=hidden_batch or 0)
    outcome = record_cache(out, request, resume=resume, overwrite=overwrite, progress=not quiet,
                           echo=lambda line: click.echo(line, err=True))
    timing = phases_line(outcome.phases, outcome.seconds)
    if outcome.interrupted:
        click.echo(f"interrupted: {out} keeps {outcome.total} committed trajectories; "
                   "rerun the same command with --resume to continue", err=True)
        if outcome.seconds > 0:
            click.echo(f"this run: {outcome.trajectories} trajectories ({outcome.positions} positions) in "
                       f"{outcome.seconds:.1f} s" + (f"; {timing}" if timing else ""), err=True)
        # Skip interpreter finalisation: the cache is closed and nothing else needs cleaning up, while
        # garbage-collecting torch + transformers after an interrupt took minutes on a loaded machine.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    rate = outcome.positions / outcome.seconds if outcome.seconds > 0 else 0.0
    extra = [what for what, asked in (("expanding the drafts' trees", expansion is not None),
                                      ("the target along the drafts' proposals", expand_target is not None)) if asked]
    click.echo(
        f"recorded {outcome.trajectories} trajectories ({outcome.positions} positions) in {outcome.seconds:.1f} s "
        f"({rate:.1f} positions/s, target + {len(drafts)} draft(s)); {outcome.skipped} already present"
        + (f"; {' and '.join(extra)} took {outcome.expand_seconds:.1f} s of it "
           f"({outcome.expand_seconds / outcome.seconds:.0%})" if extra and outcome.seconds > 0 else "")
    )
    if timing:
        click.echo(timing)
    click.echo(f"wrote {out}: {outcome.total} trajectories, {c.human_bytes(outcome.bytes)}; next: specsim inspect {out}")
