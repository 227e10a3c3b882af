set -uo pipefail
SPECSIM=/work/main/.venv/bin/specsim
for wd in 0.01 1.0; do  # 0.1 was started third and stopped for time
  echo "wd $wd start $(date +%T)"
  /usr/bin/time -f "%e s wall, %U s user" $SPECSIM train-draft --kind eagle3 --target smollm2-135m \
      --from /work/e3big/train.h5 --train-prompts 97 --steps 350 --draft-vocab 16384 --ttt-steps 4 --batch 8 \
      --lr 1e-3 --lr-schedule cosine --holdout-every 10 --weight-decay $wd --out head-wd$wd --quiet \
      > train-wd$wd.txt 2> train-wd$wd.log
  tail -2 train-wd$wd.txt
  echo "wd $wd end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo ALLDONE
