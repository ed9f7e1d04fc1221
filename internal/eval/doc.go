// Package eval is the evaluator role: Evaluator claims queued evaluations (through a
// slots.Runner), fetches the project's commit into a credential-free copy of its mirror, and
// walks its attributes with NixRunner: nix-instantiate in restricted mode, as the unprivileged
// evaluation user, in a filesystem view of its own (bubblewrap: view.go) and through a
// nix-daemon of the evaluation's own (confinement.go). It reads the project's
// .harmonia-ci.toml (settings.go) and refuses flakes locked on inputs outside their tree
// (flakelock.go).
//
// Attributes are batched (batcher.go) and ingested (ingest.go): a derivation is believed only
// when Nix registered it and its output paths are the ones its text gives; two derivations may
// share an output path only with equal derivation hashes (shared.go); new .drv files are
// published through the signer, and the jobs are enqueued in the evaluation's claim.
// Evaluation rows themselves (requests, cancels, attributes) belong to package evaluation,
// which the frontends share.
package eval
