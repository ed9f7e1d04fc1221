package webhook_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A captured push, replayed under a new delivery id after the branch moved on, must neither
// bring its commit back nor supersede the newer evaluation.
func TestReplayedPushUnderNewID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	old := push(hello, "main", sha(1))
	first := b.deliverID(t, "push", "d-1", old)
	b.gh.SetBranch(hello.FullName, "main", sha(2))
	second := b.deliverID(t, "push", "d-2", pushFrom(hello, "main", sha(1), sha(2)))
	if first.code != http.StatusAccepted || second.code != http.StatusAccepted {
		t.Fatalf("pushes answered %+v and %+v; want 202 twice", first, second)
	}
	replay := b.deliverID(t, "push", "d-3", old)
	if replay.code != http.StatusOK || replay.msg != "delivery d-3 was received before" {
		t.Fatalf("replay answered %+v; want 200 received before", replay)
	}
	es := b.evals(t)
	if len(es) != 2 || es[0].Status != status.EvalCancelled || es[1].Status != status.EvalQueued || es[1].Commit != sha(2) {
		t.Fatalf("evaluations %+v; want %s superseded and %s queued", es, sha(1), sha(2))
	}
	if ds := b.deliveries(t); len(ds) != 2 || ds["github:d-3"] != 0 {
		t.Fatalf("deliveries %v; want d-1 and d-2 only", ds)
	}
}

// A push of a commit older than the branch's newest evaluation, in a body not seen before (a
// late delivery, or one older than the delivery retention), supersedes nothing and is not
// evaluated: the forge says the branch has moved on.
func TestStalePushDoesNotSupersede(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		newer    status.EvalStatus // the newer evaluation's status when the stale push arrives
		previous bool              // the stale commit had an evaluation, superseded by the newer one
	}{
		{"newer queued", status.EvalQueued, false},
		{"newer succeeded", status.EvalSucceeded, false},
		{"stale commit superseded before", status.EvalQueued, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, options{})
			if tc.previous {
				b.deliver(t, "push", push(hello, "main", sha(1)))
			}
			b.gh.SetBranch(hello.FullName, "main", sha(2))
			newer := b.deliver(t, "push", pushFrom(hello, "main", sha(1), sha(2)))
			if newer.code != http.StatusAccepted {
				t.Fatalf("push of %s answered %+v", sha(2), newer)
			}
			if tc.newer != status.EvalQueued {
				if _, err := b.pool.Exec(testCtx(t), `UPDATE evaluations SET status = $2, finished_at = now() WHERE id = $1`, newer.eval, tc.newer); err != nil {
					t.Fatal(err)
				}
			}
			before := b.evals(t)
			stale := b.deliver(t, "push", pushFrom(hello, "main", sha(0xbad), sha(1)))
			if want := fmt.Sprintf("%s is no longer the head of main", sha(1)); stale.code != http.StatusOK || stale.msg != want {
				t.Fatalf("stale push answered %+v; want 200 %q", stale, want)
			}
			if after := b.evals(t); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("evaluations after the stale push %+v; want unchanged %+v", after, before)
			}
			// Once the branch is back at that commit (a force-push back), it is evaluated.
			b.gh.SetBranch(hello.FullName, "main", sha(1))
			if back := b.deliver(t, "push", pushFrom(hello, "main", sha(2), sha(1))); back.code != http.StatusAccepted {
				t.Fatalf("push back to %s answered %+v; want 202", sha(1), back)
			}
		})
	}
}

// Installation deliveries, which anyone can cause on a public App, coalesce: while a
// discovery runs, any number of them make one more discovery after it, not one each.
func TestInstallationDeliveriesCoalesce(t *testing.T) {
	t.Parallel()
	var started, finished atomic.Int32
	release := make(chan struct{})
	b := setup(t, options{onChanged: func(string) {
		started.Add(1)
		<-release
		finished.Add(1)
	}})
	const n = 50
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Go(func() {
			payload := githubtest.InstallationPayload("created", int64(1000+i), "octo", githubtest.Repo{FullName: fmt.Sprintf("octo/new-%d", i)})
			resp, err := b.gh.Deliver(testCtx(t), b.url, "installation", payload)
			if err != nil {
				t.Error(err)
				return
			}
			codes[i] = resp.StatusCode
			resp.Body.Close()
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusAccepted {
			t.Errorf("installation delivery %d: %d, want 202", i, c)
		}
	}
	waitFor(t, "the first discovery to start", func() bool { return started.Load() == 1 })
	close(release)
	waitFor(t, "the coalesced discovery to finish", func() bool { return finished.Load() == 2 })
	if s := started.Load(); s != 2 {
		t.Fatalf("%d discoveries for %d installation deliveries; want the running one and one after it", s, n)
	}
}

// Past MaxInFlight deliveries in flight, more get 503 with Retry-After before their body is
// read.
func TestDeliveriesInFlightBounded(t *testing.T) {
	t.Parallel()
	const limit = 3
	b := setup(t, options{maxInFlight: limit})
	body := []byte(`{"zen":"x"}`)
	var writers []*io.PipeWriter
	done := make(chan error, limit)
	for range limit {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, b.url, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = b.gh.WebhookHeader("ping", body)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		if _, err := pw.Write(body[:1]); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, fmt.Sprintf("%d deliveries in flight", limit), func() bool {
		return gauge(t, b, "harmonia_ci_webhook_deliveries_in_flight") == limit
	})
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, b.url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = b.gh.WebhookHeader("ping", body)
	resp, err := http.DefaultClient.Do(req)
	retry := ""
	if err == nil {
		retry = resp.Header.Get("Retry-After")
	}
	if got := b.read(t, resp, err); got.code != http.StatusServiceUnavailable || retry == "" {
		t.Fatalf("delivery past the bound answered %+v, Retry-After %q; want 503 with Retry-After", got, retry)
	}
	for _, pw := range writers {
		pw.Write(body[1:])
		pw.Close()
	}
	for range limit {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := b.post(t, b.url, b.gh.WebhookHeader("ping", body), body); got.code != http.StatusOK {
		t.Fatalf("delivery after the others finished answered %+v; want 200", got)
	}
}

// gauge is the value of the registry's gauge name.
func gauge(t *testing.T, b *bundle, name string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}
