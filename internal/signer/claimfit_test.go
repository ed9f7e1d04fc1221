package signer

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/harmonia-ci/harmonia-ci/internal/dbroles"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// TestBuildCompleteRefusesPickedJobs is a builder that picks its work: logged in as its own
// database role it claims, directly in SQL, a job of a system it does not build and a job
// whose input is not built, then completes it at the signer. The database refuses the claim;
// a claim the database let through anyway (made here by the owner) is refused by the signer,
// for the upload slots and for the completion, and nothing is signed or recorded.
func TestBuildCompleteRefusesPickedJobs(t *testing.T) {
	t.Parallel()
	dbURL := dbtest.NewDB(t)
	owner := dbtest.PoolAs(t, dbURL, "")
	if err := dbroles.Apply(ctx(t), owner); err != nil {
		t.Fatal(err)
	}
	const node = "picker-1"
	if err := dbroles.GrantNode(ctx(t), owner, dbroles.Node{ID: node, Roles: []string{"builder"}, Systems: []string{system}, MaxJobs: 1}); err != nil {
		t.Fatal(err)
	}
	builderDB := dbtest.PoolAs(t, dbURL, node)
	e := newEnvOn(t, false, owner)
	queuetest.InsertNode(t, owner, queuetest.Node{ID: node, Systems: []string{system}})
	e.enqueue(t, fixture("fit-base", nil), fixture("fit-top", []string{"fit-base"}),
		fixtureSpec("fit-arm", queuetest.DrvSpec{System: "aarch64-linux"}))
	tok := e.builder(t, node)

	for _, c := range []struct {
		name, job, refusal string
	}{
		{"foreign system", "fit-arm", "does not build aarch64-linux"},
		{"input not built", "fit-top", "is not built"},
	} {
		t.Run(c.name, func(t *testing.T) {
			id := queuetest.JobOf(t, owner, drvPath(c.job)).ID
			tag, err := builderDB.Exec(ctx(t), `
UPDATE build_jobs SET status = 'building', claimed_by = $2, claimed_at = now(), started_at = now(), attempt = attempt + 1
WHERE id = $1`, id, node)
			var pgErr *pgconn.PgError
			if err == nil && tag.RowsAffected() > 0 {
				t.Errorf("as %s: the database let it claim %s", node, c.job)
			} else if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42501") {
				t.Fatalf("as %s: the claim failed, but not with a permission error: %v", node, err)
			}
			// The database's rules are one defence; the signer checks the claim itself.
			queuetest.Exec(t, owner, `
UPDATE build_jobs SET status = 'building', claimed_by = $2, claimed_at = now(), started_at = now(), attempt = 1
WHERE id = $1`, id, node)
			j := queue.Job{ID: id, Attempt: 1}
			out := built(t, outPath(c.job), "anything the builder likes")
			e.putObject(t, nix.NarURL(out.out.FileHash), out.file)

			before := e.state(t)
			for _, r := range []struct {
				path string
				body any
			}{
				{"/api/upload-slots", signerapi.UploadSlotsRequest{Job: jobClaim(j), Outputs: []signerapi.Output{out.out}}},
				{"/api/build-complete", complete(j, "", out)},
			} {
				code, body := e.post(t, r.path, tok, r.body, nil)
				if code != http.StatusForbidden || !strings.Contains(body, c.refusal) {
					t.Errorf("%s for %s: %d %s, want 403 (%s)", r.path, c.job, code, body, c.refusal)
				}
			}
			e.unchanged(t, before, "completing "+c.job)
			if _, ok := e.narInfo(t, out.path()); ok {
				t.Errorf("%s: a narinfo is served for %s", c.job, out.path())
			}
			if h := e.outputHash(t, c.job); h != nil {
				t.Errorf("%s: nar_hash %s recorded", c.job, *h)
			}
		})
	}
}
