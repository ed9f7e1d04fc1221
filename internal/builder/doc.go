// Package builder is the builder role: Builder runs claimed build jobs with Nix in its Store (the
// system store or a chroot store), streams their logs (LogBuffer with its size cap, TailWriter
// for the live tail in build_log_tails), enforces the build limits, and uploads the outputs
// through the signer.
//
// The store is kept within [build] min_free and max_free (storeGC): when its file system has
// less than min_free free, `nix-store --gc` deletes what no GC root keeps. A job roots its .drv,
// inputs and outputs under gcroots/harmonia-ci/<node>-job-<id>… before they are fetched,
// substituted or built, and drops the roots when it ends; a builder that starts removes the
// roots its node's predecessor left.
package builder
