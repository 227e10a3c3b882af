"""`specsim live`: real speculative decoding over a prompt set, with measured speedup."""

from __future__ import annotations


import click

from specsim import specs as registry
from specsim.cli import _common as c


def format_rows(df) -> str:
    """The live columns a user reads, fitted to the terminal."""
    show_cat = df["category"].n_unique() > 1
    header = ["tree", "draft", "policy", "T", "batch"] + (["category"] if show_cat else []) + [
        "tokens/call [95% CI]", "speedup [95% CI]", "tok/s live", "tok/s plain", "ms/token", "accept rate [95% CI]",
        "draft ms/step", "verify ms/step", "decodes/tokens"]
    num = lambda v, f: "-" if v is None or v != v else format(v, f)  # noqa: E731
    lines = []
    for r in df.iter_rows(named=True):
        lines.append([r["tree"], r["draft"], r["policy"], f"{r['temperature']:g}", str(r["batch"])]
                     + ([r["category"]] if show_cat else [])
                     + [c.ci(r["tokens_per_call"], r["tokens_per_call_lo"], r["tokens_per_call_hi"]),
                        c.ci(r["speedup"], r["speedup_lo"], r["speedup_hi"]),
                        num(r["live_tokens_per_s"], ".1f"), num(r["plain_tokens_per_s"], ".1f"),
                        num(r["latency_per_token_ms"], ".1f"),
                        c.ci(r["accept_rate"], r["accept_rate_lo"], r["accept_rate_hi"]),
                        f"{r['draft_ms_per_call']:.1f}", f"{r['verify_ms_per_call']:.1f}",
                        f"{r['n_decodes']}/{r['n_positions']}"])
    return c.table(header, lines, keep=6)


def footer(df, run) -> str:
    first = df.row(0, named=True)
    lines = [
        f"measured on {first['device']}: target {first['target']}, draft {first['draft']}, "
        f"{first['n_prompts']} prompts x {len({t.repeat for t in run.trajectories})} repeat(s), "
        f"max {first['max_new_tokens']} new tokens, batch {first['batch']} ({first['batching']}); "
        "plain decoding of the same requests, same batching, in the same run",
        "speedup = live output tokens/s over plain tokens/s, decode steps only (prompt passes apart: "
        f"{first['prefill_s']:.2f} s); CIs: 95% bootstrap over prompts (a prompt's repeats summed); "
        "ms/token: mean per-request latency per token",
    ]
    if first["identical_to_plain"] is not None:
        lines.append(f"greedy output identical to plain greedy decoding: {first['identical_to_plain']:.0%} of decodes")
    if run.interrupted:
        lines.append("interrupted (Ctrl-C): these rows cover the decodes that finished")
    return "\n".join(lines)


@c.command("live")
@click.option("--target", required=True, help="Target model: packaged short name, GGUF file, HF directory or hub id.")
@click.option("--draft", required=True,
              help="Draft: a model spec like --target, layers:K, int8 (derived from the target), or ngram:N / "
                   "prompt-lookup:N / suffix[:depth=24,factor=1,prob=0.1] (model-free; suffix decodes --batch 1).")
@click.option("--prompts", default="spec-bench", show_default=True,
              help="'spec-bench', or a JSONL file (turns/prompt/text field, optional category) or a text file.")
@click.option("--categories", multiple=True, callback=c.names, help="Only these categories (comma-separated or repeated).")
@click.option("--per-category", type=click.IntRange(min=1), default=None, help="Take the first N prompts of each category.")
@click.option("--tree", default="chain:4", show_default=True, metavar="SPEC",
              help="Draft tree: chain:4, kary:2,3, widths:4,2,1, medusa:[[0],[1]], file:t.json.")
@click.option("--policy", default="greedy", show_default=True,
              metavar="|".join(registry.policy_names(live=True)),
              help="greedy (argmax, T=0), sample (lossless speculative sampling at --temperature), block (block "
                   "verification of a chain drafted from q at --temperature: kept or cut as a whole, as vLLM's "
                   "rejection_sample_method=block), a lossy rule (p>=q, p>=lq:λ, typical[:eps,delta]: each draft kept "
                   "while the rule passes it), or a chain whose length adapts call by call: adaptive-hf "
                   "(Hugging Face's schedule) or adaptive-history[:hi,lo]; these verify greedily at T=0 and by "
                   "sampling at T>0.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="Sampling temperature  [default: 1 for sample and block, else 0]")
@click.option("--multi-draft", type=c.choice(registry.MULTI_DRAFT), default="iid", show_default=True,
              help="How a sampling tree draws a node's k candidates from q. "
                   + registry.vocab_help(registry.MULTI_DRAFT) + ".")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Requests decoded together (one draft and one target forward per step for all of them).")
@click.option("--batching", type=c.choice(registry.BATCHING), default="lockstep", show_default=True,
              help="How B requests share engine steps. " + registry.vocab_help(registry.BATCHING) + ".")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Speculative decodes per prompt, each with its own seed (sampling: tighter CIs).")
@c.seed_option
@c.device_option
@click.option("--dtype", type=c.choice(registry.DTYPES), default="float32", show_default=True,
              help="The models' dtype. " + registry.vocab_help(registry.DTYPES) + ".")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for torch.")
@c.out_options
@click.option("--steps-out", type=str, default=None, metavar="PATH",
              help="Write one row per target call (start, accepted, path, batch, draft/verify ms); format from the suffix.")
@c.quiet_option
@c.friendly_errors
def live(target, draft, prompts, categories, per_category, tree, policy, temperature, multi_draft, max_new_tokens,
         batch, batching, repeats, seed, device, dtype, threads, out, out_format, overwrite, steps_out, quiet):
    """Run real speculative decoding and measure it against plain decoding in the same run.

    The draft fills the tree level by level (one draft forward per level), the
    target verifies every node in ONE forward with a tree attention mask, and the
    rules of specsim.verify decide acceptance; the accepted path's KV entries are
    kept, the rest dropped. --batch B decodes B requests at once (one draft and one
    target forward per step for the whole batch, each request with its own accepted
    length), as serving engines do. The same requests are also decoded plainly with
    the same batching (the speedup baseline). Rows have `specsim simulate`'s columns,
    so the two can be joined.

    \b
    Examples:
      specsim live --target smollm2-135m --draft int8 --per-category 1 --tree chain:4 \\
          --max-new-tokens 64 --out live.parquet
      specsim live --target smollm2-135m --draft layers:20 --tree kary:2,3 --policy sample \\
          --temperature 0.7 --multi-draft swor --repeats 3 --steps-out steps.parquet
      specsim live --target smollm2-135m --draft ngram:3 --tree widths:2,1,1 --categories coding
      specsim live --target smollm2-135m --draft int8 --tree chain:4 --batch 4 --per-category 1
      specsim live --target smollm2-135m --draft layers:20 --tree chain:3 --policy adaptive-hf

    Ctrl-C stops after the decode in progress and prints what finished.
    """
    from specsim.interrupts import sigterm_as_interrupt
    from specsim.live.decoder import LiveConfig
    from specsim.prompts import load_prompts
    from specsim.specs import parse_tree

    target_out = c.out_target(out, out_format, overwrite)
    steps_target = c.out_target(steps_out, None, overwrite, "--steps-out") if steps_out else (None, None)
    if temperature is None:
        temperature = 1.0 if registry.parse_policy(policy).kind.temperature == ">0" else 0.0
    parsed = parse_tree(tree)
    if parsed.name == "":
        parsed = type(parsed)(parsed.parents, parsed.ranks, name=tree)
    config = LiveConfig.for_policy(parsed, policy, temperature, multi_draft=multi_draft,
                                   max_new_tokens=max_new_tokens, batch=batch, batching=batching)
    from specsim.specs import check_batch

    check_batch(draft, batch)
    prompt_set = load_prompts(prompts, categories=list(categories) or None, per_category=per_category)

    from specsim.live.decoder import Target
    from specsim.live.runs import build_drafter, device_label, live_prompts, load_target, run_live
    from specsim.record.models import eos_token_ids

    loaded, device = load_target(target, device=device, dtype=dtype, threads=threads,
                                 echo=lambda line: click.echo(line, err=True))
    drafter = build_drafter(draft, loaded, device=device, dtype=dtype)
    with sigterm_as_interrupt():
        run = run_live(Target(loaded.model, eos_token_ids(loaded)), drafter, live_prompts(loaded, prompt_set.prompts),
                       config, target_name=loaded.name, repeats=repeats, seed=seed, device=device_label(device),
                       progress=not quiet)
    report(run, out=target_out, steps_out=steps_target)


def report(run, *, out: tuple, steps_out: tuple) -> None:
    """Print the rows and write what was asked; `out`, `steps_out`: (target, format) from `out_target`."""
    import polars as pl

    from specsim.errors import SpecError
    from specsim.live.runs import steps_frame, summary_rows

    rows = summary_rows(run)
    if not rows:
        raise SpecError("interrupted before any prompt finished; nothing to report")
    df = pl.DataFrame(rows, infer_schema_length=None)
    echo = (lambda text="": click.echo(text, err=True)) if out[0] == "-" else click.echo
    echo(format_rows(df.filter(df["category"] == "all")))
    echo()
    echo(footer(df, run))
    if out[0] is not None:
        echo(f"wrote {len(df)} rows to {c.write_frame(df, *out)}")
    if steps_out[0] is not None:
        steps = steps_frame(run).with_columns(  # one schema in every format: the accepted path as "2 6"
            pl.col("path").list.eval(pl.element().cast(pl.String)).list.join(" "))
        echo(f"wrote {len(steps)} steps to {c.write_frame(steps, *steps_out)}")
