"""Were the split modules' definitions moved unchanged? For each split commit, every top-level definition (function,
class, assignment) of the old module at the commit's parent against the same name in the new modules at the commit,
by AST, after the renames the split made. Prints one line per split; exits 1 if any definition is missing, extra or
changed. Run from the checkout:

    python analyses/results/house-cpu-2026-11-27/moved_unchanged.py
"""

import ast
import subprocess
import sys
from pathlib import Path

SPLITS = {  # split commit -> (old module, new modules, renames of old names)
    "a05bea5": ("specsim/record/heads.py", ("heads", "mtp_heads", "head_unroll", "head_checkpoints"), {}),
    "ffd0a8c": ("specsim/cache/store.py", ("layout", "writer", "reader"), {
        "_overhang": "overhangs", "_rows_end": "rows_end", "_open_h5": "open_h5", "_read_spec": "read_spec",
        "_read_prompts": "read_prompts", "_committed_rows": "committed_rows", "_expected_positions": "expected_positions",
        "_group_name": "group_name", "_same_temperature": "same_temperature", "_why": "describe_error",
        "_TRAJ_DTYPE": "TRAJ_DTYPE"}),
    "f370067": ("specsim/record/train.py", ("train", "train_data", "train_loss"), {}),
}


def definitions(tree: ast.Module, renames: dict) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign):
            name = ast.unparse(node.targets[0])
        else:
            continue
        dump = ast.dump(node)
        for old, new in renames.items():
            dump = dump.replace(f"'{old}'", f"'{new}'")
        out[renames.get(name, name)] = dump
    return out


def show(commit: str, path: str) -> ast.Module:
    return ast.parse(subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True,
                                    check=True).stdout)


def main() -> int:
    bad = 0
    for commit, (old_path, modules, renames) in SPLITS.items():
        old = definitions(show(f"{commit}~1", old_path), renames)
        folder = Path(old_path).parent
        new = {}
        for m in modules:
            new.update(definitions(show(commit, f"{folder}/{m}.py"), {}))
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        changed = sorted(k for k in set(old) & set(new) if old[k] != new[k])
        bad += bool(missing or extra or changed)
        print(f"{commit}: {old_path} -> {', '.join(modules)}: {len(old)} definitions; missing {missing}, extra {extra}, "
              f"changed {changed}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
