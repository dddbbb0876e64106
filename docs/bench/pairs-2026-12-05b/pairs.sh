#!/bin/bash
# usage: [FIRST=<round>] pairs.sh <rounds> <setting> <N> <label=bindir>...  (rounds FIRST, default 1, to <rounds>)
rounds=$1; setting=$2; n=$3; shift 3
out=/tmp/pairs/$setting-$n.txt
for r in $(seq ${FIRST:-1} $rounds); do
  for lb in "$@"; do
    label=${lb%%=*}; bin=${lb#*=}
    d=/tmp/pairs/run-$label-$setting-$n-$r
    (cd /work/main/bench && /tmp/benchcmd -bin $bin -settings $setting -n $n -shapes one -only "floor: single-row UPDATEs,stepcollect service (HTTP)" -pairs 1 -sustained 0 -workers "" -e2e-n 0 -skip-large-table -skip-profile -out $d > $d.log 2>&1)
    python3 - "$d/raw.jsonl" "$label" "$setting" "$n" "$r" >> $out <<'PY'
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
f=[x for x in rows if x["Impl"].startswith("floor")][0]
s=[x for x in rows if x["Impl"].startswith("stepcollect service")][0]
n=s["N"]; us=lambda ms: ms*1000/n
fc=sum(f["cpu_ms"].values()); sc=sum(s["cpu_ms"].values()); c=s["cpu_ms"]
print(f'{sys.argv[3]} N={n} {sys.argv[5]} {sys.argv[2]:8s} floor {f["wall_ms"]:7.0f} service {s["wall_ms"]:7.0f} x{s["wall_ms"]/f["wall_ms"]:.2f} cpu/result floor {us(fc):4.0f}us service {us(sc):4.0f}us (api {us(c.get("api",0)):3.0f} worker {us(c.get("worker",0)):3.0f} mysqld {us(c.get("mysqld",0)):3.0f} bench {us(c.get("load generator",0)):3.0f}) done {us(sum(s["cpu_to_done_ms"].values())):4.0f}us ev {s.get("events_distinct")}/{s.get("events_received")} err {s["errors"]} stranded {s["stranded"]}')
PY
    tail -1 $out
  done
done
