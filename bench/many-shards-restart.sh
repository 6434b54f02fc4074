#!/bin/bash
# Restart with many shards (issue 44, lazy shard open), run by hand, figures in docs/memory.md:
#   bench/many-shards-restart.sh ROOST_BIN DIR SHARDS RECORDS_PER_SHARD
# Starts `roost serve` (default configuration) on DIR/data, drops one bulk file creating
# RECORDS_PER_SHARD records on each of SHARDS shards (at most 100,000 lines: bulk_lines_max),
# then restarts it twice and prints, for each restart, the time from spawn until `status`
# answers and until a new batch (on another shard) is committed, VmRSS, and how many shards
# that life opened (its `shard: opened` log lines). First after SIGTERM; then a second bulk
# file writes every shard again and the daemon is killed with SIGKILL once it is answered.
# DIR is removed first. Nothing is asserted.
set -u
BIN=$1; D=$2; N=$3; L=$4
rm -rf "$D"; mkdir -p "$D"
start() { "$BIN" serve --data-dir "$D/data" >>"$D/serve.log" 2>&1 & echo $! > "$D/pid"; }
ms() { date +%s%3N; }
wait_status() { for i in $(seq 1 3000); do "$BIN" status --data-dir "$D/data" >/dev/null 2>&1 && return 0; sleep 0.005; done; return 1; }
one_batch() { # key shard
  echo "{\"request_key\":\"$1\",\"ops\":[{\"op\":\"create\",\"shard\":\"$2\",\"record\":{}}]}" > "$D/$1.json"
  "$BIN" submit --wait --timeout 60 --data-dir "$D/data" "$D/$1.json" >/dev/null
}
rss() { awk '/VmRSS/{print $2}' /proc/$(cat "$D/pid")/status; }
start; wait_status || { echo "no start"; exit 1; }
python3 - "$D/bulk.jsonl" "$N" "$L" <<'PY'
import sys
p, n, l = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(p, "w") as f:
    k = 0
    for r in range(l):
        for s in range(n):
            f.write('{"request_key":"b%d","ops":[{"op":"create","shard":"s%d","record":{"n":%d}}]}\n' % (k, s, k))
            k += 1
PY
cp "$D/bulk.jsonl" "$D/data/spool/tmp/bulk.jsonl" && mv "$D/data/spool/tmp/bulk.jsonl" "$D/data/spool/new/bulk.jsonl"
for i in $(seq 1 6000); do [ -e "$D/data/spool/out/bulk.jsonl" ] && break; sleep 0.05; done
[ -e "$D/data/spool/out/bulk.jsonl" ] || { echo "bulk not answered"; exit 1; }
echo "loaded: $N shards x $L records ($(grep -c committed "$D/data/spool/out/bulk.jsonl") committed); RSS $(rss) KiB"
for mode in TERM KILL; do
  one_batch "pre-$mode" s1 || echo "pre batch failed"
  if [ $mode = KILL ]; then # every shard written since the last checkpoint, then kill -9
    sed 's/"request_key":"b/"request_key":"c/' "$D/bulk.jsonl" > "$D/data/spool/tmp/bulk2.jsonl" && mv "$D/data/spool/tmp/bulk2.jsonl" "$D/data/spool/new/bulk2.jsonl"
    for i in $(seq 1 6000); do [ -e "$D/data/spool/out/bulk2.jsonl" ] && break; sleep 0.05; done
  fi
  kill -$mode $(cat "$D/pid"); while kill -0 $(cat "$D/pid") 2>/dev/null; do sleep 0.01; done
  c0=$(grep -c 'shard: opened' "$D/serve.log"); t0=$(ms); start; wait_status; t1=$(ms); one_batch "post-$mode" s7 || echo "post batch failed"; t2=$(ms)
  echo "after SIG$mode: status after $((t1-t0)) ms, a batch committed after $((t2-t0)) ms; RSS $(rss) KiB; $(( $(grep -c 'shard: opened' "$D/serve.log") - c0 )) shards opened by this life"
done
kill -TERM $(cat "$D/pid"); wait
