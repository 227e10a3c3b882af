set -x
cd "$(git rev-parse --show-toplevel)"
D=analyses/results/cpu-overhead-2026-11-25
S=.venv/bin/specsim
uptime
/usr/bin/time -v $S profile --for cache/v64t.h5 --tree chain:4 --tree kary:2,2 --repeats 10 --threads 2 --out $D/profile.json > $D/profile.txt 2> $D/profile.err
uptime
/usr/bin/time -v $S validate cache/v64t.h5 --draft layers:20 --tree chain:4 --tree kary:2,2 --policy sample --repeats 2 --cost-profile $D/profile.json --threads 2 --quiet --out $D/validate.csv > $D/validate.txt 2> $D/validate.err
uptime
.venv/bin/python - <<'PY'
import json
d="analyses/results/cpu-overhead-2026-11-25"
b=json.load(open(f"{d}/profile.json")); b.pop("step_overhead_s")
json.dump(b, open(f"{d}/profile-forwards-only.json","w"), indent=1)
PY
$S simulate cache/v64t.h5 --draft layers:20 --tree chain:4 --tree kary:2,2 --policy sample --cost-profile $D/profile-forwards-only.json --out $D/predicted-forwards-only.csv > $D/predicted-forwards-only.txt 2>&1
$S simulate cache/v64t.h5 --draft layers:20 --tree chain:4 --tree kary:2,2 --policy sample --cost-profile $D/profile.json --out $D/predicted-with-overhead.csv > $D/predicted-with-overhead.txt 2>&1
uptime
echo DONE
