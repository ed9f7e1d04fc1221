#!/usr/bin/env bash
# Fetches the web UI's third-party scripts from the npm registry into
# internal/webui/static/vendor/ (ignored by git), where the build embeds them: HTMX and its SSE
# extension, at pinned versions, checked against the registry's sha512 integrity before
# anything is unpacked. Does nothing when they are there already. The binary never fetches
# anything at run time; built without them, the UI works without JavaScript and says so in its
# log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest=internal/webui/static/vendor
registry=${NPM_REGISTRY:-https://registry.npmjs.org}

# name version file-in-package integrity
assets=(
  "htmx.org 2.0.8 dist/htmx.min.js sha512-fm297iru0iWsNJlBrjvtN7V9zjaxd+69Oqjh4F/Vq9Wwi2kFisLcrLCiv5oBX0KLfOX/zG8AUo9ROMU5XUB44Q=="
  "htmx-ext-sse 2.2.4 dist/sse.min.js sha512-LJmxVhykyflBWgh5PvbRidcyuqMHlgfajmmzumvKctv9puvsufeH6OaejSMZTNTnEI8O2wXXn4ZZtBdpEMqmEQ=="
)

say() { echo "assets: $*" >&2; }
mkdir -p "$dest"
for a in "${assets[@]}"; do
  read -r name version file integrity <<<"$a"
  out="$dest/$name-$version-$(basename "$file")"
  [ -s "$out" ] && continue
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tarball="$registry/$name/-/$(basename "$name")-$version.tgz"
  say "fetching $name@$version"
  curl -fsSL --retry 3 -o "$tmp/pkg.tgz" "$tarball"
  # npm's integrity is base64 of the sha512; compare as hex with coreutils alone.
  want=$(printf '%s' "${integrity#sha512-}" | base64 -d | od -An -v -tx1 | tr -d ' \n')
  got=$(sha512sum "$tmp/pkg.tgz" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    say "$name@$version: sha512 $got, want $want ($integrity); refusing it"
    exit 1
  fi
  tar -xzf "$tmp/pkg.tgz" -C "$tmp" "package/$file"
  cp "$tmp/package/$file" "$out.new"
  mv "$out.new" "$out"
  rm -rf "$tmp"
  trap - EXIT
done
