#!/usr/bin/env bash
# Device call 2 of 2: the target whole again (its second half carried now, checked by sha256), then job.sh: Spec-Bench's
# 467 training prompts and the generated ones recorded at T = 0, 0.5, 0.7, 0.9 in six shards side by side, merged,
# and two EAGLE-3 heads trained side by side (A: Spec-Bench's prompts only; B: all), packed for the trip back.
export START_EPOCH=$(date +%s)
W=/root/w
[ -f $W/part00 ] || { echo "the first half is gone (a fresh machine): run call 1 again"; exit 3; }
cp .gpu2/part01 $W/ && cat $W/part00 $W/part01 > $W/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $W/smol.gguf" | sha256sum -c || exit 1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu2/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/specsim-home
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > $W/gpu_util.csv 2>&1 &
UTIL=$!
TARGET=$W/smol.gguf PROMPTS=.gpu2/train_prompts.jsonl DEV=cuda W=$W/job SHARDS=${SHARDS:-6} REC_S=${REC_S:-200} MNT=192 \
  TEMPS=0,0.5,0.7,0.9 HS=last,2,15,27 RB=128 BATCH=${BATCH:-32} DEADLINE_S=${DEADLINE_S:-555} THREADS=2 \
  CATS_A=writing,roleplay,reasoning,math,coding,extraction,stem,humanities,translation,summarization,qa,math_reasoning,rag \
  PACK=.gpu2/pack.py bash .gpu2/job.sh 2>&1 | grep --line-buffered -v "it/s\]\|^	\|Writing model" | tee $OUT/job.txt
kill $UTIL; cp $W/gpu_util.csv $OUT/ 2>/dev/null
date
