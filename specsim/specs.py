"""The spec vocabulary: every tree family, draft kind and verification policy, one table each.

A spec string names a thing on the command line and in result rows: ``kary:2@8``,
``ngram:3``, ``p>=lq:0.5``. Each kind is one entry of a registry (a plain dict from its name)
that declares its grammar, an example, what it needs from a cache, whether it is lossless,
whether its numbers are exact or estimated, and the function that builds it. Every
command, the simulator, live decoding and the report parse specs here, so a new kind is
one new entry. numpy only: builders that need more are named "module:function" and
imported when used.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from specsim.errors import ArgumentError, SpecError
from specsim.expansion import DynamicTree, parse_dynamic
from specsim.trees import Tree, chain, file, kary, kary_prefix, medusa, widths


def load(target: str):
    """The object a "module:attribute" registry entry names, imported on first use (the one import-by-string)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


# -- small vocabularies: name -> what it means (the click choices and their --help are made from these) ----------

MULTI_DRAFT = {  # how a sampling tree's node draws its k candidates from q
    "iid": "i.i.d. draws (SpecInfer)",
    "swor": "draws without replacement",
}
BATCHING = {  # how B requests share engine steps
    "lockstep": "a batch runs until its last request finishes (static batching)",
    "continuous": "a finished request's place goes to the next prompt at once",
}
ENGINES = {  # what decodes for real, as ground truth or as the priced engine
    "specsim": "specsim's own live engine",
    "vllm": "vLLM, in its own environment (make vllm)",
}
EMIT_TARGETS = {  # engines `optimize --emit` writes a configuration for
    "vllm": "its speculative_config JSON (a length per batch size)",
    "sglang": "its launch flags",
}
HEAD_KINDS = {  # heads `train-draft` trains
    "medusa": "K residual-block heads on the target's last hidden state, sharing its LM head",
    "eagle": "one decoder layer fed the target's feature and the next token's embedding",
    "eagle3": "EAGLE-3: the target's low, middle and high layers fused, one decoder layer, its own LM head "
              "(optionally over a smaller draft vocabulary), trained with training-time test",
    "mtp": "multi-token prediction (DeepSeek-V3's module, or MiMo's wiring): embedding and state projected, one "
           "decoder block, the target's LM head; reused at every depth, trained unrolled on its own states",
}

MTP_STYLES = {  # how `train-draft --kind mtp` wires its layer, as the engines run each family
    "deepseek": "DeepSeek-V3's: cat(embedding, state), fed the target's normed state; on a DeepSeek-V3 target its "
                "block is the target's kind (latent attention, experts)",
    "mimo": "MiMo's: cat(state, embedding), fed the target's state before its final norm (record --hidden-states "
            "prenorm)",
}

DTYPES = {  # the models' arithmetic (`cache`, `live`, `profile`, `bench-attention`)
    "float32": "on a CPU speculative greedy decoding equals plain greedy decoding (the exactness checks need it)",
    "float16": "half precision, a GPU's",
    "bfloat16": "a GPU's usual (on a CPU speculative greedy decoding need not equal plain greedy decoding)",
}

STORES = {  # what `specsim cache` keeps per recorded position
    "full": "the per-position statistics and every logit (float16)",
    "stats": "the statistics only, computed on the recording device (a few hundred bytes a position instead of "
             "~4 V bytes per model; enough for every exact policy)",
}

PROMPT_USES = {  # what the prompt is to `train-draft` (a cache stores states at generated positions only)
    "context": "the head attends over the prompt's states, as when it drafts; the loss is on the generated tokens",
    "loss": "as context, and the loss also covers the prompt's tokens: the target's laws on text it did not write",
    "none": "the generated part alone: the head never sees the prompt, a mismatch with drafting kept to measure it",
}

LR_SCHEDULES = {  # `train-draft`'s learning rate over its steps
    "cosine": "a linear warm-up over the first 1.5% of the steps, then cosine decay to zero, with the gradient norm "
              "clipped at 0.5 (SpecForge's EAGLE-3 trainer: BF16Optimizer with CosineAnnealingWarmupLR, defaults "
              "copied from EAGLE's traineagle3)",
    "constant": "the same rate at every step, no clipping (how specsim trained heads before cosine was the default)",
}

TRAIN_PRECISIONS = {  # the arithmetic of `train-draft`'s training steps (held-out numbers are always float32)
    "float32": "float32 throughout",
    "bfloat16": "mixed precision: matrix products in bfloat16 (torch.autocast), weights, optimiser state, the "
                "loss's softmaxes and the target's laws in float32, as EAGLE-3 heads are trained on GPUs "
                "(SmolLM2-135M's EAGLE-3 head, batched steps: 1.22-1.29x float32's steps per second on a 2-core CPU "
                "with AMX, two runs; on an H200 its runs cost about 30 s more than float32's whatever their "
                "length, not yet diagnosed)",
}


def vocab_help(vocab: dict) -> str:
    """'a: what a means; b: ...' for a --help text."""
    return "; ".join(f"{name}: {meaning}" for name, meaning in vocab.items())


# -- trees ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeKind:
    """A family of draft trees."""

    name: str  # the spec's head, before the colon
    grammar: str  # the accepted forms
    example: str  # a spec that parses
    summary: str  # one line for --help and `specsim trees`
    needs: str  # what it needs besides the spec: "nothing", or which cache data
    build: Callable[[str], Tree | DynamicTree] | None  # the argument after the colon -> a tree; None: needs a cache
    over_budget: Callable[[str, int], str] | None = None  # bare form + --budget N -> a concrete spec
    bare: re.Pattern | None = None  # the bare form expanded over --budget (e.g. "kary:2")


def _kary(arg: str) -> Tree:
    w, at, n = arg.partition("@")
    if at:
        return kary_prefix(_one_int(w, "kary:W@N width"), _one_int(n, "kary:W@N budget"))
    return kary(arg)


def _one_int(text: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise SpecError(f"{what} {text.strip()!r} is not an integer") from None


def _dynamic(arg: str) -> DynamicTree:
    return DynamicTree(parse_dynamic(arg))


def _needs_cache(family: str) -> Callable[[str], Tree]:
    def build(arg: str) -> Tree:
        raise SpecError(f"needs a cache to fit on: use it where one is given, e.g. `specsim simulate CACHE --tree "
                        f"{family}:{arg.strip()}`")
    return build


TREE_KINDS: dict[str, TreeKind] = {
    "chain": TreeKind("chain", "chain:G | chain (over --budget)", "chain:4",
                      "G drafts in a line, the draft's top choice each time", "nothing", chain,
                      over_budget=lambda bare, n: f"chain:{n}", bare=re.compile(r"chain$", re.I)),
    "kary": TreeKind("kary", "kary:W,D | kary:W@N | kary:W (over --budget)", "kary:2,3",
                     "the full W-ary tree of depth D, or its first N nodes breadth-first", "nothing", _kary,
                     over_budget=lambda bare, n: f"{bare.lower()}@{n}", bare=re.compile(r"kary:\s*\d+\s*$", re.I)),
    "widths": TreeKind("widths", "widths:w1,w2,...", "widths:4,2,2,1",
                       "the top path branches: w_d children of the rank-0 node at depth d-1", "nothing", widths),
    "medusa": TreeKind("medusa", "medusa:[[r1],[r1,r2],...]", "medusa:[[0],[0,0],[1],[0,0,0]]",
                       "Medusa's rank-path lists, pasted as they are", "nothing", medusa),
    "file": TreeKind("file", "file:PATH", "file:tree.json",
                     "a tree saved by `specsim optimize --out` (or a JSON list of rank paths)", "nothing", file),
    "dynamic": TreeKind("dynamic", "dynamic:topk=K,depth=D,tokens=N", "dynamic:topk=4,depth=4,tokens=16",
                        "EAGLE-2's tree grown per call: beam of K by cumulative draft log-prob, D levels, N best kept",
                        "a cache recorded with --expand topk=K,depth>=D", _dynamic),
    "optimal": TreeKind("optimal", "optimal:N | optimal (over --budget)", "optimal:16",
                        "the best static tree of N drafts on the cache's own trajectories",
                        "a cache: fitted on its trajectories for the draft and policy simulated", None,
                        over_budget=lambda bare, n: f"optimal:{n}", bare=re.compile(r"optimal$", re.I)),
}


def parse_tree(spec: str, *, fit: Callable[[str, str], Tree] | None = None) -> Tree | DynamicTree:
    """The tree a spec names; its name is the spec.

    fit(family, argument): the callback for kinds that need a cache (optimal:N), given where one is.
    Errors are `SpecError`s that quote the spec and point at the offending element.
    """
    if not isinstance(spec, str):
        raise SpecError(f"a tree spec must be a string, got {type(spec).__name__}")
    spec = spec.strip()
    family, sep, arg = spec.partition(":")
    kind = TREE_KINDS.get(family.strip().lower())
    if not sep or kind is None:
        raise SpecError(f"{spec!r} is not a tree spec; use one of " + ", ".join(k.example for k in TREE_KINDS.values()))
    try:
        if kind.build is None:
            if fit is None:
                _needs_cache(kind.name)(arg)
            tree = fit(kind.name, arg)
            if not isinstance(tree, Tree):
                raise TypeError(f"the {kind.name} fit returned {type(tree).__name__}, not Tree")
        else:
            tree = kind.build(arg)
    except SpecError as exc:
        raise SpecError(f"{spec}: {exc}") from None
    return replace(tree, name=spec)


def expand_trees(specs: Sequence[str], budgets: Sequence[int] | None) -> list[str]:
    """Concrete tree specs: bare families (chain, optimal, kary:W) once per budget, full specs as given."""
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        raise ArgumentError("give at least one tree in {trees}, e.g. chain:4 (or chain with {budgets} 4)")
    for b in budgets or ():
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise SpecError(f"budget {b!r} must be an integer >= 1")
    out: list[str] = []
    for raw in specs:
        spec = str(raw).strip()
        kind = next((k for k in TREE_KINDS.values() if k.bare is not None and k.bare.match(spec)), None)
        if spec.lower() == "kary":
            raise SpecError("kary needs a width: kary:W expands over --budget, kary:W,D is the full tree")
        if kind is None:
            out.append(spec)
            continue
        if not budgets:
            full = f"{spec},3" if ":" in spec else f"{spec}:8"
            raise ArgumentError("tree family {spec!r} needs a budget: {budgets} N (or a full spec such as {full})", spec=spec,
                                full=full)
        out += [kind.over_budget(spec.replace(" ", ""), int(b)) for b in budgets]
    return list(dict.fromkeys(out))


def tree_family(spec: str) -> str:
    """The family a tree spec belongs to, as reports group them: kary:2@8 -> kary:2, chain:4 -> chain."""
    head, _, arg = spec.partition(":")
    if head == "kary":
        return f"kary:{re.split(r'[,@]', arg)[0].strip()}" if "@" in arg else "kary"
    return head


def needs_fit(spec: str) -> bool:
    """Whether a tree spec is fitted on a cache (resolved per draft and policy) rather than fixed."""
    kind = TREE_KINDS.get(spec.strip().partition(":")[0].lower())
    return kind is not None and kind.build is None


# -- drafts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftKind:
    """A kind of draft the simulator and live decoding know."""

    name: str  # the spec's head
    grammar: str
    example: str
    summary: str
    needs: str  # what the cache must hold for it
    model_free: bool  # proposes from tokens alone: no draft column, no draft forwards, point masses
    heads: bool = False  # rides on the target's hidden states: recorded per call start and depth
    parse: str | None = None  # "module:function" building its object from the spec
    table: str | None = None  # model-free: "module:function" replaying it (features, tree, policy, rng) -> table
    one_pass: bool = False  # drafts a whole tree in one forward per call (Medusa: every head at the root's state)
    feeds_accepted: bool = False  # its next call first feeds 1 + A entries, the root and the A accepted (EAGLE)
    one_at_a_time: str | None = None  # why live decoding runs its requests one at a time (--batch 1), if it must
    live: str | None = None  # model-free: "module:Class" drafting it live from its spec


DRAFT_KINDS: dict[str, DraftKind] = {
    "model": DraftKind("model", "NAME (a recorded draft column)", "int8",
                       "a draft model recorded in the cache: a separate model, layers:K or int8",
                       "its column in the cache", model_free=False),
    "medusa": DraftKind("medusa", "medusa:DIR_OR_HUB_ID", "medusa:heads/medusa",
                        "Medusa heads on the target's last hidden state (one head per depth, top-k trees)",
                        "its column in the cache, recorded per call start and depth", model_free=False, heads=True,
                        one_pass=True),
    "eagle": DraftKind("eagle", "eagle:DIR_OR_HUB_ID", "eagle:heads/eagle",
                       "an EAGLE-1/2 draft layer on the target's features, autoregressive over its own",
                       "its column in the cache, recorded per call start and depth", model_free=False, heads=True,
                       feeds_accepted=True),
    "eagle3": DraftKind("eagle3", "eagle3:DIR_OR_HUB_ID", "eagle3:heads/eagle3",
                        "an EAGLE-3 head: the target's low, middle and high layers fused, autoregressive over its "
                        "own features, its own LM head (speculators' layout or the EAGLE-3 reference layout)",
                        "its column in the cache, recorded per call start and depth", model_free=False, heads=True,
                        feeds_accepted=True),
    "mtp": DraftKind("mtp", "mtp:DIR_OR_HUB_ID", "mtp:heads/mtp",
                     "a multi-token-prediction layer (DeepSeek-V3's or MiMo's, native in a target checkpoint or "
                     "trained by specsim), reused at every depth as vLLM chains it, or over a tree as SGLang runs it",
                     "its column in the cache, recorded per call start and depth", model_free=False, heads=True,
                     feeds_accepted=True),
    "ngram": DraftKind("ngram", "ngram:N", "ngram:3",
                       "suffix matching on the last N tokens of prompt + output (SGLang's NGRAM speculator)",
                       "nothing: tokens only", model_free=True, parse="specsim.sim.modelfree:parse_modelfree",
                       table="specsim.sim.modelfree:modelfree_table",
                       live="specsim.live.drafting:ModelFreeDrafter"),
    "prompt-lookup": DraftKind("prompt-lookup", "prompt-lookup:N", "prompt-lookup:2",
                               "Hugging Face prompt lookup decoding: the last N..1 tokens matched in the context",
                               "nothing: tokens only", model_free=True, parse="specsim.sim.modelfree:parse_modelfree",
                               table="specsim.sim.modelfree:modelfree_table",
                               live="specsim.live.drafting:ModelFreeDrafter"),
    "vllm-ngram": DraftKind("vllm-ngram", "vllm-ngram:min=A,max=B", "vllm-ngram:min=2,max=3",
                            "vLLM's ngram method: the earliest occurrence of the longest suffix match of A..B tokens, "
                            "one continuation (prompt_lookup_min/max; the tree's depth is num_speculative_tokens)",
                            "nothing: tokens only", model_free=True, parse="specsim.sim.modelfree:parse_modelfree",
                            table="specsim.sim.modelfree:modelfree_table",
                            live="specsim.live.drafting:ModelFreeDrafter"),
    "suffix": DraftKind("suffix", "suffix[:depth=24,factor=1,offset=0,prob=0.1,requests=10000]", "suffix",
                        "SuffixDecoding (vLLM, ArcticInference): suffix trees over the prompt and earlier outputs, "
                        "frequency-ranked, sized by the match length",
                        "nothing: tokens only (earlier outputs in cache order)", model_free=True,
                        parse="specsim.sim.suffix:parse_suffix", table="specsim.sim.suffix:suffix_table",
                        one_at_a_time="each request's global tree holds the outputs of the requests before it",
                        live="specsim.live.drafting:SuffixDrafter"),
}


def draft_kind(spec: str) -> DraftKind:
    """The kind of a draft spec; a name that is no registered head is a model column."""
    return DRAFT_KINDS.get(str(spec).partition(":")[0].strip().lower(), DRAFT_KINDS["model"])


def head_specs() -> str:
    """The head drafts' spec forms for help texts, from the registry: "medusa:DIR, eagle:DIR, ... or mtp:DIR"."""
    forms = [f"{k.name}:DIR" for k in DRAFT_KINDS.values() if k.heads]
    return ", ".join(forms[:-1]) + " or " + forms[-1]


def is_model_free(spec: str) -> bool:
    return draft_kind(spec).model_free


def drafts_to_check(cache, named: Sequence[str], recorded: Sequence[str], example: str) -> list[str]:
    """The drafts a check runs on `cache`: those `named` (every recorded one when none is), each recorded or
    model-free (computed from the trajectory alone); a cache with none refuses in one line, suggesting `example`."""
    from specsim.errors import CacheError

    drafts = list(named) or list(recorded)
    if not drafts:
        raise CacheError(f"{cache}: records no draft; name {example}")
    for d in drafts:
        if d not in recorded and not is_model_free(d):
            raise CacheError(f"{cache}: no draft named {d!r}; recorded drafts: {', '.join(recorded) or 'none'}")
    return drafts


def is_head_draft(spec: str) -> bool:
    """Medusa / EAGLE / EAGLE-3 / MTP heads (`medusa:DIR`, `eagle:DIR`, `eagle3:DIR`, `mtp:DIR`): loaded onto the
    target, one law per call start and depth."""
    return draft_kind(spec).heads


def drafts_in_one_pass(spec: str | None) -> bool:
    """Whether a draft fills any tree with one forward per call (Medusa), not one per tree level."""
    return spec is not None and draft_kind(spec).one_pass


def feeds_accepted(spec: str | None, tree=None) -> bool:
    """Whether a draft's next call feeds the root plus every accepted token first, rather than at most two
    tokens: EAGLE's layer does (its entries pair the target's states with the tokens after them), and so
    does any draft drafting a dynamic `tree` (the expansion's entries are dropped after each call) — except a
    one-pass draft (Medusa's heads), which feeds nothing."""
    if spec is None or draft_kind(spec).one_pass:
        return False
    return draft_kind(spec).feeds_accepted or isinstance(tree, DynamicTree)


def prompt_fed_at_admission(spec: str | None) -> bool:
    """Whether a draft runs its prompt pass when a request is admitted, so the request's first call has no root
    entry to feed (EAGLE's layer: its entries pair the target's prompt states with the tokens after them)."""
    return spec is not None and draft_kind(spec).feeds_accepted


def model_free_drafter(spec: str):
    """The live drafter of a model-free draft spec (`specsim.live.drafting`)."""
    return load(draft_kind(spec).live)(spec)


def check_batch(spec: str, batch: int) -> None:
    """SpecError, before any model loads, when a draft cannot decode `batch` requests together."""
    why = draft_kind(spec).one_at_a_time
    if why and batch != 1:
        raise SpecError(f"{spec} drafts decode one request at a time (--batch 1): {why}")


def model_free_help() -> str:
    return ", ".join(k.grammar for k in DRAFT_KINDS.values() if k.model_free)


# -- policies ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyKind:
    """A verification policy."""

    name: str
    example: str
    summary: str
    params: tuple[int, ...]  # numbers of parameters allowed after the colon
    lossless: bool  # the output is distributed as p (else: approximate, with its TV distortion)
    estimate: str  # how exact the replay is
    temperature: str  # "0" (greedy trajectories), ">0" (sampled ones) or "any"
    function: str  # "module:function" computing its acceptance table
    ranked: bool = False  # the draft proposes its top-ranked tokens (no sampling), verified as point masses: a
    #                       node is accepted iff its rank path matches the trajectory's ranks, at any T
    by_default: str | None = None  # the recorded temperatures it runs on when none are named ("0", ">0" or "any";
    #                                None: `temperature`)
    adaptive: bool = False  # its chain length changes call by call (a walk of its own, not one acceptance table)
    live: bool = False  # specsim's live engine decodes with it (live, validate)
    fitted: bool = False  # optimize fits trees for it
    vllm: bool = False  # vLLM verifies with it (validate --engine vllm): its rejection sampler's rule
    replayed: bool = True  # simulate replays it

    @property
    def default_temperatures(self) -> str:
        return self.by_default or self.temperature

    def runs_at(self, temperature: float, *, default: bool = False) -> bool:
        """Whether it runs on trajectories of this temperature (default: whether it does when none are named)."""
        rule = self.default_temperatures if default else self.temperature
        return rule == "any" or (rule == "0") == (temperature == 0)


POLICY_KINDS: dict[str, PolicyKind] = {
    "greedy": PolicyKind("greedy", "greedy", "accept the draft token equal to the target's argmax", (0,), True,
                         "exact", "0", "specsim.sim.policies:greedy_table", ranked=True, live=True, fitted=True,
                         vllm=True),
    "greedy-draft": PolicyKind("greedy-draft", "greedy-draft",
                               "the draft proposes its top-ranked tokens, verified as point masses (accepted with "
                               "probability p(x)): vLLM's default draft_sample_method='greedy' at T>0", (0,), True,
                               "exact", "any", "specsim.sim.policies:greedy_table", ranked=True, by_default=">0",
                               fitted=True, vllm=True),
    "sample": PolicyKind("sample", "sample", "speculative sampling (chains) and multi-draft sampling (trees)", (0,),
                         True, "exact for chains and iid trees; Monte-Carlo with a standard error for swor trees",
                         ">0", "specsim.sim.policies:sample_table", live=True, fitted=True,
                         vllm=True),
    "block": PolicyKind("block", "block", "block verification of a chain drafted from q (Sun et al. 2025; vLLM's "
                        "rejection_sample_method='block'): the drafted block is kept or cut as a whole", (0,), True,
                        "Monte-Carlo with a standard error, from the target along the draft's proposals (cache "
                        "--expand-target); for greedy-drafted chains its law is greedy-draft's; at T=0, greedy's "
                        "(exact)", "any", "specsim.sim.policies:block_table", by_default=">0", live=True),
    "p>=q": PolicyKind("p>=q", "p>=q", "accept x when p(x) >= q(x) (lossy)", (0,), False,
                       "along target trajectories (approximate), with the TV distortion", ">0",
                       "specsim.sim.lossy:lossy_table", live=True),
    "p>=lq": PolicyKind("p>=lq", "p>=lq:0.5", "accept x when p(x) >= lambda q(x) (lossy)", (1,), False,
                        "along target trajectories (approximate), with the TV distortion", ">0",
                        "specsim.sim.lossy:lossy_table", live=True),
    "typical": PolicyKind("typical", "typical:0.09,0.3", "Medusa's typical acceptance [eps, delta] (lossy)", (0, 2),
                          False, "along target trajectories (approximate), with the TV distortion", ">0",
                          "specsim.sim.lossy:lossy_table", live=True),
    "adaptive-hf": PolicyKind("adaptive-hf", "adaptive-hf", "Hugging Face's heuristic chain length schedule", (0,),
                              True, "exact", "any", "specsim.sim.adaptive:adaptive_stats_many", adaptive=True, live=True),
    "adaptive-history": PolicyKind("adaptive-history", "adaptive-history:0.8,0.4",
                                   "chain length grows/shrinks with the last call's acceptance rate", (0, 2), True,
                                   "exact", "any", "specsim.sim.adaptive:adaptive_stats_many", adaptive=True,
                                   live=True),
}


@dataclass(frozen=True)
class PolicySpec:
    """A verification policy as named on the command line."""

    name: str  # a POLICY_KINDS key
    multi_draft: str = "iid"  # candidate drawing for sampling trees: "iid" or "swor"
    params: tuple = ()  # numeric parameters after the colon, e.g. (0.5,) for "p>=lq:0.5"
    lossless: bool = True  # False for rules whose output is not distributed as p (numbers approximate)
    samples: int = 64  # Monte-Carlo samples per position for estimators that need them (sampling trees)

    @property
    def label(self) -> str:
        """The policy as written in tables ("p>=lq:0.5")."""
        return self.name + (":" + ",".join(f"{x:g}" for x in self.params) if self.params else "")

    @property
    def kind(self) -> PolicyKind:
        return POLICY_KINDS[self.name]


def parse_policy(text: str, *, multi_draft: str = "iid", samples: int = 64) -> PolicySpec:
    """'greedy' | 'sample' | 'p>=q' | 'p>=lq:0.5' | 'typical[:eps,delta]' | 'adaptive-hf' | 'adaptive-history[:hi,lo]'."""
    if multi_draft not in MULTI_DRAFT:
        raise SpecError(f"multi-draft scheme {multi_draft!r} is not one of {', '.join(MULTI_DRAFT)}")
    name, sep, arg = str(text).strip().partition(":")
    name = name.strip().lower()
    kind = POLICY_KINDS.get(name)
    if kind is None:
        raise SpecError(f"{text!r} is not a policy; use one of " + ", ".join(k.example for k in POLICY_KINDS.values()))
    params: list[float] = []
    if sep:
        for i, part in enumerate(arg.split(","), start=1):
            try:
                value = float(part)
            except ValueError:
                raise SpecError(f"{text}: parameter #{i} is {part.strip()!r}, not a number (e.g. {kind.example})") from None
            if value != value or abs(value) == float("inf"):
                raise SpecError(f"{text}: parameter #{i} must be a finite number (e.g. {kind.example})")
            params.append(value)
    if len(params) not in kind.params:
        want = " or ".join(str(c) for c in kind.params)
        raise SpecError(f"{text}: {name} takes {want} parameter(s), got {len(params)} (e.g. {kind.example})")
    if isinstance(samples, bool) or int(samples) < 2:
        raise ArgumentError("{samples} {value}: at least 2 (a standard error needs two)", value=samples)
    return PolicySpec(name=name, multi_draft=multi_draft, params=tuple(params), lossless=kind.lossless,
                      samples=int(samples))


def policy_names(**flags) -> list[str]:
    """The policies with every given PolicyKind flag set (e.g. live=True), in registry order."""
    return [name for name, kind in POLICY_KINDS.items() if all(getattr(kind, f) == v for f, v in flags.items())]


def fitted_budget(spec: str) -> int:
    """N of a tree spec fitted on a cache (`optimal:N`)."""
    if not needs_fit(spec):
        raise SpecError(f"{spec!r} is not fitted on a cache")
    return _one_int(spec.partition(":")[2], f"{spec.partition(':')[0]}:N budget")
