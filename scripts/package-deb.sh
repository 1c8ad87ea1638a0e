#!/usr/bin/env bash
# Build the Debian package <target>/debian/btrkit_VERSION_ARCH.deb: the
# binaries, man pages and completions exactly as scripts/install.sh installs
# them with PREFIX=/usr (zsh functions moved to Debian's vendor-completions),
# plus DEBIAN/control from the [package.metadata.deb] table of
# cli/Cargo.toml. Packed by dpkg-deb; nothing else is needed.
#
#   PROFILE=release (default) or dev     the build to package
#   --no-build                           package what is built already
#   DEBDIR=DIR (default <target>/debian)  where the .deb and its staging tree go
#   DEB_COMPRESS=xz|gzip|none (default xz) the members' compression (a debug
#                                        build is large: the tests use none)
#
# Prints the path of the .deb as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v dpkg-deb >/dev/null 2>&1 || { echo "package-deb.sh: dpkg-deb is not installed" >&2; exit 1; }

install_args=()
for a in "$@"; do
  case "$a" in
    --no-build) install_args+=(--no-build) ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "package-deb.sh: unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done

meta=$(cargo metadata --no-deps --format-version 1)
# The package's fields: cli/Cargo.toml's [package.metadata.deb] and the
# workspace version, read once here so the control file cannot drift.
fields=$(printf '%s' "$meta" | python3 -c '
import json, sys
m = json.load(sys.stdin)
p = next(p for p in m["packages"] if p["name"] == "btrkit-cli")
d = (p.get("metadata") or {}).get("deb") or {}
for k in ("name", "maintainer", "description", "depends", "section", "priority", "extended-description"):
    v = d.get(k)
    if v is None:
        sys.exit("package-deb.sh: [package.metadata.deb] of cli/Cargo.toml has no " + k)
    print(k + "=" + " ".join(str(v).split()))
print("version=" + p["version"])

print("target=" + m["target_directory"])
')
field() { printf '%s\n' "$fields" | sed -n "s/^$1=//p"; }
name=$(field name)
version=$(field version)
target_dir=$(field target)
arch=$(dpkg --print-architecture)

debdir=${DEBDIR:-$target_dir/debian}
stage="$debdir/stage"
rm -rf "$stage"
DESTDIR="$stage" PREFIX=/usr ./scripts/install.sh "${install_args[@]}" >&2
# A package ships binaries without their debug information (the release
# profile keeps it for profiling), as dh_strip does.
if command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$stage"/usr/bin/*
fi
# Debian's zsh looks in vendor-completions; site-functions is for the admin.
mkdir -p "$stage/usr/share/zsh/vendor-completions"
mv "$stage"/usr/share/zsh/site-functions/* "$stage/usr/share/zsh/vendor-completions/"
rmdir "$stage/usr/share/zsh/site-functions"
mkdir -p "$stage/usr/share/doc/$name"

cat > "$stage/usr/share/doc/$name/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: btrkit
Files: *
Copyright: $(field maintainer)
EOF

mkdir -p "$stage/DEBIAN"
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
{
  echo "Package: $name"
  echo "Version: $version"
  echo "Architecture: $arch"
  echo "Maintainer: $(field maintainer)"
  echo "Installed-Size: $installed_kib"
  echo "Depends: $(field depends)"
  echo "Section: $(field section)"
  echo "Priority: $(field priority)"
  echo "Description: $(field description)"
  field extended-description | fold -s -w 72 | sed 's/ *$//; s/^/ /'
} > "$stage/DEBIAN/control"

deb="$debdir/${name}_${version}_${arch}.deb"
rm -f "$deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$stage" "$deb" >&2
echo "$deb"
