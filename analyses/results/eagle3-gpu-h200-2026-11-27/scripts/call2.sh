#!/usr/bin/env bash
# Device call 2 of 2: the target whole again; bench_train on CUDA (issue 26: bfloat16 vs float32 steps); a large
# EAGLE-3 training recording (467 training prompts x 5 temperatures x 192 tokens, capped in time); a probe of the
# training step's time; then as many cosine-schedule steps as the rest of the call allows; the head back in parts.
START=$SECONDS
W=/root/w; mkdir -p $W
cp .gpu2/part01 $W/ && cat $W/part00 $W/part01 > $W/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $W/smol.gguf" | sha256sum -c || exit 1
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu2/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SPECSIM_HOME=/tmp/specsim-home
G=$W/smol.gguf
DEV=${DEV:-cuda}
F="grep --line-buffered -v Loading\|Converting\|Writing"
S="python3 -m specsim"
pack() { if [ -f $W/head/model.safetensors ]; then
  (cd $W/head && sha256sum model.safetensors > $W/head.sha256 && cp config.json $OUT/head-config.json &&
   split -b 15M -d -a 1 model.safetensors $OUT/head.safetensors.part); fi
  (cd $W && tar czf $OUT/logs.tgz *.txt *.log *.sha256 2>/dev/null); ls -la $OUT; }
trap pack EXIT
date; echo "ready at $((SECONDS-START)) s"
# 1. bench_train on CUDA: float32 and bfloat16 steps of one EAGLE-3 head, same data, same run
timeout 110 python3 -m benchmarks.bench_train --target $G --device $DEV --steps ${BT_STEPS:-60} --per-category ${BT_PER:-5} 2>&1 | $F \
  | tee $W/bench_train.txt
echo "bench_train done at $((SECONDS-START)) s"
# 2. the training recording, capped (committed trajectories survive the cap)
/usr/bin/time -v timeout -s TERM ${RECORD_S:-160} $S cache --target $G --prompts .gpu2/train_prompts.jsonl \
  --max-new-tokens ${MNT:-192} --temperature 0,0.5,0.7,0.9,1.0 --hidden-states last,2,15,27 --store stats --batch-size ${RB:-128} \
  --device $DEV --out $W/train.h5 --quiet > $W/record_train.log 2>&1
tail -5 $W/record_train.log
echo "recorded at $((SECONDS-START)) s"
# 3. probe: 20 steps of the real configuration, for the step time
T="$S train-draft --kind eagle3 --target $G --from $W/train.h5 --draft-vocab 16384 --ttt-steps 4 --batch 16 --lr 1e-3
   --lr-schedule cosine --holdout-every 10 --device $DEV --quiet"
P0=$SECONDS
timeout 90 $T --steps 20 --save-every 1000 --out $W/probe > $W/probe.txt 2> $W/probe.log
cat $W/probe.txt
PER=$(grep -o "held-out after 20 steps ([0-9.]* s" $W/probe.txt | grep -o "([0-9.]*" | tr -d '(')
if [ -n "$PER" ]; then
  OVER=$(python3 -c "print(round($SECONDS - $P0 - $PER))")
  LEFT=$(( ${DEADLINE_S:-520} - (SECONDS-START) - OVER - 15 ))
  STEPS=$(python3 -c "print(max(${MIN_STEPS:-200}, min(8000, int($LEFT / ($PER / 20) * 0.85) // 100 * 100)))")
else  # the probe did not finish: a fixed count, the deadline's SIGTERM saves what there is
  OVER=40; LEFT=$(( ${DEADLINE_S:-520} - (SECONDS-START) - OVER - 15 )); STEPS=1000
fi
echo "probe: ${PER:-?} s for 20 steps, $OVER s outside them; $LEFT s left for training: $STEPS steps (at $((SECONDS-START)) s)"
# 4. the head: SIGTERM at the deadline saves a checkpoint
/usr/bin/time -v timeout -s TERM $((LEFT + OVER + 10)) $T --steps $STEPS --save-every $((STEPS / 8)) --out $W/head \
  > $W/train.txt 2> $W/train.log
cat $W/train.txt
echo "trained at $((SECONDS-START)) s"; date
