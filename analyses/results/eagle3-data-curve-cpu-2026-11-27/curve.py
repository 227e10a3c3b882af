"""The data-scaling curve: held-out top-1 per depth and tokens per call at chain:4 / chain:2 against training
positions, for the heads of run.sh (a quarter and a half of the training prompts) and the full-data head of
../eagle3-scale-cpu-2026-11-26, with a straight line in log(positions) through the three points extrapolated to
the positions that would give 1.8 tokens per call at chain:4 (issue 26's goal) if the line held.

    PYTHONPATH=. python analyses/results/eagle3-data-curve-cpu-2026-11-27/curve.py
"""

import re
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
FULL = HERE.parent / "eagle3-scale-cpu-2026-11-26"
NUMBER = r"([0-9.]+)"


def heldout(path: Path) -> tuple[int, float, list[float]]:
    """(training positions, held-out loss, top-1 per depth) from train-draft's last line."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("held-out after"))
    positions = int(re.search(r"on (\d+) training positions", line).group(1))
    loss = float(re.search(r"loss " + NUMBER, line).group(1))
    return positions, loss, [float(v) for v in re.findall(r"depth \d " + NUMBER, line)]


def tokens_per_call(path: Path, tree: str) -> tuple[float, float, float]:
    """(tokens per call, CI low, CI high) of the EAGLE-3 head's row at `tree` in a simulate table."""
    for line in path.read_text().splitlines():
        if line.startswith(tree + " ") and "eagle3:" in line:
            value, low, high = re.search(NUMBER + r" \[" + NUMBER + ", " + NUMBER + r"\]", line).groups()
            return float(value), float(low), float(high)
    raise ValueError(f"no {tree} row in {path}")


points = []
for name, train, sims in [("quarter (97 prompts)", HERE / "train97.txt", ("eval97", "heldout4697")),
                          ("half (194 prompts)", HERE / "train194.txt", ("eval194", "heldout46194")),
                          ("all (389 prompts)", FULL / "train.txt", ("eval", "heldout46"))]:
    folder = FULL if name.startswith("all") else HERE
    positions, loss, top1 = heldout(train)
    rows = {f"{s}:{tree}": tokens_per_call(folder / f"simulate_{s}.txt", tree)
            for s in sims for tree in ("chain:4", "chain:2")}
    points.append((name, positions, loss, top1, rows, sims))

print("| training data | positions | held-out loss | top-1 d1 | d2 | d3 | d4 | chain:4, 13 eval prompts | chain:4, 46 "
      "held-out prompts | chain:2, 46 held-out prompts |")
print("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
for name, positions, loss, top1, rows, (ev, h46) in points:
    cell = lambda k: "{:.3f} [{:.3f}, {:.3f}]".format(*rows[k])  # noqa: E731
    print(f"| {name} | {positions:,} | {loss:.3f} | " + " | ".join(f"{v:.3f}" for v in top1)
          + f" | {cell(ev + ':chain:4')} | {cell(h46 + ':chain:4')} | {cell(h46 + ':chain:2')} |")

x = np.log([p[1] for p in points])
for label, ys in [("chain:4 tokens per call, 46 held-out prompts", [p[4][p[5][1] + ":chain:4"][0] for p in points]),
                  ("chain:4 tokens per call, 13 eval prompts", [p[4][p[5][0] + ":chain:4"][0] for p in points]),
                  ("held-out top-1 at depth 1", [p[3][0] for p in points])]:
    slope, intercept = np.polyfit(x, ys, 1)
    print(f"\n{label}: {slope * np.log(2):+.4f} per doubling of the training positions (least squares over the "
          f"{len(points)} points, straight in log positions)")
    if label.startswith("chain:4") and slope > 0:
        need = np.exp((1.8 - intercept) / slope)
        print(f"  the line reaches 1.8 at about {need:,.0f} positions ({need / points[-1][1]:,.0f}x the full data)")
