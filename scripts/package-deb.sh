#!/usr/bin/env bash
# Build the Debian package target/debian/btrkit_VERSION_ARCH.deb: the release
# binaries, man pages and completions exactly as scripts/install.sh installs
# them (staged under <target>/release/deb-stage with PREFIX=/usr), packaged
# by cargo-deb from the [package.metadata.deb] table of cli/Cargo.toml.
# Needs cargo-deb: cargo install cargo-deb --locked
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null 2>&1 || {
  echo "package-deb.sh: cargo-deb is not installed (cargo install cargo-deb --locked)" >&2
  exit 1
}
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
stage="${target_dir:-target}/release/deb-stage"
rm -rf "$stage"
DESTDIR="$stage" PREFIX=/usr PROFILE=release ./scripts/install.sh "$@"
# The binaries are built: cargo-deb only packs the staged tree.
cargo deb -p btrkit-cli --no-build --no-strip 2>&1
