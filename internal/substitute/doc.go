// Package substitute finds, verifies and downloads store paths from Nix binary caches over
// HTTP, so that a builder can fill its store without running Nix's substituter.
//
// A [Fetcher] asks its caches in order for <hash>.narinfo and takes the first narinfo signed by
// one of its trusted keys ([Fetcher.Lookup]); [Fetcher.Closure] does that for a set of paths
// and every reference the local store lacks, and orders the result so that each path comes
// after its references, which is the order a store accepts them in. [Fetcher.OpenNAR] streams a
// path's NAR, decompressed, and fails the read unless the stream has exactly the signed size
// and hash, so a caller that copies it to the Nix daemon never adds a path whose contents the
// signature does not vouch for.
package substitute
