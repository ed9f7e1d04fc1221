package signer

import (
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// claimFit is whether a claim is one the queue could have handed out: a job of a system (and
// features) its node builds, whose inputs are all built. The database's claim function
// enforces both for a builder's own login; the signer checks them again before it signs
// anything for the claim, so a claim made around the function (the schema owner's login, a
// frontend's, an older schema) still cannot get a job signed that its node could not have
// been given.
type claimFit struct {
	system      string
	builds      bool   // the claiming node's row declares the job's system and features
	unbuilt     string // an input derivation whose job has not succeeded, or ""
	unbuiltStat string // that job's status
}

// queueClaimFit queues the query of f.fit, in the batch that reads f's claim.
func queueClaimFit(b *pgx.Batch, f *jobFacts) {
	b.Queue(sqlClaimFit, f.claim.JobID, f.claim.NodeID, f.claim.Attempt).QueryRow(func(row pgx.Row) error {
		return row.Scan(&f.fit.system, &f.fit.builds, &f.fit.unbuilt, &f.fit.unbuiltStat)
	})
}

// checkClaimFit answers 403 for a claim the queue would not have handed out.
func checkClaimFit(f jobFacts) error {
	switch {
	case !f.fit.builds:
		return httpapi.Errorf(http.StatusForbidden, "job %d (%s): node %s does not build %s with the job's features, so it could not have claimed it",
			f.claim.JobID, f.drvPath, f.claim.NodeID, f.fit.system)
	case f.fit.unbuilt != "":
		return httpapi.Errorf(http.StatusForbidden, "job %d (%s): its input %s is not built (%s), so it could not have been claimed",
			f.claim.JobID, f.drvPath, f.fit.unbuilt, f.fit.unbuiltStat)
	}
	return nil
}
