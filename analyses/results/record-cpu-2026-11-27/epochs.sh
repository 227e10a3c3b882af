set -uo pipefail
SPECSIM=/work/main/.venv/bin/specsim
echo "start $(date +%T)"
/usr/bin/time -f "%e s wall, %U s user" $SPECSIM train-draft --kind eagle3 --target smollm2-135m \
    --from /work/e3big/train.h5 --train-prompts 97 --steps 700 --draft-vocab 16384 --ttt-steps 4 --batch 8 \
    --lr 1e-3 --lr-schedule cosine --holdout-every 10 --out head-q700 --quiet > train-q700.txt 2> train-q700.log
tail -2 train-q700.txt
echo "end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
