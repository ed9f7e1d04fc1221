package eval_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A finished evaluation of each status is run again under its id: the row is queued as before
// its first claim (attempt kept), its attributes are gone, the pending jobs only it needed are
// cancelled, and an evaluator claims it, runs it and brings those jobs back. Asking again
// while it is queued is refused.
func TestReevaluate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// finish makes an evaluation of commit (on main, or another branch) end with the
		// status under test, and stops any evaluator it started.
		finish func(t *testing.T, h *harness, commit string) evaluation.Evaluation
		status status.EvalStatus
		// onlyIt names the attributes whose pending jobs only this evaluation needs: cancelled
		// by the re-evaluation until it is ingested again.
		onlyIt []string
	}{
		{
			name:   "succeeded",
			status: status.EvalSucceeded,
			onlyIt: []string{"own"},
			finish: func(t *testing.T, h *harness, commit string) evaluation.Evaluation {
				ev := h.startEvaluator("first")
				e, _ := h.trigger("again", "", commit)
				h.waitSucceeded(e.ID)
				ev.Stop()
				return h.get(e.ID)
			},
		},
		{
			// The case: Nix is missing on the evaluator, a failure outside the project.
			name:   "failed",
			status: status.EvalFailed,
			finish: func(t *testing.T, h *harness, commit string) evaluation.Evaluation {
				ev := h.startEvaluator("no-nix", func(c *eval.Config) {
					c.Runner = &eval.NixRunner{Bin: filepath.Join(t.TempDir(), "nix-instantiate")}
				})
				e, _ := h.trigger("again", "", commit)
				e = h.waitStatus(e.ID, status.EvalFailed)
				ev.Stop()
				if e.Error == "" {
					t.Fatalf("failed evaluation without an error: %+v", e)
				}
				return e
			},
		},
		{
			name:   "cancelled",
			status: status.EvalCancelled,
			finish: func(t *testing.T, h *harness, commit string) evaluation.Evaluation {
				e, _ := h.trigger("again", "", commit)
				if err := evaluation.Cancel(h.ctx(), h.pool, e.ID, "cancelled by the test"); err != nil {
					t.Fatal(err)
				}
				return h.get(e.ID)
			},
		},
		{
			// The same commit on another branch reuses main's evaluation, which needs every job.
			name:   "skipped",
			status: status.EvalSkipped,
			finish: func(t *testing.T, h *harness, commit string) evaluation.Evaluation {
				ev := h.startEvaluator("first")
				main, _ := h.trigger("again", "", commit)
				h.waitSucceeded(main.ID)
				ev.Stop()
				e, created := h.trigger("again", "copy", commit)
				if !created || e.ReusesEvalID == nil || *e.ReusesEvalID != main.ID {
					t.Fatalf("%+v created=%v, want a new evaluation reusing %d", e, created, main.ID)
				}
				return e
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			repo, commit := h.newProject("again", map[string]string{"ci.nix": h.lib() + `
let shared = mk "shared" [ ]; in { inherit shared; own = mk "own" [ shared ]; }`})
			// Another branch's evaluation needs shared too: its job stays whatever happens here.
			repo.Git("checkout", "-q", "-b", "other")
			otherCommit := repo.Commit("other", map[string]string{"ci.nix": h.lib() + `{ shared = mk "shared" [ ]; }`})
			ev := h.startEvaluator("setup")
			other, _ := h.trigger("again", "other", otherCommit)
			h.waitSucceeded(other.ID)
			ev.Stop()
			shared := h.attrs(other.ID)["shared"]
			if shared.JobStatus != status.JobPending {
				t.Fatalf("shared: %+v, want a pending job", shared)
			}

			e := c.finish(t, h, commit)
			if e.Status != c.status {
				t.Fatalf("evaluation %d is %s (error %q), want %s", e.ID, e.Status, e.Error, c.status)
			}
			before := h.attrs(e.ID)
			for _, name := range c.onlyIt {
				if before[name].JobStatus != status.JobPending {
					t.Fatalf("%s: %+v before the re-evaluation, want a pending job", name, before[name])
				}
			}

			notes := listen(t, h)
			again, err := evaluation.Reevaluate(h.ctx(), h.pool, e.ID)
			if err != nil {
				t.Fatalf("re-evaluate: %v", err)
			}
			if again.ID != e.ID || again.Status != status.EvalQueued || again.ClaimedBy != "" || again.StartedAt != nil ||
				again.FinishedAt != nil || again.Error != "" || again.SkippedReason != "" || again.ReusesEvalID != nil ||
				again.Attempt != e.Attempt || !again.CreatedAt.Equal(e.CreatedAt) || again.Commit != e.Commit || again.Branch != e.Branch {
				t.Fatalf("after Reevaluate: %+v\nwas %+v\nwant the same row queued as before its first claim", again, e)
			}
			notes.want(t, e.ID, status.EvalQueued)
			if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, e.ID); n != 0 {
				t.Errorf("%d attributes left", n)
			}
			for name, a := range before {
				want := a.JobStatus
				if slices.Contains(c.onlyIt, name) {
					want = status.JobCancelled
				}
				if got := h.jobStatus(a.DrvPath); got != want {
					t.Errorf("job of %s is %s after the re-evaluation, want %s", name, got, want)
				}
			}
			if got := h.jobStatus(shared.DrvPath); got != status.JobPending {
				t.Errorf("the job of shared, which the other branch needs, is %s", got)
			}
			if _, err := evaluation.Reevaluate(h.ctx(), h.pool, e.ID); !errors.Is(err, evaluation.ErrNotFinished) {
				t.Errorf("re-evaluating the queued evaluation: %v, want ErrNotFinished", err)
			}

			h.startEvaluator("again")
			done := h.waitSucceeded(e.ID)
			if done.Attempt != e.Attempt+1 || done.ClaimedBy != "again" || done.Error != "" {
				t.Errorf("re-run: attempt %d by %q, error %q; want attempt %d by again", done.Attempt, done.ClaimedBy, done.Error, e.Attempt+1)
			}
			after := h.attrs(e.ID)
			if got := slices.Sorted(maps.Keys(after)); !slices.Equal(got, []string{"own", "shared"}) {
				t.Fatalf("attributes after the re-run: %q", got)
			}
			for name, a := range after {
				if a.JobStatus != status.JobPending {
					t.Errorf("%s after the re-run: %+v, want a pending job", name, a)
				}
				if b, ok := before[name]; ok && (b.DrvPath != a.DrvPath || b.JobID != a.JobID) {
					t.Errorf("%s after the re-run: %+v, before: %+v; want the same derivation and job", name, a, b)
				}
			}
			if after["shared"].JobID != shared.JobID {
				t.Errorf("shared has job %d, the other branch %d", after["shared"].JobID, shared.JobID)
			}
		})
	}
}

// Re-evaluating supersedes the older unfinished evaluations of the branch, as a new request
// does, and never a newer one.
func TestReevaluateSupersedes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ev := h.startEvaluator("ev-1")
	repo, c1 := h.newProject("super", map[string]string{"ci.nix": h.lib() + `{ x = mk "x1" [ ]; }`})
	a, _ := h.trigger("super", "", c1)
	h.waitSucceeded(a.ID)
	c2 := repo.Commit("next", map[string]string{"ci.nix": h.lib() + `{ x = mk "x2" [ ]; }`})
	b, _ := h.trigger("super", "", c2)
	h.waitSucceeded(b.ID)
	ev.Stop()

	reevaluate := func(id int64) {
		t.Helper()
		if _, err := evaluation.Reevaluate(h.ctx(), h.pool, id); err != nil {
			t.Fatalf("re-evaluate %d: %v", id, err)
		}
	}
	reevaluate(a.ID)
	if got := h.get(b.ID); got.Status != status.EvalSucceeded {
		t.Fatalf("re-evaluating the older evaluation changed the newer one: %+v", got)
	}
	notes := listen(t, h)
	reevaluate(b.ID)
	notes.want(t, a.ID, status.EvalCancelled)
	notes.want(t, b.ID, status.EvalQueued)
	if got, want := h.get(a.ID), fmt.Sprintf("superseded by evaluation %d", b.ID); got.Status != status.EvalCancelled || got.Error != want {
		t.Fatalf("the older evaluation: %s, %q; want cancelled, %q", got.Status, got.Error, want)
	}
	// Asked for explicitly, the older one runs again; the newer one is not superseded by it.
	reevaluate(a.ID)
	if got := h.get(b.ID); got.Status != status.EvalQueued {
		t.Fatalf("the newer evaluation: %+v, want it still queued", got)
	}

	h.startEvaluator("ev-2")
	for _, id := range []int64{a.ID, b.ID} {
		if e := h.waitSucceeded(id); e.Attempt != 2 {
			t.Errorf("evaluation %d succeeded at attempt %d, want 2", id, e.Attempt)
		}
	}
}

// Only a finished evaluation is re-evaluated: a running or queued one is refused and left as it
// is, as is an id that does not exist.
func TestReevaluateRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1") // one evaluation at a time: the second waits in the queue
	g := newGate(t)
	repo, c1 := h.newProject("refused", map[string]string{"ci.nix": h.lib() + `{
  a = mk "a" [ ];
  zgated = ` + g.drv("gated", h.salt) + `;
}`})
	running, _ := h.trigger("refused", "", c1)
	h.waitAttrs(running.ID, 1)
	repo.Git("checkout", "-q", "-b", "other")
	c2 := repo.Commit("other", map[string]string{"ci.nix": h.lib() + `{ b = mk "b" [ ]; }`})
	queued, _ := h.trigger("refused", "other", c2)

	for _, c := range []struct {
		name string
		id   int64
		err  error
	}{
		{"running", running.ID, evaluation.ErrNotFinished},
		{"queued", queued.ID, evaluation.ErrNotFinished},
		{"missing", queued.ID + 1000, evaluation.ErrNotFound},
	} {
		if _, err := evaluation.Reevaluate(h.ctx(), h.pool, c.id); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if got := h.get(queued.ID); got.Status != status.EvalQueued || got.Attempt != 0 {
		t.Errorf("the refused queued evaluation changed: %+v", got)
	}
	if got := h.get(running.ID); got.Status != status.EvalRunning || got.ClaimedBy != "ev-1" || got.Attempt != 1 {
		t.Errorf("the running evaluation's claim changed: %+v", got)
	}

	g.open(t)
	h.waitSucceeded(running.ID)
	h.waitSucceeded(queued.ID)
}

// notes is a connection of its own listening on the evaluations channel.
type notes struct {
	conn *pgx.Conn
}

func listen(t *testing.T, h *harness) *notes {
	t.Helper()
	conn, err := pgx.ConnectConfig(h.ctx(), h.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(h.ctx(), "LISTEN evaluations"); err != nil {
		t.Fatal(err)
	}
	return &notes{conn: conn}
}

// want waits for the notification that evaluation id is now st, skipping others.
func (n *notes) want(t *testing.T, id int64, st status.EvalStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		note, err := n.conn.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("waiting for the notification that evaluation %d is %s: %v", id, st, err)
		}
		var p struct {
			ID     int64             `json:"id"`
			Status status.EvalStatus `json:"status"`
		}
		if err := json.Unmarshal([]byte(note.Payload), &p); err != nil {
			t.Fatalf("notification %q: %v", note.Payload, err)
		}
		if p.ID == id && p.Status == st {
			return
		}
	}
}
