#!/usr/bin/env bash
# Installs what harmonia-ci needs on a Debian machine, skipping anything already present.
#   scripts/deps.sh run    what `harmonia-ci up` needs (PostgreSQL server binaries)
#   scripts/deps.sh test   what the test suite needs (the same, for now)
set -euo pipefail

need_apt=()

have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

have_postgres || need_apt+=(postgresql)
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
fi
