#!/usr/bin/env bash
# Build the release binaries and install them with their man pages and
# completion scripts:
#
#   $DESTDIR$PREFIX/bin/btrkit-*                         the binaries
#   $DESTDIR$PREFIX/share/man/man1/*.1.gz, man7/btrkit.7.gz
#   $DESTDIR$PREFIX/share/bash-completion/completions/NAME
#   $DESTDIR$PREFIX/share/zsh/site-functions/_NAME
#   $DESTDIR$PREFIX/share/fish/vendor_completions.d/NAME.fish
#
# PREFIX defaults to /usr/local, DESTDIR to nothing (a staging root for
# packagers). PROFILE=dev installs the debug build instead of the release
# one; --no-build installs the binaries already built. The binaries are
# every [[bin]] of the workspace's packages but the tests' helpers, so a
# new binary is installed without a change here. Man pages and completions
# are written by the binaries themselves (BTRKIT_GENERATE, from their clap
# definitions); man/*.7 are the hand-written overview pages.
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
PROFILE=${PROFILE:-release}
build=1
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done

# `cargo metadata` names every package's targets; only binaries of packages
# other than the test crate are installed.
meta=$(cargo metadata --no-deps --format-version 1)
bin_list() {
  if command -v jq >/dev/null 2>&1; then
    jq -r '.packages[] | select(.name != "btrkit-tests") | .name as $p
           | .targets[] | select(.kind | index("bin")) | "\($p) \(.name)"'
  else
    python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "btrkit-tests":
        continue
    for t in p["targets"]:
        if "bin" in t["kind"]:
            print(p["name"], t["name"])'
  fi
}
mapfile -t pairs < <(printf '%s' "$meta" | bin_list | sort)
[ "${#pairs[@]}" -gt 0 ] || { echo "install.sh: no binaries found in the workspace" >&2; exit 1; }
target_dir=$(printf '%s' "$meta" | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || target_dir=target
case "$PROFILE" in
  dev) out="$target_dir/debug" ;;
  *) out="$target_dir/$PROFILE" ;;
esac

pkgs=() bins=()
for pb in "${pairs[@]}"; do
  pkgs+=("-p" "${pb%% *}")
  bins+=("${pb##* }")
done
if [ "$build" = 1 ]; then
  cargo build --locked --profile "$PROFILE" "${pkgs[@]}" --bins
fi

root="$DESTDIR$PREFIX"
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
mkdir -p "$gen/man" "$gen/bash" "$gen/zsh" "$gen/fish"
for b in "${bins[@]}"; do
  exe="$out/$b"
  [ -x "$exe" ] || { echo "install.sh: $exe is missing (build it, or drop --no-build)" >&2; exit 1; }
  # `--version` is what a binary that does not know BTRKIT_GENERATE does
  # instead: it exits 0 having written nothing, which the checks catch.
  BTRKIT_GENERATE="man:$gen/man" "$exe" --version >/dev/null
  [ -f "$gen/man/$b.1" ] || { echo "install.sh: $b wrote no man page (does its main call btrkit_cli::generate::handle?)" >&2; exit 1; }
  for sh in bash zsh fish; do
    BTRKIT_GENERATE="completions:$sh:$gen/$sh" "$exe" --version >/dev/null
  done
  install -Dm755 "$exe" "$root/bin/$b"
done
[ -f "$gen/bash/${bins[0]}" ] || { echo "install.sh: no completions written" >&2; exit 1; }

install -d "$root/share/man/man1" "$root/share/man/man7"
for f in "$gen"/man/*.1; do
  gzip -9nc "$f" >"$root/share/man/man1/$(basename "$f").gz"
done
for f in man/*.7; do
  gzip -9nc "$f" >"$root/share/man/man7/$(basename "$f").gz"
done
install -d "$root/share/bash-completion/completions" "$root/share/zsh/site-functions" \
  "$root/share/fish/vendor_completions.d"
install -m644 "$gen"/bash/* "$root/share/bash-completion/completions/"
install -m644 "$gen"/zsh/* "$root/share/zsh/site-functions/"
install -m644 "$gen"/fish/* "$root/share/fish/vendor_completions.d/"
chmod 644 "$root"/share/man/man*/*.gz
echo "installed ${#bins[@]} binaries, $(ls "$gen"/man | wc -l) man pages (+ $(ls man/*.7 | wc -l) in section 7) and their completions under $root"
