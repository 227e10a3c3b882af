set -x
S=/work/main/.venv/bin/specsim
cd /work/e3big
for name in a1 a2; do $S profile --for eval.h5 --tree chain:2 --tree chain:4 --draft eagle3:head --repeats 3 --warmup 1 --threads 2 --quiet --out /work/prof46/$name.json > /work/prof46/$name.txt 2>&1; done
for name in b1 b2; do $S profile --for eval.h5 --tree chain:2 --tree chain:4 --draft eagle3:head --repeats 3 --max-repeats 30 --warmup 1 --threads 2 --quiet --out /work/prof46/$name.json > /work/prof46/$name.txt 2>&1; done
for name in a1 a2 b1 b2; do $S simulate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --cost-profile /work/prof46/$name.json --quiet > /work/prof46/sim_$name.txt 2>&1; done
/usr/bin/time -v $S validate eval.h5 --draft eagle3:head --tree chain:2 --tree chain:4 --cost-profile /work/prof46/b2.json --threads 2 --quiet --out /work/prof46/validate_b2.csv > /work/prof46/validate_b2.txt 2> /work/prof46/validate_b2.log
