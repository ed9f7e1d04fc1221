#!/usr/bin/env bash
# Runs a command in the Debian 13 root that holds the second Nix the tests run against (Nix 2.26,
# worker protocol 1.38), which scripts/deps.sh creates:
#   scripts/nix-root.sh [--bind DIR]... [--env NAME=VALUE]... [--skip-unavailable] [--] CMD [ARG]...
# The root has its own /nix (store, database, build users) and its own Nix, PostgreSQL and git.
# Bound in, at the same paths: this checkout, the Go toolchain, Go's module and build caches
# (read-write: `go test` works there as here), the host's /dev and every --bind DIR. The network
# is the host's, so processes inside and outside the root reach each other on loopback. CMD gets
# a fixed environment (PATH, HOME, Go's variables, CI) and each --env NAME=VALUE.
# bubblewrap (not chroot) enters it: builds run in Nix's sandbox, whose user namespace the
# kernel refuses to a chrooted process.
# With --skip-unavailable, where scripts/deps.sh found it cannot make the root (and recorded why),
# it prints that it skips CMD, and why, and exits 0; a root that is missing for any other reason
# is an error.
#   HARMONIA_NIX_ROOT  the root (default /var/cache/harmonia-ci/debian13)
set -euo pipefail
root=${HARMONIA_NIX_ROOT:-/var/cache/harmonia-ci/debian13}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

binds=()
envs=()
skip=false
while [ $# -gt 0 ]; do
  case $1 in
    --bind) [ $# -ge 2 ] || { echo "nix-root: --bind needs a directory" >&2; exit 2; }
      binds+=("$2"); shift 2 ;;
    --env) case ${2:-} in *=*) ;; *) echo "nix-root: --env needs NAME=VALUE" >&2; exit 2 ;; esac
      envs+=(--setenv "${2%%=*}" "${2#*=}"); shift 2 ;;
    --skip-unavailable) skip=true; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: scripts/nix-root.sh [--bind DIR]... [--env NAME=VALUE]... [--skip-unavailable] [--] CMD [ARG]..." >&2; exit 2; }
if [ ! -e "$root/.harmonia-ci-root" ]; then
  if $skip && [ -e "$root.unavailable" ]; then
    echo "nix-root: SKIPPED (not run against Nix 2.26): $*" >&2
    echo "nix-root: the Debian 13 root cannot be made here: $(cat "$root.unavailable")" >&2
    exit 0
  fi
  echo "nix-root: no Debian 13 root at $root; scripts/deps.sh nix-root makes it" >&2
  exit 3
fi
command -v bwrap >/dev/null 2>&1 || { echo "nix-root: bwrap is missing (apt-get install bubblewrap)" >&2; exit 3; }

goroot=$(go env GOROOT 2>/dev/null || echo /usr/local/go)
gocache=$(go env GOCACHE 2>/dev/null || true)
gomodcache=$(go env GOMODCACHE 2>/dev/null || true)
gopath=$(go env GOPATH 2>/dev/null || true)

args=(--bind "$root" / --bind /proc /proc --dev-bind /dev /dev
  --ro-bind /etc/resolv.conf /etc/resolv.conf
  --ro-bind "$goroot" "$goroot" --bind "$top" "$top")
# GOPATH holds the module cache and the tools the tests run (MinIO).
for d in "$gopath" "$gomodcache" "$gocache" "${binds[@]}"; do
  [ -n "$d" ] && [ -d "$d" ] && args+=(--bind "$d" "$d")
done
cwd=$(pwd)
exec bwrap "${args[@]}" --chdir "$cwd" --die-with-parent \
  --clearenv --setenv PATH "$goroot/bin:${gopath:+$gopath/bin:}/usr/sbin:/usr/bin:/sbin:/bin" \
  --setenv HOME "${HOME:-/root}" --setenv USER "$(id -un)" --setenv TMPDIR /tmp \
  --setenv GOROOT "$goroot" --setenv GOPATH "$gopath" --setenv GOCACHE "$gocache" \
  --setenv GOMODCACHE "$gomodcache" --setenv GOPROXY off --setenv GOFLAGS "${GOFLAGS:-}" --setenv GOTOOLCHAIN local \
  --setenv CGO_ENABLED 0 --setenv CI "${CI:-}" --setenv HARMONIA_NIX_ROOT_INSIDE 1 "${envs[@]}" \
  -- "$@"
