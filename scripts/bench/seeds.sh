#!/usr/bin/env bash
# The three fsync results of Btrfs's history, on btrkit's engine (each
# optimization on, then the relevant one off) and on the kernel (sysbench
# and dbench on a loop mount of a btrfs image on the same disk, default
# mount options), one after the other on one machine. Prints one line of
# JSON per run and a summary table.
#
#   scripts/bench/seeds.sh [WORKDIR]
#   TIME=60 DBENCH_CLIENTS=32 scripts/bench/seeds.sh   # longer runs
#
# dbench runs DBENCH_TIME seconds (45 unless set, or TIME when that is
# longer): the cost of logging conflicting inodes is in the full commits
# of a transaction that follows a commit, and a run shorter than the
# 30 s commit interval may have none.
#
# 1. 2015, fast fsync skip: sysbench fileio rndwr, 4 threads, 1,024
#    preallocated files, an fsync pass over every file each 100 writes
#    (switch: fast-fsync-skip).
# 2. 2016, conflicting inodes: dbench, 32 clients, the standard loadfile
#    (switch: log-conflicting-inodes).
# 3. 2009, fsync/O_SYNC submission: sysbench fileio rndwr, 1 file, 4 KiB
#    blocks, fsync every 5 writes, 4 threads, 10,000 requests (switch:
#    sync-io-first).
# Needs root and loop devices; installs sysbench, dbench and bpftrace when
# missing. dbench counts only what follows its warmup (a fifth of the time
# limit), the engine's counters in btrkit-shell likewise; the kernel's
# loop-device counters cannot be cut at that point, so for the kernel's
# dbench run bpftrace counts the fsyncs and the bytes pwrite(2) took over
# the same whole run as the device's counters (without bpftrace its
# fsyncs are dbench's counted ones and there is no written per payload).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-target/bench-seeds}
TIME=${TIME:-30}
DBENCH_TIME=${DBENCH_TIME:-$(( TIME > 45 ? TIME : 45 ))}
CLIENTS=${DBENCH_CLIENTS:-32}
FILES1=${FILES1:-1024}
TOTAL1=${TOTAL1:-1G}
LOADFILE=/usr/share/dbench/client.txt
mkdir -p "$W"
if ! command -v sysbench >/dev/null || ! command -v dbench >/dev/null || [ ! -f "$LOADFILE" ] || ! command -v bpftrace >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sysbench dbench >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftrace >/dev/null 2>&1 || true
fi
cargo build -q --release -p btrkit-shell -p btrkit-mkfs
SHELL_BIN=target/release/btrkit-shell
RESULTS="$W/results.jsonl"
: > "$RESULTS"

fresh() { # a new 16 GiB sparse image made by btrkit-mkfs
  rm -f "$1"
  target/release/btrkit-mkfs -q -b 16G "$1"
}

ours() { # name, then btrkit-shell bench arguments (image first)
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches
  "$SHELL_BIN" bench "$@" --json | python3 -c '
import json, sys
name = sys.argv[1]
r = json.loads(sys.stdin.read())
st = r["stats"]
out = {"run": name, "engine": "btrkit"}
if "mb_per_s" in r:
    out.update(mb_per_s=r["mb_per_s"], max_latency_ms=r["max_latency_ms"], unexpected=r["unexpected"])
    payload = r["payload_written"]
else:
    out.update(writes_per_s=r["writes_per_s"], fsyncs_per_s=r["fsyncs_per_s"], requests_per_s=r["events"] / r["seconds"],
               p95_ms=r["latency_ms"]["p95"], seconds=r["seconds"])
    payload = r["written_mib_per_s"] * r["seconds"] * 1048576
io = r["io"]
out.update(fsyncs=st["fsyncs"], log_syncs=st["log_syncs"], log_syncs_skipped=st["log_syncs_skipped"], full_commits=st["full_commits"],
           flushes=io["flushes"], bytes_written=io["bytes_written"],
           flushes_per_fsync=io["flushes"] / max(st["fsyncs"], 1), written_per_payload=io["bytes_written"] / max(payload, 1))
print(json.dumps(out))
' "$name" | tee -a "$RESULTS"
}

loopdev_stat() { # writes, sectors written, flushes of a loop device
  awk '{print $5, $7, $16}' "/sys/block/$(basename "$1")/stat"
}

kernel() { # name, image, then the command to run inside the mount ($MNT)
  local name=$1 img=$2; shift 2
  local mnt dev
  mnt=$(mktemp -d)
  dev=$(losetup -f --show "$img")
  mkfs.btrfs -q -f "$dev"
  mount "$dev" "$mnt"
  if [ -n "${PREPARE:-}" ]; then (cd "$mnt" && eval "$PREPARE") >/dev/null; fi
  sync; echo 3 > /proc/sys/vm/drop_caches
  local bt="" btpid=""
  if [ -n "${TRACE_COMM:-}" ] && command -v bpftrace >/dev/null; then
    # fsyncs and pwrite payload of the benchmark's processes, counted in
    # the kernel while it runs.
    bt="$W/$name.bt"
    bpftrace -e "tracepoint:syscalls:sys_enter_fsync,tracepoint:syscalls:sys_enter_fdatasync /comm == \"$TRACE_COMM\"/ { @fsyncs = count(); }
      tracepoint:syscalls:sys_exit_pwrite64 /comm == \"$TRACE_COMM\" && args->ret > 0/ { @payload = sum(args->ret); }" > "$bt" 2>/dev/null &
    btpid=$!
    for _ in $(seq 100); do grep -q Attaching "$bt" && break; sleep 0.1; done
    sleep 1
  fi
  read -r w0 s0 f0 < <(loopdev_stat "$dev")
  local out
  out=$(cd "$mnt" && MNT=$mnt eval "$@" 2>&1)
  read -r w1 s1 f1 < <(loopdev_stat "$dev")
  local traced_fsyncs="" traced_payload=""
  if [ -n "$btpid" ]; then
    # bpftrace may have ended already (it failed to attach).
    kill -INT "$btpid" 2>/dev/null || true
    wait "$btpid" || true
    traced_fsyncs=$(awk '/^@fsyncs:/ {print $2}' "$bt")
    traced_payload=$(awk '/^@payload:/ {print $2}' "$bt")
  fi
  umount "$mnt"; losetup -d "$dev"; rmdir "$mnt"
  printf '%s\n' "$out" > "$W/$name.txt"
  python3 - "$name" "$W/$name.txt" "$((s1 - s0))" "$((f1 - f0))" "$traced_fsyncs" "$traced_payload" "${PAYLOAD_BLOCK:-0}" <<'EOF' | tee -a "$RESULTS"
import json, re, sys
name, path, sectors, flushes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
traced_fsyncs, traced_payload, block = sys.argv[5], sys.argv[6], int(sys.argv[7])
t = open(path).read()
out = {"run": name, "engine": "kernel", "bytes_written": sectors * 512, "flushes": flushes}
def f(pat):
    m = re.search(pat, t)
    return float(m.group(1)) if m else None
if "MB/sec" in t:
    out.update(mb_per_s=f(r"Throughput ([0-9.]+) MB/sec"), max_latency_ms=f(r"max_latency=([0-9.]+) ms"),
               fsyncs=f(r"\n\s*Flush\s+([0-9]+)"))
else:
    out.update(writes_per_s=f(r"writes/s:\s+([0-9.]+)"), fsyncs_per_s=f(r"fsyncs/s:\s+([0-9.]+)"),
               p95_ms=f(r"95th percentile:\s+([0-9.]+)"), seconds=f(r"total time:\s+([0-9.]+)s"),
               events=f(r"total number of events:\s+([0-9.]+)"))
    if out["events"] and out["seconds"]:
        out["requests_per_s"] = out["events"] / out["seconds"]
    if out["fsyncs_per_s"] and out["seconds"]:
        out["fsyncs"] = round(out["fsyncs_per_s"] * out["seconds"])
if traced_fsyncs:
    # The whole run, as the device's counters.
    out["fsyncs_counted_by_dbench"] = out.get("fsyncs")
    out["fsyncs"] = int(traced_fsyncs)
if traced_payload:
    out["payload_written"] = int(traced_payload)
elif block and out.get("writes_per_s") and out.get("seconds"):
    out["payload_written"] = out["writes_per_s"] * out["seconds"] * block
if out.get("payload_written"):
    out["written_per_payload"] = out["bytes_written"] / out["payload_written"]
if out.get("fsyncs"):
    out["flushes_per_fsync"] = flushes / out["fsyncs"]
print(json.dumps(out))
EOF
}

# 1. 2015: fast fsync skip.
S1="fileio --file-num=$FILES1 --file-total-size=$TOTAL1 --file-test-mode=rndwr --file-fsync-freq=100 --threads=4 --time=$TIME --prealloc"
fresh "$W/s1.img"; ours "2015-fast-fsync-skip-on" $S1 "$W/s1.img"
fresh "$W/s1.img"; ours "2015-fast-fsync-skip-off" $S1 "$W/s1.img" --set fast-fsync-skip=off
truncate -s 16G "$W/k1.img"
PAYLOAD_BLOCK=16384 PREPARE="size=\$(( \$(numfmt --from=iec $TOTAL1) / $FILES1 )); for i in \$(seq 0 $((FILES1 - 1))); do fallocate -l \$size test_file.\$i; done; sync" \
  kernel "2015-kernel" "$W/k1.img" "sysbench fileio --file-num=$FILES1 --file-total-size=$TOTAL1 --file-test-mode=rndwr --file-fsync-freq=100 --threads=4 --time=$TIME --file-io-mode=sync run"

# 2. 2016: conflicting inodes.
fresh "$W/s2.img"; ours "2016-conflicting-inodes-on" dbench "$W/s2.img" "$LOADFILE" --clients "$CLIENTS" --time "$DBENCH_TIME"
fresh "$W/s2.img"; ours "2016-conflicting-inodes-off" dbench "$W/s2.img" "$LOADFILE" --clients "$CLIENTS" --time "$DBENCH_TIME" --set log-conflicting-inodes=off
truncate -s 16G "$W/k2.img"
TRACE_COMM=dbench PREPARE="" kernel "2016-kernel" "$W/k2.img" "dbench -c $LOADFILE -D \$MNT -t $DBENCH_TIME $CLIENTS"

# 3. 2009: fsync/O_SYNC submission.
S3="fileio --file-num=1 --file-block-size=4096 --file-total-size=256M --file-test-mode=rndwr --file-fsync-freq=5 --threads=4 --events=10000 --time=0"
fresh "$W/s3.img"; ours "2009-sync-io-first-on" $S3 "$W/s3.img"
fresh "$W/s3.img"; ours "2009-sync-io-first-off" $S3 "$W/s3.img" --set sync-io-first=off
truncate -s 16G "$W/k3.img"
PAYLOAD_BLOCK=4096 PREPARE="sysbench fileio --file-num=1 --file-block-size=4096 --file-total-size=256M prepare >/dev/null; sync" \
  kernel "2009-kernel" "$W/k3.img" "sysbench fileio --file-num=1 --file-block-size=4096 --file-total-size=256M --file-test-mode=rndwr --file-fsync-freq=5 --threads=4 --events=10000 --time=0 --file-io-mode=sync run"

rm -f "$W"/s?.img "$W"/k?.img
echo "results: $RESULTS"
