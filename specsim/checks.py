"""One check of specsim against ground truth (its own live decoding, or an engine), as `validate` prints it.

numpy-free: the live (torch) and engine (subprocess) checks both produce these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One comparison of live decoding with the simulator, as `specsim validate` prints it."""

    draft: str
    tree: str
    policy: str  # 'greedy' | 'sample' | 'greedy-draft'
    temperature: float
    batch: int
    kind: str  # 'greedy calls' | 'acceptance' | 'speedup' | 'trajectories' | 'counters' | 'steps'
    comparison: str  # what was compared, with the numbers
    detail: str  # counts, classification, what the numbers rest on
    passed: bool | None  # None: inconclusive (too few prompts for a CI)
    values: dict  # machine-readable columns for --out

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else ("FAIL" if self.passed is False else "inconclusive")


MIN_SAMPLING_PROMPTS = 8  # T > 0: fewer paired prompts make a difference that excludes 0 inconclusive, not a failure
# (the interval rests on the prompts' differences being near normal, which few short trajectories are not: live
# against the replay with the same rule, 4 prompts x 12 tokens excluded 0 in 2 of 20 recordings, 24 x 24 in 1 of 20;
# analyses/results/paired-interval-cpu-2026-11-28/)


def few_prompts_caveat(prompt_counts) -> str | None:
    """What a table's footer says when some of its intervals rest on 2 to MIN_SAMPLING_PROMPTS - 1 prompts (one
    prompt has none): there a 95% bootstrap interval covers about 85-90% (docs/design.md §6). None otherwise."""
    few = sorted({int(n) for n in prompt_counts if 1 < int(n) < MIN_SAMPLING_PROMPTS})
    if not few:
        return None
    here = str(few[0]) if len(few) == 1 else f"{few[0]}-{few[-1]}"
    return (f"CIs over fewer than {MIN_SAMPLING_PROMPTS} prompts (here {here}) cover about 85-90%, not 95% "
            "(docs/design.md §6): record more prompts where one matters")


def paired_verdict(lo: float, hi: float, prompts: int) -> tuple[bool | None, str]:
    """The T > 0 checks' verdict on a difference paired by prompt with 95% interval [lo, hi] over `prompts` prompts,
    and the words that say why."""
    if lo <= 0 <= hi:
        return True, "the paired interval holds 0"
    if prompts < MIN_SAMPLING_PROMPTS:
        return None, (f"the paired interval excludes 0, but over {prompts} prompts, too few to hold its level "
                      f"(record at least {MIN_SAMPLING_PROMPTS})")
    return False, "the paired interval excludes 0"


def sampling_verdict(paired, overlap: bool | None, prompts: int) -> tuple[bool | None, str]:
    """Both T > 0 checks' verdict (specsim live, vLLM), and the words that say why. `paired`: the difference paired by
    prompt (with `lo` and `hi`; None, or NaN ends, where no interval formed), judged by `paired_verdict`. Without it,
    `overlap`: whether the two sides' own intervals overlap (None where one side has none), disjoint ones over fewer
    than MIN_SAMPLING_PROMPTS cached prompts being inconclusive."""
    if paired is not None and paired.lo == paired.lo:
        return paired_verdict(paired.lo, paired.hi, prompts)
    if overlap is None:
        return None, "no CI (n = 1 prompt)"
    if not overlap and prompts < MIN_SAMPLING_PROMPTS:
        return None, (f"CIs DISJOINT, but the replay's CI is a bootstrap over {prompts} cached prompts, too few to "
                      f"hold its error (record at least {MIN_SAMPLING_PROMPTS})")
    return overlap, f"CIs {'overlap' if overlap else 'DISJOINT'}"
