package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Timings of proctest.FastConfig.
const (
	lease = 1500 * time.Millisecond
	check = 100 * time.Millisecond
	// slack covers process scheduling on a loaded 2-core CI machine.
	slack = 2 * time.Second
)

// TestLeaderElectionSurvivesFaults runs three nodes on one database and takes the leader down
// every way a real one goes: kill -9, a pause past its lease (SIGSTOP), a lost lock session,
// and a clean SIGTERM. After each, exactly one leader must emerge, in bounded time, and no
// leader-only write of an old epoch may land after a newer epoch began.
func TestLeaderElectionSurvivesFaults(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	nodes := []string{"n1", "n2", "n3"}
	f.startActive(nodes...)
	running := func() []string {
		var r []string
		for _, id := range nodes {
			if !f.procs[id].Exited() {
				r = append(r, id)
			}
		}
		return r
	}
	leader, epoch := f.steadyLeader(30*time.Second, nodes...)
	t.Logf("first leader %s epoch %d", leader, epoch)

	// kill -9: PostgreSQL ends the dead process's sessions, which frees its lock; a standby
	// takes over at its next check, well within lease + check interval.
	killedInc := f.incarnation(leader)
	f.procs[leader].Signal(t, syscall.SIGKILL)
	f.procs[leader].Wait(t, 10*time.Second)
	killedAt := time.Now()
	proctest.WaitFor(t, lease+check+slack, "a new leader after kill -9", func() bool {
		node, e, valid := f.lease()
		return valid && e > epoch && node != leader
	})
	t.Logf("failover after kill -9 took %s", time.Since(killedAt).Round(time.Millisecond))
	f.start(leader) // back to three nodes
	proctest.WaitFor(t, 30*time.Second, leader+" registered again", func() bool {
		return f.nodeStatus(leader) == status.NodeActive && f.incarnation(leader) != killedInc
	})
	leader, epoch = f.steadyLeader(30*time.Second, running()...)

	// SIGSTOP past the lease: the paused process keeps its TCP session and so its lock; the
	// others must end that session once the lease has expired and take over. When the old
	// leader resumes, it must find itself fenced out and step down.
	paused := f.procs[leader]
	paused.Signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	proctest.WaitFor(t, lease+slack+slack, "a new leader while the old one is paused", func() bool {
		node, e, valid := f.lease()
		return valid && e > epoch && node != leader
	})
	t.Logf("failover after SIGSTOP took %s", time.Since(stoppedAt).Round(time.Millisecond))
	newLeader, newEpoch, _ := f.lease()
	// Let the new leader write under its epoch before the old one wakes up.
	proctest.WaitFor(t, 10*time.Second, "the new leader's first maintenance write", func() bool {
		var n int
		_ = f.pool.QueryRow(context.Background(), `SELECT count(*) FROM maintenance_runs WHERE epoch = $1`, newEpoch).Scan(&n)
		return n > 0
	})
	paused.Signal(t, syscall.SIGCONT)
	pausedEndpoint := f.endpoint(leader)
	proctest.WaitFor(t, 10*time.Second, "the resumed leader to step down", func() bool {
		v, ok := proctest.Metric(pausedEndpoint, isLeader)
		return ok && v == 0 && strings.Contains(paused.Logs(), "stepped down")
	})
	var staleWrites int
	if err := f.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM maintenance_runs WHERE epoch = $1 AND id > (SELECT min(id) FROM maintenance_runs WHERE epoch = $2)`,
		epoch, newEpoch).Scan(&staleWrites); err != nil {
		t.Fatal(err)
	}
	if staleWrites != 0 {
		t.Fatalf("the paused leader (epoch %d) wrote %d times after epoch %d began", epoch, staleWrites, newEpoch)
	}
	f.checkFencing()
	leader, epoch = f.steadyLeader(30*time.Second, running()...)
	if leader != newLeader {
		t.Logf("leadership moved again after the pause: %s -> %s", newLeader, leader)
	}

	// A lost lock session: the leader must notice, step down, and leadership must move.
	var terminated int
	if err := f.pool.QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(a.pid))
		FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
		WHERE a.application_name = 'harmonia-ci locks' AND l.locktype = 'advisory' AND l.granted
		  AND l.classid = 1212369201 AND l.objid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&terminated); err != nil {
		t.Fatal(err)
	}
	if terminated != 1 {
		t.Fatalf("terminated %d lock sessions, want the leader's one", terminated)
	}
	oldEndpoint := f.endpoint(leader)
	proctest.WaitFor(t, 5*time.Second, "the leader to step down after losing its lock session", func() bool {
		v, ok := proctest.Metric(oldEndpoint, isLeader)
		return ok && v == 0
	})
	proctest.WaitFor(t, lease+slack, "leadership to move to another node", func() bool {
		node, e, valid := f.lease()
		return valid && e > epoch && node != leader
	})
	leader, epoch = f.steadyLeader(30*time.Second, running()...)

	// SIGTERM: a clean drain. The leader resigns, deregisters and exits 0; a standby takes over
	// within a few check intervals instead of waiting for the lease.
	term := f.procs[leader]
	term.Signal(t, syscall.SIGTERM)
	termAt := time.Now()
	if code := term.Wait(t, 15*time.Second); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM, want 0", leader, code)
	}
	for _, want := range []string{"resigned leadership", "deregistered"} {
		if !strings.Contains(term.Logs(), want) {
			t.Errorf("%s's log lacks %q", leader, want)
		}
	}
	if s := f.nodeStatus(leader); s != "" {
		t.Errorf("%s still has a node row (status %s) after a clean exit", leader, s)
	}
	proctest.WaitFor(t, lease, "a standby to take over after the resignation", func() bool {
		node, e, valid := f.lease()
		return valid && e > epoch && node != leader
	})
	t.Logf("handover after SIGTERM took %s", time.Since(termAt).Round(time.Millisecond))
	f.steadyLeader(30*time.Second, running()...)
	f.checkFencing()
}
