"""The B = 4 profile entries int8 kary:2,2 prices, per profile: target verification of N = 1, 3, 7 tokens and the
int8 draft's step at widths 1 and 2, at each measured context (medians, ms).

    python analyses/results/bench-avx2-cpu-2026-11-29c/entries.py PROFILE.json [PROFILE.json ...]

(a record of this folder's numbers; it reads the profiles' JSON only, with the standard library)
"""

import json
import sys


def main(paths: list[str]) -> None:
    for path in paths:
        profile = json.load(open(path))
        verify, draft = profile["target_verify_s"]["4"], profile["draft_step_s"]["int8"]["4"]
        print(path, profile["created"][:16])
        for L in map(str, profile["contexts"]):
            ms = lambda cell: f"{1e3 * cell['median']:5.1f}"  # noqa: E731
            print(f"    L {L:>3}: N1 {ms(verify[L]['1'])} N3 {ms(verify[L]['3'])} N7 {ms(verify[L]['7'])} | "
                  f"w1 {ms(draft[L]['1'])} w2 {ms(draft[L]['2'])}  (w2 rounds: "
                  f"{', '.join(f'{1e3 * r:.0f}' for r in draft[L]['2']['runs'])})")


if __name__ == "__main__":
    main(sys.argv[1:])
