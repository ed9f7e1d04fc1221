#!/usr/bin/env bash
# Installs what harmonia-ci needs on a Debian machine, skipping anything already present.
#   scripts/deps.sh run    what `harmonia-ci up` needs (PostgreSQL server binaries, Nix, bubblewrap)
#   scripts/deps.sh test   what the test suite needs (the same, plus the MinIO server, a
#                          Gitea server with git and the unprivileged user it runs as, and a
#                          headless Chromium for the web UI's tests, and Prometheus for
#                          promtool)
#   scripts/deps.sh bench  what `harmonia-ci bench` needs (the same as run, plus nginx and wrk)
#   scripts/deps.sh nix    Nix alone: nix-bin if missing, then the set-up below
#   scripts/deps.sh nix-root  the Debian 13 root holding the second Nix (2.26) the tests run
#                          against (test does this too; see below)
#
# Every mode then sets Nix up the way its multi-user installer does, creating only what is
# missing and never changing an existing user or nix.conf: Debian's nix-bin does not (its
# set-up is a systemd unit that does not run in a container), and without it there is no store
# database and no build users to sandbox builds as.
#   - the build group and its build users (system users without a login or a home);
#   - ROOT/nix/store (root:GROUP, mode 1775), ROOT/nix/var/{nix/...,log/nix/drvs} and the
#     store database (nix-store --init);
#   - /etc/nix/nix.conf naming the build group, only if there is no nix.conf (ROOT=/ only);
#   - the unprivileged user harmonia-ci evaluates projects as, in no build group.
# It says on stderr what it changes, and nothing when there is nothing to do.
# Settings, from the environment (tests use a scratch root and group):
#   NIX_SETUP_ROOT=/  NIX_BUILD_GROUP=nixbld  NIX_BUILD_USERS=32
#   NIX_BUILD_USER_PREFIX=$NIX_BUILD_GROUP  HARMONIA_EVAL_USER=harmonia-eval
#
# The second Nix: Debian 12 packages Nix 2.8 only, and Debian 13's nix-bin (2.26) needs Debian
# 13's C library. test and nix-root make, once, a Debian 13 root with debootstrap at
# HARMONIA_NIX_ROOT (default /var/cache/harmonia-ci/debian13), install nix-bin, PostgreSQL and git
# in it and set its Nix up as above; scripts/nix-root.sh runs commands there. Where debootstrap
# cannot run (not root and no sudo, or no namespaces for bubblewrap), it says why, records the
# reason in HARMONIA_NIX_ROOT.unavailable and goes on: the Nix 2.26 suites are then skipped with
# that message. Any other failure (the download, the installation) is an error.
set -euo pipefail
mode=${1:-test}
case $mode in
  run | test | bench | nix | nix-root) ;;
  *) echo "usage: scripts/deps.sh [run|test|bench|nix|nix-root]" >&2; exit 2 ;;
esac

# The MinIO server the S3 tests run against, built from the Go module proxy (never committed).
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
# The Gitea server the forge tests run against (scripts/gitea/go.mod pins the same version), and
# the unprivileged user it runs as: Gitea refuses to run as root.
GITEA_VERSION=v1.26.0
GITEA_USER=${HARMONIA_GITEA_USER:-harmonia-gitea}

say() { echo "deps: $*" >&2; }
die() { say "$*"; exit 1; }

# as_root runs a command that changes the system: through sudo unless this is root, so a machine
# with nothing to change needs neither.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "$1 needs root: run as root or install sudo"
  fi
}

# What makes the Nix 2.26 root; a root made from another list is made again.
NIX_ROOT=${HARMONIA_NIX_ROOT:-/var/cache/harmonia-ci/debian13}
NIX_ROOT_SUITE=trixie
NIX_ROOT_PACKAGES="nix-bin git postgresql ca-certificates"
NIX_ROOT_STAMP="debian-$NIX_ROOT_SUITE: $NIX_ROOT_PACKAGES"
# Installed in the root besides, without being part of its stamp (see nix_root_tools).
NIX_ROOT_TOOLS="bubblewrap"
DEBIAN_MIRROR=${HARMONIA_DEBIAN_MIRROR:-http://deb.debian.org/debian}

need_apt=()
have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if [ "$mode" = nix-root ]; then
  : # only the root's tools, below
else
  command -v nix-store >/dev/null 2>&1 || need_apt+=(nix-bin)
fi
if [ "$mode" = test ] || [ "$mode" = nix-root ]; then
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need_apt+=(debootstrap)
fi
# The evaluator runs every evaluation's Nix in a filesystem view of its own made with bubblewrap
# (and the Nix 2.26 root is entered with it).
if [ "$mode" != nix ]; then
  command -v bwrap >/dev/null 2>&1 || [ -x /usr/bin/bwrap ] || need_apt+=(bubblewrap)
fi
# Evaluators fetch private Gitea repositories with their deploy key over ssh.
if [ "$mode" != nix ] && [ "$mode" != nix-root ]; then
  command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
fi
if [ "$mode" != nix ] && [ "$mode" != nix-root ]; then
  have_postgres || need_apt+=(postgresql)
  command -v pgbench >/dev/null 2>&1 || need_apt+=(postgresql-contrib)
  command -v go >/dev/null 2>&1 || die "Go is required (https://go.dev/dl); not found on PATH"
  # scripts/assets.sh fetches the web UI's HTMX from the npm registry with it.
  command -v curl >/dev/null 2>&1 || need_apt+=(curl)
fi
if [ "$mode" = test ]; then
  command -v git >/dev/null 2>&1 || need_apt+=(git) # Gitea serves repositories with it
  # The web UI's end-to-end tests drive a headless Chromium (internal/browsertest).
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    [ -x /usr/bin/chromium ] || need_apt+=(chromium)
  # promtool checks the example alert rules (deploy/prometheus/alerts.yml).
  command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
  # systemd-analyze verifies the systemd units (deploy/systemd).
  command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
fi
if [ "$mode" = bench ]; then
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
  command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
fi

if [ ${#need_apt[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1 &&
  [ "$mode" = nix-root ]; then
  # Nothing else to do in this mode: record why the root cannot be made, and stop.
  say "cannot make the Nix 2.26 root: installing ${need_apt[*]} needs root or sudo"
  printf '%s\n' "installing ${need_apt[*]} needs root or sudo" >"$NIX_ROOT.unavailable" 2>/dev/null || true
  exit 0
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian's package starts a cluster of its own; harmonia-ci runs private servers instead.
  as_root systemctl disable --now postgresql >/dev/null 2>&1 || true
  # Likewise nginx: `bench cache` starts its own on a free port.
  if [ "$mode" = bench ]; then as_root systemctl disable --now nginx >/dev/null 2>&1 || true; fi
  # Likewise Prometheus: the tests need only its promtool.
  if [ "$mode" = test ]; then as_root systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
fi

# in_group USER GROUP: whether USER has GROUP as its primary or a supplementary group.
in_group() {
  local g
  for g in $(id -nG "$1"); do [ "$g" = "$2" ] && return 0; done
  return 1
}

setup_nix() {
  local root=${NIX_SETUP_ROOT:-/} group=${NIX_BUILD_GROUP:-nixbld} users=${NIX_BUILD_USERS:-32}
  local prefix=${NIX_BUILD_USER_PREFIX:-${NIX_BUILD_GROUP:-nixbld}}
  local eval_user=${HARMONIA_EVAL_USER:-harmonia-eval}
  case $root in /*) ;; *) die "NIX_SETUP_ROOT must be an absolute path, not '$root'" ;; esac
  case $users in '' | *[!0-9]* | 0) die "NIX_BUILD_USERS must be a positive number, not '$users'" ;; esac
  root=${root%/} # "" for /, so "$root/nix" is /nix
  # Debian keeps nologin in /usr/sbin, which is not on a normal user's PATH.
  local nologin
  nologin=$(command -v nologin || true)
  for nologin in $nologin /usr/sbin/nologin /sbin/nologin; do [ -x "$nologin" ] && break; done

  # The build users: Nix runs each sandboxed build as a free one, so builds cannot touch each
  # other or anything the users running Nix own.
  if ! getent group "$group" >/dev/null; then
    say "creating the Nix build group $group"
    as_root groupadd --system "$group"
  fi
  local i missing=()
  for i in $(seq 1 "$users"); do
    getent passwd "$prefix$i" >/dev/null || missing+=("$i")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "creating ${#missing[@]} Nix build users ($prefix${missing[0]}..$prefix${missing[-1]})"
    for i in "${missing[@]}"; do
      as_root useradd --system --comment "Nix build user $i" --home-dir /var/empty \
        --gid "$group" --groups "$group" --no-user-group --shell "$nologin" "$prefix$i"
    done
  fi

  # The store. Build users write their outputs into it, so it is group-writable and sticky; a
  # store with other owners or modes is corrected, as Nix itself does when it opens one as root.
  local d dirs=()
  # Parents first: each is made 0755 whatever the umask, so build users can reach the store.
  for d in "$root/nix" "$root/nix/var" "$root/nix/var/log" "$root/nix/var/log/nix" \
    "$root/nix/var/log/nix/drvs" "$root/nix/var/nix" "$root/nix/var/nix/db" \
    "$root/nix/var/nix/gcroots" "$root/nix/var/nix/profiles" "$root/nix/var/nix/temproots" \
    "$root/nix/var/nix/userpool" "$root/nix/var/nix/daemon-socket"; do
    [ -d "$d" ] || dirs+=("$d")
  done
  if [ ${#dirs[@]} -gt 0 ]; then
    say "creating ${#dirs[@]} directories under $root/nix"
    as_root install -d -m 0755 "${dirs[@]}"
  fi
  local store=$root/nix/store
  if [ ! -d "$store" ]; then
    say "creating $store"
    as_root install -d -o root -g "$group" -m 1775 "$store"
  elif [ "$(stat -c '%u:%G %a' "$store")" != "0:$group 1775" ]; then
    say "setting $store to root:$group, mode 1775 (was $(stat -c '%U:%G %a' "$store"))"
    as_root chown "root:$group" "$store"
    as_root chmod 1775 "$store"
  fi
  if [ ! -e "$root/nix/var/nix/db/db.sqlite" ]; then
    say "initialising the Nix store database in $root/nix/var/nix/db"
    local store_arg=()
    [ -z "$root" ] || store_arg=(--store "$root")
    # Nix run as root sets the store's group to its build-users-group (nixbld by default).
    as_root nix-store --init "${store_arg[@]}" --option build-users-group "$group"
  fi

  # Nix run as root defaults to build-users-group = nixbld; the file records the group in use,
  # which matters when it is another.
  if [ -z "$root" ] && [ ! -e /etc/nix/nix.conf ]; then
    say "writing /etc/nix/nix.conf (build-users-group = $group)"
    as_root install -d -m 0755 /etc/nix
    printf 'build-users-group = %s\n' "$group" | as_root tee /etc/nix/nix.conf >/dev/null
    as_root chmod 0644 /etc/nix/nix.conf
  fi

  # The user harmonia-ci evaluates projects' Nix code as, so that code cannot read the node's
  # secrets. In the build group it could write into the store: refuse that rather than use it.
  if ! getent passwd "$eval_user" >/dev/null; then
    say "creating the evaluation user $eval_user"
    as_root useradd --system --home-dir /nonexistent --no-create-home --user-group \
      --shell "$nologin" "$eval_user"
  elif in_group "$eval_user" "$group"; then
    die "the evaluation user $eval_user is in the Nix build group $group; remove it (gpasswd -d $eval_user $group) or set HARMONIA_EVAL_USER to another user"
  fi
}
# nix_root_tools ROOT installs, in the Debian 13 root at ROOT, the tools the evaluator runs Nix
# with (bubblewrap), when missing. They are added to an existing root in place rather than named
# in its stamp: a root made from another list is made again, under every checkout using it.
nix_root_tools() {
  local root=$1 top
  [ -x "$root/usr/bin/bwrap" ] && return 0
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  say "installing $NIX_ROOT_TOOLS in the Debian 13 root at $root"
  as_root bwrap --bind "$root" / --bind /proc /proc --dev-bind /dev /dev \
    --ro-bind /etc/resolv.conf /etc/resolv.conf --chdir / \
    --clearenv --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin --setenv HOME /root \
    --setenv DEBIAN_FRONTEND noninteractive -- \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $NIX_ROOT_TOOLS >/dev/null" ||
    die "installing $NIX_ROOT_TOOLS in the Debian 13 root failed"
}

# setup_nix_root makes the Debian 13 root with the second Nix, once (see the top of this file).
setup_nix_root() {
  local root=$NIX_ROOT
  if [ "$(cat "$root/.harmonia-ci-root" 2>/dev/null)" = "$NIX_ROOT_STAMP" ]; then
    nix_root_tools "$root"
    return 0
  fi
  local why=""
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    why="debootstrap needs root or sudo"
  elif ! as_root bwrap --bind / / --proc /proc --dev /dev true 2>/dev/null; then
    why="bubblewrap cannot make a mount namespace here (bwrap --bind / / true fails)"
  fi
  if [ -n "$why" ]; then
    say "cannot make the Nix 2.26 root: $why; the Nix 2.26 suites will be skipped"
    printf '%s\n' "$why" | as_root tee "$root.unavailable" >/dev/null
    return 0
  fi
  as_root rm -f "$root.unavailable"
  local top new=$root.new
  top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  say "making the Debian 13 root with Nix 2.26 at $root (debootstrap, then $NIX_ROOT_PACKAGES; a few minutes)"
  as_root rm -rf "$new" "$root"
  as_root install -d -m 0755 "$(dirname "$root")"
  as_root debootstrap --variant=minbase "$NIX_ROOT_SUITE" "$new" "$DEBIAN_MIRROR" >/dev/null ||
    die "debootstrap $NIX_ROOT_SUITE into $new failed (see $new/debootstrap/debootstrap.log)"
  # Packages are installed inside the root, by its own apt: debootstrap's --include does not
  # resolve virtual packages (nix-bin needs perl-dbdabi-94).
  local in_root=(bwrap --bind "$new" / --bind /proc /proc --dev-bind /dev /dev
    --ro-bind /etc/resolv.conf /etc/resolv.conf --bind "$top" "$top" --chdir /
    --clearenv --setenv PATH /usr/sbin:/usr/bin:/sbin:/bin --setenv HOME /root
    --setenv DEBIAN_FRONTEND noninteractive --)
  as_root "${in_root[@]}" sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $NIX_ROOT_PACKAGES >/dev/null" ||
    die "installing $NIX_ROOT_PACKAGES in the Debian 13 root failed"
  # PostgreSQL's package starts no server in a root without systemd (the tests run their own).
  # The root's Nix is set up as this machine's is, with the defaults (the environment is
  # cleared): build users, store, nix.conf, evaluation user.
  as_root "${in_root[@]}" "$top/scripts/deps.sh" nix ||
    die "setting Nix up in the Debian 13 root failed"
  nix_root_tools "$new"
  printf '%s\n' "$NIX_ROOT_STAMP" | as_root tee "$new/.harmonia-ci-root" >/dev/null
  as_root mv "$new" "$root"
  say "the Debian 13 root is ready: $(as_root bwrap --bind "$root" / --proc /proc --dev /dev nix-store --version)"
}

if [ "$mode" = nix-root ]; then
  setup_nix_root
  exit 0
fi
setup_nix
if [ "$mode" = test ]; then
  setup_nix_root
fi

if [ "$mode" = test ]; then
  gobin=$(go env GOBIN); [ -n "$gobin" ] || gobin=$(go env GOPATH)/bin
  if [ ! -x "$gobin/minio" ]; then
    say "building the MinIO server (go install, a few minutes)"
    go install "github.com/minio/minio@$MINIO_VERSION"
  fi

  # Gitea, built from scripts/gitea (go install refuses a module with replace directives), with
  # the templates/, options/ and public/ it reads at run time copied out of the module cache
  # (private to its owner) into gobin/gitea-static, readable by everyone. VERSION in the copy
  # records which Gitea it belongs to; an older pair is rebuilt.
  static=$gobin/gitea-static
  if [ ! -x "$gobin/gitea" ] || [ "$(cat "$static/VERSION" 2>/dev/null)" != "$GITEA_VERSION" ]; then
    tools=$(cd "$(dirname "${BASH_SOURCE[0]}")/gitea" && pwd)
    say "building the Gitea server $GITEA_VERSION (go build, a few minutes)"
    mkdir -p "$gobin"
    (cd "$tools" && CGO_ENABLED=1 go build -tags 'sqlite sqlite_unlock_notify' \
      -ldflags "-X main.Version=${GITEA_VERSION#v}" -o "$gobin/gitea.new" code.gitea.io/gitea)
    src=$(cd "$tools" && go list -m -f '{{.Dir}}' code.gitea.io/gitea)
    [ -d "$src/templates" ] || die "no templates/ in $src"
    rm -rf "$static.new"
    mkdir -p "$static.new"
    cp -R "$src/templates" "$src/options" "$src/public" "$static.new/"
    echo "$GITEA_VERSION" >"$static.new/VERSION"
    chmod -R u+w "$static.new" # the module cache's copies are read-only
    find "$static.new" -type d -exec chmod 0755 {} +
    find "$static.new" -type f -exec chmod 0644 {} +
    rm -rf "$static"
    mv "$static.new" "$static"
    chmod 0755 "$gobin/gitea.new"
    mv "$gobin/gitea.new" "$gobin/gitea"
  fi
  if ! getent passwd "$GITEA_USER" >/dev/null; then
    nologin=$(command -v nologin || true)
    for nologin in $nologin /usr/sbin/nologin /sbin/nologin; do [ -x "$nologin" ] && break; done
    say "creating the Gitea user $GITEA_USER"
    as_root useradd --system --home-dir /nonexistent --no-create-home --user-group \
      --shell "$nologin" "$GITEA_USER"
  fi
fi
