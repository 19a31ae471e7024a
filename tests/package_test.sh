#!/usr/bin/env bash
# The Debian packages (packaging/CMakeLists.txt): builds them with CPack and checks what a
# board's owner relies on. This build's (amd64) tandemd and tandem packages: their
# files, conffile, maintainer scripts, dependencies and a unit systemd accepts. With an
# aarch64 build (scripts/test makes one): its tandemd package installed with dpkg into a
# root of its own whose dpkg knows arm64 as its architecture's foreign one (maintainer
# scripts run without chroot: DPKG_ROOT set, so they touch nothing of this machine), its
# binary run under qemu-aarch64 from there, and an x86 `tandem nodes` talking to it.
#
#   tests/package_test.sh SOURCE_DIR BUILD_DIR TANDEM_CLI
set -euo pipefail
src=$1
build=$2
cli=$3
work=$(mktemp -d /tmp/tandem-package-XXXXXX)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "package_test: $*" >&2; exit 1; }
has() {  # has WHAT TEXT PATTERN: PATTERN (a fixed string) is in TEXT
  grep -qF -- "$3" <<<"$2" || fail "$1 lacks '$3':
$2"
}

(cd "$build" && cpack >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack failed"; }
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
daemon_deb="$build/packages/tandemd_${version}_amd64.deb"
cli_deb="$build/packages/tandem_${version}_amd64.deb"
[ -f "$daemon_deb" ] && [ -f "$cli_deb" ] || fail "no packages in $build/packages: $(ls "$build/packages")"

info=$(dpkg-deb -I "$daemon_deb")
for want in "Package: tandemd" "Architecture: amd64" "Depends: adduser, libopenblas0-pthread" \
            "libzmq5" "libsodium23" "conffiles" "postinst" "prerm" "postrm"; do
  has "tandemd's control" "$info" "$want"
done
files=$(dpkg-deb -c "$daemon_deb")
for want in ./usr/bin/tandemd ./usr/lib/systemd/system/tandemd.service ./etc/tandem/tandemd.conf; do
  has "tandemd's files" "$files" "$want"
done
mkdir -p "$work/amd64" "$work/control"
dpkg-deb -x "$daemon_deb" "$work/amd64"
dpkg-deb -e "$daemon_deb" "$work/control"
has "conffiles" "$(cat "$work/control/conffiles")" "/etc/tandem/tandemd.conf"
"$work/amd64/usr/bin/tandemd" --version | grep -q "tandem $version" || fail "the packaged tandemd does not run"
unit="$work/amd64/usr/lib/systemd/system/tandemd.service"
for want in "User=tandem" "ConditionPathExists=/etc/tandem/cluster.key" \
            "--key /etc/tandem/cluster.key --cache-dir /var/cache/tandem/weights" \
            "EnvironmentFile=-/etc/tandem/tandemd.conf"; do
  has "the unit" "$(cat "$unit")" "$want"
done
if command -v systemd-analyze >/dev/null; then
  # The unit as systemd reads it, its program the one just unpacked.
  sed "s|/usr/bin/tandemd|$work/amd64/usr/bin/tandemd|" "$unit" >"$work/tandemd.service"
  systemd-analyze verify "$work/tandemd.service" || fail "systemd-analyze rejects the unit"
fi
has "tandem's files" "$(dpkg-deb -c "$cli_deb")" "./usr/bin/tandem"
echo "amd64: $(du -k "$daemon_deb" | cut -f1) KiB tandemd, $(du -k "$cli_deb" | cut -f1) KiB tandem"

arm="$src/build/aarch64"
if [ ! -x "$arm/targets/tandemd/tandemd" ]; then
  echo "no aarch64 build of tandemd: the arm64 package is not checked (scripts/setup --preset aarch64)"
  exit 0
fi
(cd "$arm" && cpack -D CPACK_COMPONENTS_ALL=tandemd >"$work/cpack-arm.log" 2>&1) ||
  { cat "$work/cpack-arm.log"; fail "cpack (aarch64) failed"; }
arm_deb="$arm/packages/tandemd_${version}_arm64.deb"
# Installed into a root whose package database is this machine's: the arm64 libraries the
# cross build linked against are installed here as multiarch packages (scripts/setup
# --preset aarch64), so dpkg checks the package's dependencies against real arm64
# packages, as on a board; into a root that has none, the same install is refused.
force=(--force-script-chrootless)
[ "$(id -u)" = 0 ] || force+=(--force-not-root)
empty="$work/empty-root"
mkdir -p "$empty/var/lib/dpkg/info" "$empty/var/lib/dpkg/updates"
touch "$empty/var/lib/dpkg/status"
dpkg --root="$empty" --add-architecture arm64
if dpkg --root="$empty" "${force[@]}" -i "$arm_deb" >"$work/dpkg-empty.log" 2>&1; then
  fail "dpkg installed the arm64 package where none of its dependencies are"
fi
has "dpkg without the dependencies" "$(cat "$work/dpkg-empty.log")" "dependency problems"
root="$work/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
cp /var/lib/dpkg/status "$root/var/lib/dpkg/status"
dpkg --root="$root" --add-architecture arm64
dpkg --root="$root" "${force[@]}" -i "$arm_deb" >"$work/dpkg.log" 2>&1 ||
  { cat "$work/dpkg.log"; fail "dpkg -i of the arm64 package failed"; }
status=$(dpkg --root="$root" -s tandemd)
has "the installed package" "$status" "Status: install ok installed"
has "the installed package" "$status" "Architecture: arm64"
readelf -h "$root/usr/bin/tandemd" | grep -q "Machine:.*AArch64" || fail "the installed tandemd is not an aarch64 program"
qemu-aarch64 -L "$root" "$root/usr/bin/tandemd" --version | grep -q "tandem $version" ||
  fail "the installed tandemd does not run under qemu-aarch64"
# It serves: the x86 CLI asks it who it is.
"$cli" keygen --cluster --out "$work/c" >/dev/null
qemu-aarch64 -L "$root" "$root/usr/bin/tandemd" --listen 127.0.0.1:0 --key "$work/c.key" --name board \
  --cache-dir "$work/cache" >"$work/daemon.out" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 100); do grep -q listening "$work/daemon.out" && break; sleep 0.1; done
address=$(sed -n 's/^listening //p' "$work/daemon.out")
[ -n "$address" ] || { cat "$work/daemon.log"; fail "the installed tandemd did not start"; }
printf 'key: c.key\nnodes:\n  - {name: board, address: "%s", devices: [{name: cpu, backend: cpu}]}\n' "$address" >"$work/cluster.yaml"
nodes=$("$cli" nodes --cluster "$work/cluster.yaml" 2>&1) || fail "tandem nodes failed: $nodes"
has "tandem nodes" "$nodes" "aarch64"
has "tandem nodes" "$nodes" "node name 'board'"
echo "arm64: $(du -k "$arm_deb" | cut -f1) KiB tandemd, installed into $root and answering tandem nodes"
