// Package queue is the build queue: enqueue with dedup, the work-stealing claim
// (DAG readiness, fair shares, priority, FOR UPDATE SKIP LOCKED), guarded finishes, failure
// propagation and rebuild, the leader-only maintenance that heals the queue when nodes die,
// and the Worker loop that ties a node's build slots to it.
//
// Readiness is kept up to date by triggers (migration 0002): build_jobs.blocked_inputs counts a
// job's input jobs that have not succeeded, so the claim reads only ready rows.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// ErrStale means the claim no longer holds: the job was reaped, re-claimed, cancelled or
// finished by someone else. The write changed nothing.
var ErrStale = errors.New("claim no longer holds")

// Derivation is one .drv with what the queue needs to know about it (the derivations table).
type Derivation struct {
	DrvPath          string // /nix/store/<hash>-<name>.drv
	Name             string
	System           string
	RequiredFeatures []string
	NarHash          string // "sha256:…" of the .drv's NAR
	NarSize          int64
	Outputs          []Output
	Inputs           []Input  // input derivations (inputDrvs)
	InputSrcs        []string // input sources (inputSrcs), store paths
}

// Output is one output of a derivation.
type Output struct {
	Name string
	Path string // "" for floating CA outputs
}

// Input is one input derivation edge.
type Input struct {
	DrvPath string
	Outputs []string
}

// EnqueueParams is one enqueue.
type EnqueueParams struct {
	// ProjectID charges the new jobs' builder time to a project; nil for none.
	ProjectID *int64
	// Derivations to record (deduplicated against what the database has).
	Derivations []Derivation
	// Build lists the derivations that need a build job; nil means all of Derivations.
	Build []string
	// Order ranks the new jobs among a project's ready jobs of equal priority.
	Order Order
	// DeferRaise leaves the chains of the jobs that were there before (below the new ones) as
	// they are, for one RaiseDeferred after the last of several enqueues: an evaluation arrives
	// inputs first, so raising at every enqueue would raise everything below again each time.
	DeferRaise bool
	// Untrusted creates the jobs untrusted (for a pull request): what they build is quarantined.
	Untrusted bool
	// RetryLimit build failures of the new jobs go back to the queue, each after RetryBackoff
	// (whole seconds); 0: a build failure fails the job.
	RetryLimit   int
	RetryBackoff time.Duration
}

// Order is how a project's ready jobs of equal priority are ranked.
type Order int

const (
	// OrderCriticalPath builds first the job with the longest chain of dependents still to
	// build (the default).
	OrderCriticalPath Order = iota
	// OrderFIFO builds first the job enqueued first.
	OrderFIFO
)

// ParseOrder reads queue.order's value.
func ParseOrder(s string) (Order, error) {
	switch s {
	case "critical-path", "":
		return OrderCriticalPath, nil
	case "fifo":
		return OrderFIFO, nil
	}
	return 0, fmt.Errorf("queue order %q: want critical-path or fifo", s)
}

// batchSize bounds each INSERT; all batches of one Enqueue share one transaction, so a
// dependent can never become claimable before its inputs' jobs exist.
const batchSize = 5000

// EnqueueResult says what an enqueue created.
type EnqueueResult struct {
	NewJobs int
}

// Enqueue records derivations, their outputs and inputs, and a build job for each derivation to
// build, skipping what already exists (ON CONFLICT DO NOTHING: a second evaluation producing the
// same derivation shares its job). Builders are woken per system at commit.
func Enqueue(ctx context.Context, pool *pgxpool.Pool, p EnqueueParams) (EnqueueResult, error) {
	var res EnqueueResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = EnqueueTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res, nil
}

// EnqueueTx is Enqueue inside the caller's transaction (the evaluator records its attributes
// in the same one). The builders' wake-ups are sent at the transaction's commit.
func EnqueueTx(ctx context.Context, tx pgx.Tx, p EnqueueParams) (EnqueueResult, error) {
	var res EnqueueResult
	for _, d := range p.Derivations {
		if err := validateDerivation(d); err != nil {
			return res, fmt.Errorf("enqueue: %w", err)
		}
	}
	build := p.Build
	if build == nil {
		build = make([]string, len(p.Derivations))
		for i, d := range p.Derivations {
			build[i] = d.DrvPath
		}
	}
	systems := map[string]bool{}
	err := func() error {
		if _, err := tx.Exec(ctx, sqlEnqueueLock, db.LockClass, db.LockEnqueue); err != nil {
			return fmt.Errorf("take enqueue lock: %w", err)
		}
		for chunk := range slices.Chunk(p.Derivations, batchSize) {
			if err := insertDerivations(ctx, tx, chunk); err != nil {
				return err
			}
		}
		chains := chainsOf(p.Order, p.Derivations, build)
		created := map[string]bool{}
		for chunk := range slices.Chunk(build, batchSize) {
			chunkChains := make([]int32, len(chunk))
			for i, drv := range chunk {
				chunkChains[i] = int32(chains.of(drv))
			}
			rows, err := tx.Query(ctx, sqlJobsInsert, chunk, p.ProjectID, chunkChains, !p.Untrusted,
				p.RetryLimit, int64(p.RetryBackoff.Seconds()))
			if err != nil {
				return fmt.Errorf("insert build jobs: %w", err)
			}
			var drv, system string
			_, err = pgx.ForEachRow(rows, []any{&drv, &system}, func() error {
				created[drv] = true
				systems[system] = true
				return nil
			})
			if err != nil {
				return fmt.Errorf("insert build jobs: %w", err)
			}
		}
		res.NewJobs = len(created)
		if seeds, at := chains.raises(created); len(seeds) > 0 && !p.DeferRaise {
			if _, err := tx.Exec(ctx, sqlRaiseChains, seeds, at); err != nil {
				return fmt.Errorf("raise dependent chains: %w", err)
			}
		}
		for _, s := range slices.Sorted(maps.Keys(systems)) {
			if err := notifyJobs(ctx, tx, map[string]string{"system": s}); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("enqueue: %w", err)
	}
	return res, nil
}

func insertDerivations(ctx context.Context, tx pgx.Tx, ds []Derivation) error {
	n := len(ds)
	drv, hash, name, system, feats, narHash, srcs := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	narSize := make([]int64, n)
	var oDrv, oName, oPath, iRef, iDrv, iOut []string
	for i, d := range ds {
		drv[i], name[i], system[i], narHash[i], narSize[i] = d.DrvPath, d.Name, d.System, d.NarHash, d.NarSize
		hash[i] = hashPart(d.DrvPath)
		feats[i] = strings.Join(d.RequiredFeatures, ",")
		srcs[i] = strings.Join(d.InputSrcs, " ")
		for _, o := range d.Outputs {
			oDrv, oName, oPath = append(oDrv, d.DrvPath), append(oName, o.Name), append(oPath, o.Path)
		}
		for _, in := range d.Inputs {
			iRef, iDrv, iOut = append(iRef, d.DrvPath), append(iDrv, in.DrvPath), append(iOut, strings.Join(in.Outputs, ","))
		}
	}
	if _, err := tx.Exec(ctx, sqlDerivationsInsert, drv, hash, name, system, feats, narHash, narSize, srcs); err != nil {
		return fmt.Errorf("insert derivations: %w", err)
	}
	if len(oDrv) > 0 {
		if _, err := tx.Exec(ctx, sqlOutputsInsert, oDrv, oName, oPath); err != nil {
			return fmt.Errorf("insert derivation outputs: %w", err)
		}
	}
	if len(iRef) > 0 {
		if _, err := tx.Exec(ctx, sqlInputsInsert, iRef, iDrv, iOut); err != nil {
			return fmt.Errorf("insert derivation inputs: %w", err)
		}
	}
	return nil
}

// hashPart is the 32-character hash of a store path's basename.
func hashPart(storePath string) string {
	base := strings.TrimPrefix(storePath, "/nix/store/")
	if len(base) < 32 {
		return base
	}
	return base[:32]
}

// validateDerivation rejects what would corrupt the queue: paths outside the store, names
// that cannot be store path names, lists that cannot survive the comma-joined batch encoding.
func validateDerivation(d Derivation) error {
	if !isDrvPath(d.DrvPath) {
		return fmt.Errorf("derivation %q: not a /nix/store/<32-char hash>-<name>.drv path", d.DrvPath)
	}
	if d.System == "" || d.Name == "" || d.NarHash == "" {
		return fmt.Errorf("derivation %s: name, system and nar hash are required", d.DrvPath)
	}
	for _, f := range d.RequiredFeatures {
		if f == "" || strings.Contains(f, ",") {
			return fmt.Errorf("derivation %s: invalid required feature %q", d.DrvPath, f)
		}
	}
	for _, src := range d.InputSrcs {
		if _, err := nix.ParseStorePath(src); err != nil {
			return fmt.Errorf("derivation %s: input source: %w", d.DrvPath, err)
		}
	}
	for _, in := range d.Inputs {
		if !isDrvPath(in.DrvPath) {
			return fmt.Errorf("derivation %s: input %q is not a .drv store path", d.DrvPath, in.DrvPath)
		}
		for _, o := range in.Outputs {
			if o == "" || strings.Contains(o, ",") {
				return fmt.Errorf("derivation %s: input %s: invalid output name %q", d.DrvPath, in.DrvPath, o)
			}
		}
	}
	return nil
}

const nixBase32 = "0123456789abcdfghijklmnpqrsvwxyz"

func isDrvPath(p string) bool {
	base, ok := strings.CutPrefix(p, "/nix/store/")
	if !ok || len(base) < 34 || base[32] != '-' || !strings.HasSuffix(base, ".drv") || strings.Contains(base, "/") {
		return false
	}
	for _, c := range base[:32] {
		if !strings.ContainsRune(nixBase32, c) {
			return false
		}
	}
	return true
}

// NotifyJobs sends one build_jobs notification (a JSON object: {"system"} wakes builders,
// {"drv_path","status"} announces a finish) at the commit of tx.
func NotifyJobs(ctx context.Context, tx pgx.Tx, payload map[string]string) error {
	return notifyJobs(ctx, tx, payload)
}

func notifyJobs(ctx context.Context, q db.DBTX, payload map[string]string) error {
	b, _ := json.Marshal(payload)
	if _, err := q.Exec(ctx, sqlNotify, string(b)); err != nil {
		return fmt.Errorf("notify build_jobs: %w", err)
	}
	return nil
}

// Job is a claimed build job.
type Job struct {
	ID               int64
	DrvPath          string
	System           string
	ProjectID        *int64
	Priority         int
	Attempt          int
	RetryCount       int
	RequiredFeatures []string
	ClaimedAt        time.Time
	NodeID           string
}

// Claim identifies one attempt at a job: every write its holder makes is guarded by it.
func (j *Job) Claim() Claim { return Claim{JobID: j.ID, NodeID: j.NodeID, Attempt: j.Attempt} }

// Claim identifies one attempt at a job: the one type the worker, the builder, the uploader and
// the signer hold a job's claim in (signerapi.JobClaim is only its form on the wire).
type Claim struct {
	JobID   int64
	NodeID  string
	Attempt int
}

func (c Claim) String() string {
	return fmt.Sprintf("job %d attempt %d by %s", c.JobID, c.Attempt, c.NodeID)
}
