"""Prompts written by the target itself (Magpie: Xu et al., "Magpie: Alignment Data Synthesis from Scratch by
Prompting Aligned LLMs with Nothing", arXiv 2406.08464): the chat template up to the start of a user turn, sampled at
T = 1 until the turn ends. An instruct model then writes the kind of request it was tuned on.

Usage: python gen_prompts.py TARGET N OUT.jsonl [--device cuda] [--batch 512] [--max-new-tokens 160] [--seed 0]

Writes N distinct prompts as JSONL ({"prompt": ..., "category": "generated"}), the turns that ended (the template's
end-of-turn token) with 3 to 2,000 characters; says how many were drawn, kept and why the rest were dropped.
"""
import argparse
import json
import sys
import time

import torch

from specsim.record.models import load_model

MARK = "\x00specsim-user-turn\x00"


def user_prefix(tokenizer) -> str:
    """The rendered chat template up to where a user turn's text begins (its default system prompt included)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                             add_generation_prompt=False)
    return rendered.split(MARK)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("n", type=int)
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-rounds", type=int, default=50)
    args = ap.parse_args()
    loaded = load_model(args.target, device=args.device)
    tok, model = loaded.tokenizer, loaded.model
    end = tok.convert_tokens_to_ids("<|im_end|>")
    prefix = tok(user_prefix(tok), add_special_tokens=False, return_tensors="pt")["input_ids"].to(model.device)
    torch.manual_seed(args.seed)
    kept, seen, drawn, unfinished, bad_len, dup = [], set(), 0, 0, 0, 0
    start = time.perf_counter()
    for _ in range(args.max_rounds):
        if len(kept) >= args.n:
            break
        with torch.no_grad():
            ids = prefix.expand(args.batch, -1)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=args.max_new_tokens, eos_token_id=end, pad_token_id=end)
        for row in out[:, prefix.shape[1]:].tolist():
            drawn += 1
            if end not in row:
                unfinished += 1
                continue
            text = tok.decode(row[:row.index(end)], skip_special_tokens=True).strip()
            if not 3 <= len(text) <= 2000:
                bad_len += 1
            elif text in seen:
                dup += 1
            else:
                seen.add(text)
                kept.append(text)
    kept = kept[:args.n]
    with open(args.out, "w") as f:
        for text in kept:
            f.write(json.dumps({"prompt": text, "category": "generated"}, ensure_ascii=False) + "\n")
    print(f"{len(kept)} prompts to {args.out} in {time.perf_counter() - start:.1f} s: {drawn} drawn, {unfinished} "
          f"unfinished in {args.max_new_tokens} tokens, {bad_len} too short or long, {dup} repeated "
          f"(target {args.target}, T = 1, seed {args.seed})", file=sys.stderr)


if __name__ == "__main__":
    main()
