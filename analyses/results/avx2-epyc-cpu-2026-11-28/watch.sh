#!/bin/bash
# log when each demo command starts and each progress bar starts/ends
prev=""
while pgrep -f 'make demo' >/dev/null; do
  cur=$(tr '\r' '\n' < /tmp/demo2.log | grep -a -E '^\.venv/bin/specsim [a-z]+|^loading|^[a-z ]+: +[0-9]+%' | sed -E 's/^(\.venv\/bin\/specsim [a-z]+).*/\1/; s/^([a-z ]+): +([0-9]+)%.*/\1 \2%/' | tail -1)
  if [ "$cur" != "$prev" ]; then echo "$(date +%T) $cur"; prev="$cur"; fi
  sleep 0.5
done
