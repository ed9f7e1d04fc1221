package signer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// More concurrent build-completes than the signer's pool has connections all succeed: a
// handler never waits for a second connection while it holds one with the publication lock.
// Builders upload off their build slots, so a slow signer sees many at once.
func TestBuildCompletesOutnumberThePool(t *testing.T) {
	t.Parallel()
	const conns, builds = 2, 6
	cfg, err := pgxpool.ParseConfig(dbtest.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := newEnvOn(t, false, pool)
	tok := e.builder(t, "builder-1")

	var reqs [][]byte
	var jobs []queue.Job
	for i := range builds {
		name := fmt.Sprint("many-", i)
		j := e.enqueueAndClaim(t, "builder-1", fixture(name, nil))
		o := built(t, outPath(name), name)
		e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, o)
		body, err := json.Marshal(complete(j, "", o))
		if err != nil {
			t.Fatal(err)
		}
		reqs, jobs = append(reqs, body), append(jobs, j)
	}

	// Released together, so that the handlers overlap.
	start := make(chan struct{})
	answers := make([]string, builds)
	var wg sync.WaitGroup
	for i, body := range reqs {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, e.url+"/api/build-complete", bytes.NewReader(body))
			if err != nil {
				answers[i] = err.Error()
				return
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			<-start
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				answers[i] = err.Error()
				return
			}
			defer res.Body.Close()
			raw, _ := io.ReadAll(res.Body)
			var resp signerapi.BuildCompleteResponse
			if res.StatusCode != http.StatusOK || json.Unmarshal(raw, &resp) != nil || resp != (signerapi.BuildCompleteResponse{Written: 1}) {
				answers[i] = fmt.Sprintf("%d %s", res.StatusCode, bytes.TrimSpace(raw))
				return
			}
			answers[i] = "written"
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if a != "written" {
			t.Errorf("build-complete of job %d answered %s; want 200 written", jobs[i].ID, a)
		}
		if s := jobStatus(t, e.pool, fmt.Sprint("many-", i)); s != status.JobSucceeded {
			t.Errorf("job %d is %s; want succeeded", jobs[i].ID, s)
		}
	}
}
