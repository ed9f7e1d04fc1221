package overview_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/overview"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	x86   = "x86_64-linux"
	arm64 = "aarch64-linux"
)

func read(t *testing.T, pool *pgxpool.Pool) (overview.Overview, string) {
	t.Helper()
	o, err := overview.Read(qt.Ctx(t, 30*time.Second), pool)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	var b bytes.Buffer
	if err := o.WriteText(&b); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	return o, b.String()
}

// hasRow reports whether a line of text has exactly these whitespace-separated fields.
func hasRow(text string, fields ...string) bool {
	for line := range strings.SplitSeq(text, "\n") {
		if slices.Equal(strings.Fields(line), fields) {
			return true
		}
	}
	return false
}

// hasRowPrefix reports whether a line of text starts with these whitespace-separated fields.
func hasRowPrefix(text string, fields ...string) bool {
	for line := range strings.SplitSeq(text, "\n") {
		if f := strings.Fields(line); len(f) >= len(fields) && slices.Equal(f[:len(fields)], fields) {
			return true
		}
	}
	return false
}

func TestEmpty(t *testing.T) {
	t.Parallel()
	o, text := read(t, dbtest.NewPool(t))
	if len(o.Queue) != 0 || o.Ready != 0 || o.Blocked != 0 || o.OldestReadySeconds != 0 ||
		len(o.Builders) != 0 || len(o.Leaders) != 0 || o.GC.Last != nil || o.GC.LastSucceededAt != nil {
		t.Errorf("empty database: %+v", o)
	}
	for _, want := range []string{
		"Queue: empty", "Pending jobs: 0 ready, 0 blocked on inputs\n", "Evaluations: 0 queued, 0 running",
		"Builders: 0 busy, 0 idle, 0 draining, 0 joining, 0 dead; 0 of 0 build slots in use",
		"Leaders: none elected yet", "Last garbage collection: never",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
}

// TestCounts seeds jobs in every live status on two systems, a dependency chain, evaluations,
// builders in every state and two leaders, and checks the numbers and the screen.
func TestCounts(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "demo", 100)
	// a ← b ← c: only a is ready. e builds, d uploads, f failed (terminal: never counted).
	qt.Enqueue(t, pool, &project, qt.Drv("a", x86), qt.Drv("b", x86, "a"), qt.Drv("c", x86, "b"),
		qt.Drv("e", x86), qt.Drv("d", arm64), qt.Drv("f", x86))
	qt.Exec(t, pool, `UPDATE build_jobs SET status = 'building', claimed_by = 'b1', attempt = 1 WHERE drv_path = $1`, qt.DrvPath("e"))
	qt.Exec(t, pool, `UPDATE build_jobs SET status = 'uploading', claimed_by = 'b2', attempt = 1 WHERE drv_path = $1`, qt.DrvPath("d"))
	qt.Exec(t, pool, `UPDATE build_jobs SET status = 'failed' WHERE drv_path = $1`, qt.DrvPath("f"))
	qt.Exec(t, pool, `UPDATE build_jobs SET created_at = now() - interval '10 minutes' WHERE drv_path = $1`, qt.DrvPath("a"))

	for i, st := range []status.EvalStatus{status.EvalQueued, status.EvalQueued, status.EvalRunning, status.EvalSucceeded, status.EvalFailed} {
		qt.Exec(t, pool, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status) VALUES ($1, 'git+file:///demo', $2, 'main', $3)`,
			project, fmt.Sprintf("c%d", i), st)
	}

	for _, n := range []struct {
		node       qt.Node
		jobs, slot int
	}{
		{qt.Node{ID: "b1"}, 2, 4},
		{qt.Node{ID: "b2", Status: status.NodeDraining, Draining: true}, 1, 4},
		{qt.Node{ID: "b3", Status: status.NodeDead, SeenAgo: 10 * time.Minute}, 0, 4},
		{qt.Node{ID: "b4"}, 0, 4},
		{qt.Node{ID: "b5", Status: status.NodeJoining}, 0, 2},
		{qt.Node{ID: "front", Roles: []string{"frontend", "signer", "cache"}}, 0, 1},
	} {
		qt.InsertNode(t, pool, n.node)
		qt.Exec(t, pool, `UPDATE nodes SET current_jobs = $2, max_jobs = $3 WHERE id = $1`, n.node.ID, n.jobs, n.slot)
	}
	qt.Exec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until) VALUES
  ('maintenance', 'front', gen_random_uuid(), 3, now() + interval '1 minute'),
  ('gc', 'old-front', gen_random_uuid(), 2, now() - interval '5 minutes')`)

	o, text := read(t, pool)

	wantQueue := []overview.SystemQueue{
		{System: arm64, Uploading: 1},
		{System: x86, Pending: 3, Building: 1},
	}
	if !slices.Equal(o.Queue, wantQueue) {
		t.Errorf("queue = %+v, want %+v", o.Queue, wantQueue)
	}
	if o.Ready != 1 || o.Blocked != 2 {
		t.Errorf("ready, blocked = %d, %d; want 1, 2", o.Ready, o.Blocked)
	}
	if o.OldestReadySeconds < 600 || o.OldestReadySeconds > 900 {
		t.Errorf("oldest ready job waited %.0fs, want about 600s", o.OldestReadySeconds)
	}
	if o.Evaluations != (overview.Evaluations{Queued: 2, Running: 1}) {
		t.Errorf("evaluations = %+v, want 2 queued, 1 running", o.Evaluations)
	}
	states := map[string]string{}
	for _, b := range o.Builders {
		states[b.ID] = b.State
	}
	wantStates := map[string]string{"b1": overview.StateBusy, "b2": overview.StateDraining, "b3": overview.StateDead,
		"b4": overview.StateIdle, "b5": overview.StateJoining}
	if fmt.Sprint(states) != fmt.Sprint(wantStates) {
		t.Errorf("builder states = %v, want %v", states, wantStates)
	}
	if used, total := o.Slots(); used != 3 || total != 14 {
		t.Errorf("slots = %d of %d, want 3 of 14 (the dead builder's are not counted)", used, total)
	}
	if len(o.Leaders) != 2 || o.Leaders[0].Role != "gc" || o.Leaders[0].Valid || !o.Leaders[1].Valid {
		t.Errorf("leaders = %+v, want gc expired and maintenance valid", o.Leaders)
	}

	for _, row := range [][]string{
		{"QUEUE", "PENDING", "BUILDING", "UPLOADING"},
		{arm64, "0", "0", "1"},
		{x86, "3", "1", "0"},
		{"total", "3", "1", "1"},
		{"b1", "busy", "2/4", "0s", "ago"},
		{"b2", "draining", "1/4", "0s", "ago"},
		{"b3", "DEAD", "0/4", "10m0s", "ago"},
		{"b4", "idle", "0/4", "0s", "ago"},
		{"b5", "joining", "0/2", "0s", "ago"},
	} {
		if !hasRow(text, row...) {
			t.Errorf("text lacks the row %q:\n%s", row, text)
		}
	}
	for _, want := range []string{
		"Pending jobs: 1 ready, 2 blocked on inputs; the oldest ready job has waited 10m",
		"Evaluations: 2 queued, 1 running",
		"Builders: 1 busy, 1 idle, 1 draining, 1 joining, 1 dead; 3 of 14 build slots in use",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	for _, row := range [][]string{
		{"maintenance", "front", "3", "valid,"},
		{"gc", "old-front", "2", "EXPIRED", "5m0s", "ago:", "no", "leader"},
	} {
		if !hasRowPrefix(text, row...) {
			t.Errorf("text lacks a row starting %q:\n%s", row, text)
		}
	}
	if hasRowPrefix(text, "front") {
		t.Errorf("a node without the builder role is listed as a builder:\n%s", text)
	}

	// --json prints the same snapshot.
	raw, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var back overview.Overview
	if err := json.Unmarshal(raw, &back); err != nil || back.Ready != 1 || len(back.Builders) != 5 || back.Builders[2].State != "dead" {
		t.Errorf("JSON round trip: %v, %s", err, raw)
	}
}

// TestManyBuilders: past MaxBuilderRows only the builders that need a look are listed.
func TestManyBuilders(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	for i := range overview.MaxBuilderRows + 4 {
		qt.InsertNode(t, pool, qt.Node{ID: fmt.Sprintf("b%02d", i)})
	}
	qt.Exec(t, pool, `UPDATE nodes SET status = 'dead' WHERE id = 'b07'`)
	qt.Exec(t, pool, `UPDATE nodes SET current_jobs = 1 WHERE id = 'b03'`)
	_, text := read(t, pool)
	if !hasRow(text, "b07", "DEAD", "0/1", "0s", "ago") || strings.Contains(text, "b03") {
		t.Errorf("want the dead builder listed and the busy one not:\n%s", text)
	}
	if want := fmt.Sprintf("… and %d busy or idle builders", overview.MaxBuilderRows+3); !strings.Contains(text, want) {
		t.Errorf("text lacks %q:\n%s", want, text)
	}
}

// TestGC: the newest run whatever its outcome, and the newest successful one apart.
func TestGC(t *testing.T) {
	t.Parallel()
	// Each run: status, started and finished (minutes ago; finished < 0 for none), error.
	type run struct {
		status            status.GCRunStatus
		started, finished int
		err               string
	}
	for _, tc := range []struct {
		name          string
		runs          []run
		wantStatus    status.GCRunStatus // "" for none
		wantSucceeded int                // minutes ago; -1 for never
		want          []string
	}{
		{
			name: "never", wantSucceeded: -1,
			want: []string{"Last garbage collection: never\n"},
		},
		{
			name: "succeeded", runs: []run{{status.GCSucceeded, 90, 88, ""}}, wantStatus: status.GCSucceeded, wantSucceeded: 88,
			want: []string{"Last garbage collection: succeeded on front, started ", "(1h30m ago), took 2m0s",
				"deleted 3 evaluations, 30 jobs, 20 derivations, 5 logs, 1 webhook deliveries; 400 of 1000 cache objects (1.5 MiB)",
				"Last successful garbage collection: finished ", "(1h28m ago)"},
		},
		{
			name: "failed after a success", runs: []run{{status.GCSucceeded, 1500, 1490, ""}, {status.GCFailed, 60, 59, "list cache: connection refused"}},
			wantStatus: status.GCFailed, wantSucceeded: 1490,
			want: []string{"Last garbage collection: failed on front", "  error: list cache: connection refused\n",
				"Last successful garbage collection: finished ", "(24h50m ago)"},
		},
		{
			name: "running, never succeeded", runs: []run{{status.GCFailed, 200, 199, "boom"}, {status.GCRunning, 1, -1, ""}},
			wantStatus: status.GCRunning, wantSucceeded: -1,
			want: []string{"Last garbage collection: running on front, started ", "(1m0s ago)\n",
				"Last successful garbage collection: never"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			for _, r := range tc.runs {
				var finished *int
				if r.finished >= 0 {
					finished = &r.finished
				}
				qt.Exec(t, pool, `
INSERT INTO gc_runs (node_id, epoch, status, started_at, finished_at, error, evaluations_deleted, jobs_deleted,
                     derivations_deleted, logs_expired, deliveries_deleted, objects_scanned, objects_deleted, bytes_deleted)
VALUES ('front', 1, $1, now() - make_interval(mins => $2),
        now() - make_interval(mins => $3), NULLIF($4, ''), 3, 30, 20, 5, 1, 1000, 400, 1572864)`,
					r.status, r.started, finished, r.err)
			}
			o, text := read(t, pool)
			switch {
			case tc.wantStatus == "" && o.GC.Last != nil:
				t.Errorf("last run = %+v, want none", o.GC.Last)
			case tc.wantStatus != "" && (o.GC.Last == nil || o.GC.Last.Status != tc.wantStatus):
				t.Errorf("last run = %+v, want status %s", o.GC.Last, tc.wantStatus)
			}
			switch s := o.GC.LastSucceededAt; {
			case tc.wantSucceeded < 0 && s != nil:
				t.Errorf("last success at %s, want never", s)
			case tc.wantSucceeded >= 0 && (s == nil || o.ReadAt.Sub(*s).Round(time.Minute) != time.Duration(tc.wantSucceeded)*time.Minute):
				t.Errorf("last success at %v (read at %s), want %d minutes ago", s, o.ReadAt, tc.wantSucceeded)
			}
			for _, want := range tc.want {
				if !strings.Contains(text, want) {
					t.Errorf("text lacks %q:\n%s", want, text)
				}
			}
		})
	}
}
