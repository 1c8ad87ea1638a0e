#!/usr/bin/env bash
# Writes btrkit-fsck's JSON reports for every fixture image of
# ../shared/fixtures/btrfs-progs-fsck into OUT: the read-only check
# (NAME.check.json) and a repair of a copy (NAME.repair.json), timings
# removed, so that two builds' reports can be compared with `diff -r`.
#   scripts/json-reports.sh BIN_DIR OUT [FIXTURES]
set -euo pipefail
bin=${1:?usage: json-reports.sh BIN_DIR OUT [FIXTURES]}
out=${2:?usage: json-reports.sh BIN_DIR OUT [FIXTURES]}
here=$(cd "$(dirname "$0")/.." && pwd)
fixtures=${3:-$here/../shared/fixtures/btrfs-progs-fsck}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Timing fields (any key ending in _ms, _us, _secs or named elapsed) vary
# between runs; everything else must not.
strip_timings() {
    sed "s#$work#WORK#g" |
    sed -E 's/"([a-z_]*(_ms|_us|_ns|_secs|millis|elapsed|seconds))": *[0-9.eE+-]+/"\1": 0/g'
}
for archive in "$fixtures"/*.tar.xz; do
    name=$(basename "$archive" .tar.xz)
    rm -rf "${work:?}"/*
    tar -xJf "$archive" -C "$work" 2>/dev/null || continue
    img=$(find "$work" -name '*.raw' -o -name '*.img' | head -1)
    [ -n "$img" ] || continue
    "$bin/btrkit-fsck" --json "$img" 2>"$out/$name.check.err" | strip_timings > "$out/$name.check.json" || true
    cp --sparse=always "$img" "$work/copy"
    "$bin/btrkit-fsck" --json --repair --yes "$work/copy" 2>"$out/$name.repair.err" | strip_timings > "$out/$name.repair.json" || true
done
echo "reports in $out"
