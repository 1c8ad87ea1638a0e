#!/usr/bin/env bash
# btrkit-fsck --repair against btrfs check --repair (6.14) on every image of
# btrfs-progs' tests/fsck-tests, the ones ../shared holds and the ones it
# does not (the images stay out of this repository).
#
# usage: scripts/fsck-tests-sweep.sh PROGS_CHECKOUT WORKDIR
#   PROGS_CHECKOUT  a clone of https://github.com/kdave/btrfs-progs
#   WORKDIR         where the images are restored (sparse; a few GB apparent)
#
# Each image is restored (xz / btrfs-image -r), copied twice, repaired by
# `btrkit-fsck --repair --yes` and by `btrfs check --repair --force` 6.14,
# and judged by `btrfs check --readonly` 6.2 and 6.14 (clean: both exit 0)
# and by a read-only kernel mount (files listed and read; "same" when the
# files that read before read the same after). Prints one line per image
# and the totals. Needs root, btrfs-progs 6.2, 6.14 (../shared/oracle/
# progs-new.sh) and a release build.
set -uo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: fsck-tests-sweep.sh PROGS_CHECKOUT WORKDIR}
work=${2:?usage: fsck-tests-sweep.sh PROGS_CHECKOUT WORKDIR}
cargo build --release -q -p btrkit-fsck
fsck=$PWD/target/release/btrkit-fsck
new=$(bash ../shared/oracle/progs-new.sh)/btrfs
mkdir -p "$work/img"
for p in "$src"/tests/fsck-tests/*/*; do
    case "$p" in *.img|*.img.xz|*.raw.xz|*.tar.xz) ;; *) continue ;; esac
    d=$(basename "$(dirname "$p")"); f=$(basename "$p"); name="$d--${f%%.*}"
    out="$work/img/$name.raw"
    [ -s "$out" ] && continue
    case "$f" in
        *.raw.xz) xz -dc "$p" > "$out" ;;
        *.img.xz) xz -dc "$p" > "$work/tmp.img" && btrfs-image -r "$work/tmp.img" "$out" >/dev/null 2>&1 ;;
        *.img) btrfs-image -r "$p" "$out" >/dev/null 2>&1 ;;
        *.tar.xz) mkdir -p "$work/t" && tar -xJf "$p" -C "$work/t" && mv "$work"/t/* "$out" ;;
    esac || { echo "$name: cannot restore"; rm -f "$out"; }
done
rm -rf "$work/tmp.img" "$work/t"
files() {  # "md5  path" of every file a read-only kernel mount reads, sorted; NOMOUNT
    local m; m=$(mktemp -d)
    if mount -o loop,ro,rescue=nologreplay "$1" "$m" 2>/dev/null; then
        (cd "$m" && find . -type f -print0 | xargs -0 -r md5sum 2>/dev/null | sort -u)
        umount "$m"
    else echo NOMOUNT; fi
    rmdir "$m"
}
clean() { btrfs check --readonly "$1" >/dev/null 2>&1 && "$new" check --readonly "$1" >/dev/null 2>&1 && echo clean || echo left; }
n=0; ours=0; theirs=0; worse=0
printf "%-72s %-6s %-6s %-7s %s\n" image before btrkit files "btrfs check --repair 6.14"
for img in "$work"/img/*.raw; do
    name=$(basename "$img" .raw)
    cp --sparse=always "$img" "$work/o.img"; cp --sparse=always "$img" "$work/p.img"
    b=$(clean "$work/o.img")
    [ "$b" = clean ] && "$fsck" "$work/o.img" >/dev/null 2>&1 && continue
    n=$((n+1))
    files "$work/o.img" > "$work/before"
    timeout 600 "$fsck" --repair --yes "$work/o.img" >/dev/null 2>&1
    a=$(clean "$work/o.img"); files "$work/o.img" > "$work/after"
    # Every file that read before reads the same after (a repair may make
    # more readable: a name re-added, an inode linked into lost+found).
    if grep -qx NOMOUNT "$work/before" || [ -z "$(comm -23 "$work/before" "$work/after")" ]; then
        same=same
    else
        same=LOST; worse=$((worse+1))
    fi
    timeout 600 "$new" check --repair --force "$work/p.img" >/dev/null 2>&1 </dev/null
    p=$(clean "$work/p.img")
    [ "$a" = clean ] && ours=$((ours+1)); [ "$p" = clean ] && theirs=$((theirs+1))
    printf "%-72s %-6s %-6s %-7s %s\n" "$name" "$b" "$a" "$same" "$p"
done
rm -f "$work/o.img" "$work/p.img" "$work/before" "$work/after"
echo "damaged images: $n; clean after btrkit-fsck --repair: $ours; after btrfs check --repair 6.14: $theirs; files changed by btrkit: $worse"
