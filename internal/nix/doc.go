// Package nix implements the parts of Nix's on-disk and on-the-wire formats that harmonia-ci's
// signer and binary cache need, without linking against Nix: store path parsing, Nix's base32,
// NAR serialisation, the streaming NAR → zstd pipeline that produces a cache entry, .narinfo
// files, and ed25519 signing keys in Nix's text format.
//
// Everything here is checked byte for byte against a real Nix in the tests, because a cache
// that is almost compatible is one Nix silently refuses to substitute from.
package nix
