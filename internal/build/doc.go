// Package build is the builder role: it runs claimed build jobs with Nix, streams their logs
// and enforces the build limits of seed 001 ("Build Log Streaming", "Build Timeouts").
//
// In progress. So far it holds the log handling (LogBuffer, the in-memory log with its size
// cap, and TailWriter, which keeps the job's live tail in build_log_tails) and the Nix store
// wrapper; the build loop itself comes next.
package build
