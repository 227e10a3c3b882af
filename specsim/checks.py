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
