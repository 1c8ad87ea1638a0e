#!/bin/sh
# A stand-in for btrkit-replay that lets the kernel do the replay (a loop
# mount), to check the replay test harness itself end to end:
#   BTRKIT_REPLAY_BIN=tests/scripts/kernel-replay-shim.sh \
#       cargo test -p btrkit-tests --test replay_kernel
# Same command line as btrkit-replay: IMAGE [-o OUT] [--dry-run] [--force].
set -eu
img= out= dry=0
while [ $# -gt 0 ]; do
    case "$1" in
        -o|--output) out=$2; shift 2 ;;
        --dry-run) dry=1; shift ;;
        --force) shift ;;
        -*) echo "kernel-replay-shim: unknown option $1" >&2; exit 2 ;;
        *) img=$1; shift ;;
    esac
done
[ -n "$img" ] || { echo "kernel-replay-shim: no image" >&2; exit 2; }
[ "$dry" = 1 ] && exit 0
target=$img
if [ -n "$out" ]; then
    cp --sparse=always "$img" "$out"
    target=$out
fi
if btrfs inspect-internal dump-super "$target" | grep -q '^log_root[[:space:]]*0$'; then
    echo "no log to replay" >&2
    exit 0
fi
mnt=$(mktemp -d /tmp/kernel-replay-shim.XXXXXX)
mount -o loop "$target" "$mnt"
umount "$mnt"
rmdir "$mnt"
