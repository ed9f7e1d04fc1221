package e2ebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// deepOrders are the queue orders the deep workload compares, each on a cluster of its own.
var deepOrders = []string{config.OrderFIFO, config.OrderCriticalPath}

// E2EDeepWorkload is the deep workload (issue 16 part 4): several projects evaluated at the same time on
// running builders, each a chain (the critical path) enqueued behind many independent leaves,
// built once per queue order on a fresh cluster and database.
type E2EDeepWorkload struct {
	Projects     int     `json:"projects"`
	Leaves       int     `json:"leaves_per_project"`
	Chain        int     `json:"chain_per_project"`
	SleepSeconds float64 `json:"sleep_seconds"`
	Jobs         int     `json:"jobs"`  // per run, every project's
	Slots        int     `json:"slots"` // builders × slots
	// Runs are every run, in the order they ran (rounds alternate which order goes first).
	Runs []E2EDeepRun `json:"runs"`
	// FIFO and CriticalPath are each order's run of the shortest makespan.
	FIFO         *E2EDeepRun `json:"fifo,omitempty"`
	CriticalPath *E2EDeepRun `json:"critical_path,omitempty"`
	// CriticalPathToFIFO is CriticalPath's makespan ÷ FIFO's: below 1, critical-path order
	// finished sooner.
	CriticalPathToFIFO float64 `json:"critical_path_to_fifo_makespan,omitempty"`
}

// E2EDeepRun is one run of the deep workload under one queue order. Times are the database's.
type E2EDeepRun struct {
	Order string `json:"order"` // queue.order of every node
	Round int    `json:"round"`
	// MakespanSeconds runs from the first job's enqueue to the last job's finish.
	MakespanSeconds float64 `json:"makespan_seconds"`
	// FromTriggerSeconds runs from the evaluations' trigger to the last job's finish;
	// EvalSeconds to the last evaluation's end.
	FromTriggerSeconds float64 `json:"from_trigger_seconds"`
	EvalSeconds        float64 `json:"eval_seconds"`
	// CriticalPathSeconds is the longest path through the DAG weighted by each job's measured
	// started → finished (a job's dependents cannot start before it has succeeded).
	// WorkSeconds sums the time each job held a build slot: the builder's fetch and build steps
	// (reading the outputs back and the upload run after them, partly off the slot, and are left
	// out: the bound stays a bound). WorkPerSlotSeconds = work ÷ slots.
	CriticalPathSeconds float64 `json:"critical_path_seconds"`
	WorkSeconds         float64 `json:"work_seconds"`
	WorkPerSlotSeconds  float64 `json:"work_per_slot_seconds"`
	// LowerBoundSeconds is max(critical path, work ÷ slots); Ratio is makespan ÷ that.
	LowerBoundSeconds float64 `json:"lower_bound_seconds"`
	Ratio             float64 `json:"makespan_to_lower_bound"`
	// ChainStartSeconds is, averaged over the projects, when the job with the longest chain of
	// dependents (the chain's base) started, from the first enqueue.
	ChainStartSeconds float64 `json:"chain_start_seconds"`
	// ChainQueuePosition is the fewest, over the projects, of a project's jobs enqueued before
	// its chain's base: FIFO builds those first (the workload's premise: at least the leaves
	// of the evaluator's first batch).
	ChainQueuePosition int `json:"chain_queue_position"`
	// LinkWaitSeconds is, averaged over the jobs with inputs among the run's jobs (the chains'
	// links but their bases), the time from the last input's finish to the job's start: the
	// dispatch gap the critical path pays per link, beyond its durations.
	LinkWaitSeconds float64 `json:"link_wait_seconds"`
	// Utilisation is work ÷ (makespan × slots).
	Utilisation float64 `json:"slot_utilisation"`
	Retries     int     `json:"retries"` // jobs claimed more than once
}

// deep runs the deep workload: for each round, one run per order.
func (b *e2e) deep(ctx context.Context) (*E2EDeepWorkload, error) {
	o := b.o
	w := &E2EDeepWorkload{Projects: o.DeepProjects, Leaves: o.DeepLeaves, Chain: o.DeepChain, SleepSeconds: o.DeepSleep,
		Jobs: o.DeepProjects * (o.DeepLeaves + o.DeepChain), Slots: o.Builders * o.Slots}
	for round := 1; round <= o.Rounds; round++ {
		orders := deepOrders
		if round%2 == 0 { // alternate, so that neither order always runs second on a warm machine
			orders = []string{deepOrders[1], deepOrders[0]}
		}
		for _, order := range orders {
			o.Logger.Info("deep workload", "order", order, "round", round, "projects", o.DeepProjects,
				"jobs", w.Jobs, "builders", o.Builders, "slots", o.Slots)
			run, err := b.deepRun(ctx, order, round)
			if err != nil {
				return nil, fmt.Errorf("%s order, round %d: %w", order, round, err)
			}
			w.Runs = append(w.Runs, run)
		}
	}
	for i := range w.Runs {
		run := &w.Runs[i]
		best := &w.FIFO
		if run.Order == config.OrderCriticalPath {
			best = &w.CriticalPath
		}
		if *best == nil || run.MakespanSeconds < (*best).MakespanSeconds {
			*best = run
		}
	}
	if w.FIFO != nil && w.CriticalPath != nil && w.FIFO.MakespanSeconds > 0 {
		w.CriticalPathToFIFO = w.CriticalPath.MakespanSeconds / w.FIFO.MakespanSeconds
	}
	return w, nil
}

// deepRun starts a fresh database, a frontend node and the builders, all with queue.order
// order, adds the projects, triggers their evaluations at once and measures the build.
func (b *e2e) deepRun(ctx context.Context, order string, round int) (E2EDeepRun, error) {
	o := b.o
	run := E2EDeepRun{Order: order, Round: round}
	dir := filepath.Join(b.dir, fmt.Sprintf("deep-%s-%d", order, round))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return run, err
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: "", Dir: filepath.Join(dir, "pg"), MaxServerConns: 200, App: "harmonia-ci bench e2e", PoolConns: 4, Logger: o.Logger})
	if err != nil {
		return run, err
	}
	defer d.Close()
	b.postgres = d.Version
	rb := &e2e{o: o, dir: dir, url: d.URL, pool: d.Pool, token: bench.RandomHex(16), failed: make(chan error, 64),
		nixBin: b.nixBin, nixCmd: b.nixCmd, nodeLog: b.nodeLog, logger: b.logger,
		claims: map[int64]time.Duration{}, timings: map[int64]builder.Timings{}}

	front, err := rb.frontConfig()
	if err != nil {
		return run, err
	}
	front.Node.MaxEvals = o.DeepProjects // the evaluations run side by side
	front.Queue.Order = order
	if err := front.Validate(); err != nil {
		return run, err
	}
	rb.front = rb.start(ctx, front)
	defer rb.front.Stop()

	names, err := rb.addDeepProjects(ctx, order, round)
	if err != nil {
		return run, err
	}

	// The builders run before the evaluations start: the fleet waits for work, as a real one.
	var builders []*bench.Node
	defer func() { _ = bench.StopNodes(builders) }()
	for i := 1; i <= o.Builders; i++ {
		cfg, err := rb.builderConfig(fmt.Sprintf("deep-b%d", i), true, order)
		if err != nil {
			return run, err
		}
		builders = append(builders, rb.start(ctx, cfg))
	}
	if err := bench.WaitReady(ctx, append([]*bench.Node{rb.front}, builders...)...); err != nil {
		return run, err
	}

	projects, trigger, err := rb.evaluateAll(ctx, names, &run)
	if err != nil {
		return run, err
	}
	if err := rb.waitBuilt(ctx, projects); err != nil {
		return run, err
	}
	if err := bench.StopNodes(builders); err != nil {
		return run, err
	}
	builders = nil
	return run, rb.measureDeep(ctx, &run, projects, trigger)
}

// deepJobRow is one job of a deep run, as the database recorded it.
type deepJobRow struct {
	id, project                int64
	drv                        string
	attempt                    int
	created, started, finished time.Time
	inputs                     []string // input derivations
}

// addDeepProjects adds o.DeepProjects projects, each on a repository of the deep workload
// with fresh derivations, and returns their names.
func (b *e2e) addDeepProjects(ctx context.Context, order string, round int) ([]string, error) {
	o := b.o
	names := make([]string, o.DeepProjects)
	for p := range names {
		salt := fmt.Sprintf("deep-%s-%d-p%d-%s", order, round, p, bench.RandomHex(6))
		repo, err := bench.MakeRepo(filepath.Join(b.dir, fmt.Sprintf("repo-p%d", p)), nixgen.Deep(salt, o.DeepLeaves, o.DeepChain, o.DeepSleep))
		if err != nil {
			return nil, err
		}
		names[p] = fmt.Sprintf("deep-p%d", p)
		if _, err := project.Add(ctx, b.pool, project.AddParams{Name: names[p], RepoURL: repo}); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// evaluateAll triggers an evaluation of every project at once and waits for them to succeed;
// it returns the projects' ids and the trigger time (database clock), and sets
// run.EvalSeconds.
func (b *e2e) evaluateAll(ctx context.Context, names []string, run *E2EDeepRun) ([]int64, time.Time, error) {
	var trigger time.Time
	if err := b.pool.QueryRow(ctx, sqlNow).Scan(&trigger); err != nil {
		return nil, trigger, err
	}
	evals := make([]evaluation.Evaluation, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for p := range names {
		wg.Go(func() {
			evals[p], _, errs[p] = eval.Trigger(ctx, b.pool, eval.TriggerParams{Project: names[p], StateDir: filepath.Join(b.dir, "cli")})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, trigger, err
	}
	projects := make([]int64, len(evals))
	for p := range evals {
		projects[p] = evals[p].ProjectID
		var err error
		if err := bench.WaitFor(ctx, b.failed, func() (bool, error) {
			evals[p], err = evaluation.Get(ctx, b.pool, evals[p].ID)
			return evals[p].Finished(), err
		}); err != nil {
			return nil, trigger, err
		}
		if evals[p].Status != status.EvalSucceeded {
			return nil, trigger, fmt.Errorf("evaluation of %s %s: %s", names[p], evals[p].Status, evals[p].Error)
		}
		run.EvalSeconds = max(run.EvalSeconds, evals[p].FinishedAt.Sub(trigger).Seconds())
	}
	return projects, trigger, nil
}

// waitBuilt waits until every job of projects succeeded and its builder reported its timings.
func (b *e2e) waitBuilt(ctx context.Context, projects []int64) error {
	o := b.o
	// A queue that stops handing out jobs must not hang the benchmark: allow the builds run one
	// at a time, plus three minutes.
	limit := 3*time.Minute + time.Duration(float64(o.DeepProjects*(o.DeepLeaves+o.DeepChain))*o.DeepSleep*float64(time.Second))
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var failures []string
	var open int
	if err := bench.WaitFor(wctx, b.failed, func() (bool, error) {
		var err error
		open, failures, err = unfinishedJobs(ctx, b.pool, projects)
		return open == 0, err
	}); err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return fmt.Errorf("%d jobs still open after %s (see the nodes' warnings)", open, limit.Round(time.Second))
		}
		return err
	}
	if len(failures) > 0 {
		return fmt.Errorf("%d jobs did not succeed: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
	// A job is succeeded before its builder has finished with it (roots, log tail): stopping
	// the builders before then would abandon that work.
	for _, p := range projects {
		if err := b.waitTimings(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// measureDeep fills run's figures from the build jobs of projects.
func (b *e2e) measureDeep(ctx context.Context, run *E2EDeepRun, projects []int64, trigger time.Time) error {
	rows, err := b.pool.Query(ctx, sqlDeepJobs, projects)
	if err != nil {
		return err
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deepJobRow, error) {
		var j deepJobRow
		err := r.Scan(&j.id, &j.project, &j.drv, &j.attempt, &j.created, &j.started, &j.finished, &j.inputs)
		return j, err
	})
	if err != nil {
		return fmt.Errorf("read build jobs: %w", err)
	}
	if want := b.o.DeepProjects * (b.o.DeepLeaves + b.o.DeepChain); len(jobs) != want {
		return fmt.Errorf("the evaluations made %d build jobs, want %d", len(jobs), want)
	}
	b.mu.Lock()
	timings := maps.Clone(b.timings)
	b.mu.Unlock()
	dag := make([]dagJob, len(jobs))
	first, last := jobs[0].created, jobs[0].finished
	for i, j := range jobs {
		t, ok := timings[j.id]
		if !ok {
			return fmt.Errorf("no timings for job %d", j.id)
		}
		dag[i] = dagJob{Drv: j.drv, Inputs: j.inputs, Latency: j.finished.Sub(j.started).Seconds(), Busy: (t.Fetch + t.Build).Seconds()}
		if j.created.Before(first) {
			first = j.created
		}
		if j.finished.After(last) {
			last = j.finished
		}
		if j.attempt > 1 {
			run.Retries++
		}
	}
	finishedBy := make(map[string]time.Time, len(jobs))
	for _, j := range jobs {
		finishedBy[j.drv] = j.finished
	}
	var waits int
	for _, j := range jobs {
		var ready time.Time
		for _, in := range j.inputs {
			if f, ok := finishedBy[in]; ok && f.After(ready) {
				ready = f
			}
		}
		if !ready.IsZero() {
			run.LinkWaitSeconds += j.started.Sub(ready).Seconds()
			waits++
		}
	}
	if waits > 0 {
		run.LinkWaitSeconds /= float64(waits)
	}
	slots := b.o.Builders * b.o.Slots
	lb, err := computeLowerBound(dag, slots)
	if err != nil {
		return err
	}
	run.MakespanSeconds = last.Sub(first).Seconds()
	run.FromTriggerSeconds = last.Sub(trigger).Seconds()
	run.CriticalPathSeconds, run.WorkSeconds = lb.CriticalPath, lb.Work
	run.WorkPerSlotSeconds, run.LowerBoundSeconds = lb.Work/float64(slots), lb.Bound
	if lb.Bound > 0 {
		run.Ratio = run.MakespanSeconds / lb.Bound
	}
	if run.MakespanSeconds > 0 {
		run.Utilisation = lb.Work / (run.MakespanSeconds * float64(slots))
	}

	// Per project, the job of the longest tail: where it stood in FIFO order, and when it ran.
	// jobs are in FIFO order (created_at, id), so its position is the project's jobs before it.
	type head struct {
		tail     float64
		position int
		started  time.Time
	}
	heads := map[int64]*head{}
	seen := map[int64]int{}
	for _, j := range jobs {
		tail := lb.Tails[j.drv]
		if h := heads[j.project]; h == nil || tail > h.tail {
			heads[j.project] = &head{tail: tail, position: seen[j.project], started: j.started}
		}
		seen[j.project]++
	}
	run.ChainQueuePosition = len(jobs)
	for _, h := range heads {
		run.ChainStartSeconds += h.started.Sub(first).Seconds() / float64(len(heads))
		run.ChainQueuePosition = min(run.ChainQueuePosition, h.position)
	}
	return nil
}

// print writes the deep workload's table.
func (w *E2EDeepWorkload) print(out io.Writer, builders, slots, rounds int) {
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  deep DAG, %d evaluations at once: each project %d independent leaves, then a chain of %d (enqueued after the leaves);\n",
		w.Projects, w.Leaves, w.Chain)
	fmt.Fprintf(out, "  every build sleeps %g s; %d jobs on %d builders × %d slots, each its own chroot store; %d round(s) per order,\n",
		w.SleepSeconds, w.Jobs, builders, slots, rounds)
	fmt.Fprintf(out, "  each on a fresh database and cluster, every node with that queue.order; the builders run before the evaluations are triggered\n")
	fmt.Fprintf(out, "  makespan: first enqueue → last finished (database clock); lower bound = max(critical path, work ÷ slots): the critical path weighted by\n")
	fmt.Fprintf(out, "  each job's started → finished, the work by each job's time on its slot (the builder's fetch and build steps)\n")
	fmt.Fprintf(out, "    %-14s %5s %9s %9s %9s %9s %7s %9s %6s %9s %5s %5s %7s %8s\n",
		"order", "round", "makespan", "crit.path", "work÷slot", "bound", "÷bound", "chain at", "behind", "link wait", "util", "retry", "eval", "trigger")
	for _, r := range w.Runs {
		fmt.Fprintf(out, "    %-14s %5d %8.2fs %8.2fs %8.2fs %8.2fs %7.2f %8.2fs %6d %7.0fms %4.0f%% %5d %6.2fs %7.2fs\n",
			r.Order, r.Round, r.MakespanSeconds, r.CriticalPathSeconds, r.WorkPerSlotSeconds, r.LowerBoundSeconds, r.Ratio,
			r.ChainStartSeconds, r.ChainQueuePosition, 1000*r.LinkWaitSeconds, 100*r.Utilisation, r.Retries, r.EvalSeconds, r.FromTriggerSeconds)
	}
	fmt.Fprintf(out, "    chain at: when the chain's base started after the first enqueue (mean over projects); behind: the fewest of a project's\n")
	fmt.Fprintf(out, "    jobs enqueued before its chain's base; link wait: a link's last input finished → it started (mean over the links);\n")
	fmt.Fprintf(out, "    eval and trigger: from the evaluations' trigger to the last evaluation's end, the last job's\n")
	if w.FIFO != nil && w.CriticalPath != nil {
		fmt.Fprintf(out, "    best: fifo %.2f s (%.2f × bound), critical-path %.2f s (%.2f × bound): critical-path ÷ fifo makespan %.2f\n",
			w.FIFO.MakespanSeconds, w.FIFO.Ratio, w.CriticalPath.MakespanSeconds, w.CriticalPath.Ratio, w.CriticalPathToFIFO)
	}
}
