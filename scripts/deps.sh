#!/usr/bin/env bash
# Installs what harmonia-ci needs on a Debian machine, skipping anything already present.
#   scripts/deps.sh run    what `harmonia-ci up` needs (PostgreSQL server binaries, Nix)
#   scripts/deps.sh test   what the test suite needs (the same, plus the MinIO server)
#   scripts/deps.sh bench  what `harmonia-ci bench` needs (the same as run, plus nginx and wrk)
set -euo pipefail
mode=${1:-test}

# The MinIO server the S3 tests run against, built from the Go module proxy (never committed).
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

need_apt=()
have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
have_postgres || need_apt+=(postgresql)
command -v pgbench >/dev/null 2>&1 || need_apt+=(postgresql-contrib)
command -v nix-store >/dev/null 2>&1 || need_apt+=(nix-bin)
if [ "$mode" = bench ]; then
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
  command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
fi
command -v go >/dev/null 2>&1 || { echo "deps: Go is required (https://go.dev/dl); not found on PATH" >&2; exit 1; }

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: installing ${need_apt[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian's package starts a cluster of its own; harmonia-ci runs private servers instead.
  $sudo systemctl disable --now postgresql >/dev/null 2>&1 || true
  # Likewise nginx: `bench cache` starts its own on a free port.
  if [ "$mode" = bench ]; then $sudo systemctl disable --now nginx >/dev/null 2>&1 || true; fi
fi

if [ "$mode" = test ]; then
  gobin=$(go env GOBIN); [ -n "$gobin" ] || gobin=$(go env GOPATH)/bin
  if [ ! -x "$gobin/minio" ]; then
    echo "deps: building the MinIO server (go install, a few minutes)" >&2
    go install "github.com/minio/minio@$MINIO_VERSION"
  fi
fi
