# assemble the payload once per machine and install the carried wheels; every later call only exports paths
REPO=$PWD
if [ ! -f /root/w/SHA256SUMS ]; then
  (cd /root/w && cat part00 part01 part02 part03 > blob.tar && sha256sum -c $REPO/.gpu/blob.sha256 && tar xf blob.tar && sha256sum -c SHA256SUMS) || exit 1
fi
if [ ! -d /tmp/site/polars ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /root/w/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD SPECSIM_HOME=/tmp/specsim-home PYTHONUNBUFFERED=1 SPECSIM_PROMPTS=$REPO/.gpu/spec_bench_questions.jsonl
GGUF=/root/w/SmolLM2-135M-Instruct.Q4_1.gguf
