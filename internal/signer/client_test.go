package signer

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/downtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
)

func registerSigner(t *testing.T, e *env, id, endpoint string) {
	t.Helper()
	queuetest.InsertNode(t, e.pool, queuetest.Node{ID: id, Roles: []string{"signer"}})
	queuetest.Exec(t, e.pool, `UPDATE nodes SET endpoint = $2 WHERE id = $1`, id, endpoint)
}

func TestClientFailover(t *testing.T) {
	e := newEnv(t, false)
	var unavailableHits atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		unavailableHits.Add(1)
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)
	registerSigner(t, e, "s1-refused", downtest.URL(t))
	registerSigner(t, e, "s2-503", failing.URL)
	registerSigner(t, e, "s3-real", e.url)
	// Dead and silent signers are never asked.
	registerSigner(t, e, "s4-dead", failing.URL)
	queuetest.Exec(t, e.pool, `UPDATE nodes SET status = 'dead' WHERE id = 's4-dead'`)
	registerSigner(t, e, "s5-silent", failing.URL)
	queuetest.Backdate(t, e.pool, "s5-silent", 5*time.Minute)

	tok := e.builder(t, "builder-1")
	j := e.enqueueAndClaim(t, "builder-1", fixture("client", nil))
	slots := signerapi.UploadSlotsRequest{Job: jobClaim(j), Outputs: []signerapi.Output{built(t, outPath("client"), "client").out}}
	c := signerclient.New(signerclient.Config{Token: tok, GiveUpAfter: 10 * time.Second, MinBackoff: 50 * time.Millisecond},
		e.pool, queuetest.TestLogger(t))
	// Several calls, so every rotation of the round robin is exercised.
	for i := range 3 {
		resp, err := c.UploadSlots(ctx(t), slots)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if len(resp.Outputs) != 1 || resp.Outputs[0].Upload == nil {
			t.Fatalf("call %d: %+v", i, resp)
		}
	}
	if unavailableHits.Load() == 0 || unavailableHits.Load() > 3 {
		t.Fatalf("the 503 signer was asked %d times in 3 calls", unavailableHits.Load())
	}

	// A 4xx is final: returned at once with the server's message, not retried.
	bad := slots.Outputs[0]
	bad.NarSize = 0
	before := unavailableHits.Load()
	_, err := c.BuildComplete(ctx(t), signerapi.BuildCompleteRequest{Job: *jobClaim(j), Outputs: []signerapi.Output{bad}})
	var se *signerclient.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusBadRequest || se.Msg == "" || errors.Is(err, signerclient.ErrUnavailable) {
		t.Fatalf("invalid request: %v, want a 400 StatusError", err)
	}
	if unavailableHits.Load()-before > 1 {
		t.Fatal("a 4xx was retried")
	}
	wrong := signerclient.New(signerclient.Config{Token: "wrong", GiveUpAfter: 10 * time.Second}, e.pool, nil)
	if _, err := wrong.UploadSlots(ctx(t), slots); !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %v, want 401", err)
	}
	// A stale claim is a 409, final too.
	stale := slots
	stale.Job = &signerapi.JobClaim{ID: j.ID, Attempt: j.Attempt + 1}
	if _, err := c.UploadSlots(ctx(t), stale); !errors.As(err, &se) || se.Code != http.StatusConflict {
		t.Fatalf("stale claim: %v, want 409", err)
	}

	// All down: ErrUnavailable after GiveUpAfter, with a growing backoff between rounds.
	queuetest.Exec(t, e.pool, `UPDATE nodes SET endpoint = $1 WHERE id = 's3-real'`, downtest.URL(t))
	const giveUp = 1500 * time.Millisecond
	down := signerclient.New(signerclient.Config{Token: tok, GiveUpAfter: giveUp, MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second},
		e.pool, queuetest.Logger())
	before = unavailableHits.Load()
	start := time.Now()
	_, err = down.UploadSlots(ctx(t), slots)
	elapsed := time.Since(start)
	if !errors.Is(err, signerclient.ErrUnavailable) {
		t.Fatalf("all signers down: %v, want ErrUnavailable", err)
	}
	if elapsed < giveUp || elapsed > giveUp+3*time.Second {
		t.Fatalf("gave up after %v, want about %v", elapsed, giveUp)
	}
	// Each round asks the 503 signer once. Backoffs of 50-100, 100-200, 200-400, 400-800ms, then
	// whatever is left, make 4 to 7 rounds; a constant 100ms backoff would make about 15.
	rounds := unavailableHits.Load() - before
	if rounds < 3 || rounds > 8 {
		t.Fatalf("%d rounds in %v: backoff not growing as expected", rounds, elapsed)
	}

	// No signer registered at all is unavailable too, not a hang.
	queuetest.Exec(t, e.pool, `DELETE FROM nodes WHERE 'signer' = ANY(roles)`)
	none := signerclient.New(signerclient.Config{Token: tok, GiveUpAfter: 300 * time.Millisecond, MinBackoff: 50 * time.Millisecond}, e.pool, nil)
	if _, err := none.UploadSlots(ctx(t), slots); !errors.Is(err, signerclient.ErrUnavailable) {
		t.Fatalf("no signers: %v, want ErrUnavailable", err)
	}
}
