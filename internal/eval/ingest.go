package eval

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/upload"
	"github.com/harmonia-ci/harmonia-ci/internal/upstream"
)

// errStale means the evaluation's claim no longer holds (cancelled, superseded or reaped).
var errStale = errors.New("evaluation claim no longer holds")

// CacheLookup tells which store paths a binary cache holds. The signer client is one.
type CacheLookup interface {
	CacheLookup(ctx context.Context, paths []string) ([]string, error)
}

// Publisher puts an evaluation's .drv files (inputs first) and sources into the cache.
type Publisher interface {
	PublishEval(ctx context.Context, eval signerapi.EvalClaim, drvs []string, sources []upload.Path) (upload.Response, error)
}

// ingester turns batches of attributes into rows: the derivation closure (layer 1), the
// attributes and the build jobs, after publishing the new .drv files and sources. A batch is
// prepared (closure read, cache decided, published) as soon as it arrives, and prepared batches
// are committed together (see Evaluator.ingest): the walk never waits for ingestion, and the
// database sees a few large transactions instead of one per batch.
type ingester struct {
	pool      *pgxpool.Pool
	storeRoot string
	storeDB   *nix.StoreDB
	cache     CacheLookup      // nil: only the database's record of the cache
	upstream  *upstream.Caches // nil: none
	publisher Publisher        // nil: nothing is published (tests of ingestion alone)

	evalID    int64
	node      string
	attempt   int
	projectID int64
	// helper: this node walks units of an evaluation another node claimed; its transactions
	// prove the evaluation runs at attempt and that it holds the units it commits.
	helper bool
	order  queue.Order
	// trusted: an evaluation of a branch, whose jobs build outputs everyone may substitute; a
	// pull request's jobs are untrusted and their outputs quarantined. promote is the project's
	// setting: a trusted evaluation takes a quarantined output as built, or else rebuilds it.
	trusted, promote bool
	// retry is the project's retry policy, capped, recorded on the jobs the evaluation needs;
	// failureExpiry (0: none) is how old a failure it needs may be before it is built again.
	retry         RetryPolicy
	failureExpiry time.Duration
	// maxDerivations is the most new derivations the evaluation may add; 0: unlimited.
	maxDerivations int
	added          int // new derivations of this evaluation's prepared batches

	known     map[string]bool     // derivations in the database (found there or committed)
	prepared  map[string]bool     // new derivations of prepared batches, not committed yet
	published map[string]bool     // store paths published by this evaluation
	checked   map[string]drvCheck // derivations verified (see verify), and their hashes
	claims    map[string]claimant // output path → the derivation claiming it (checkSharedOutputs)
	// enqueued and needed are the new derivations and the jobs of every commit, whose chains
	// (and those below them) are raised once, after the last commit (see raiseChains).
	enqueued []queue.Derivation
	needed   []string

	stats ingestStats
}

type ingestStats struct {
	Attrs, Derivations, Jobs, Published, Commits int
}

// batch is a prepared batch: its closure read and published, its rows not yet committed.
type batch struct {
	attrs       []Attr
	derivs      []queue.Derivation
	build       []string // derivations that get a job
	preexisting []string // known derivations it met, whose cancelled jobs it may need again
	promote     []string // quarantined output paths a trusted evaluation takes as built
	units       []Attr   // the claims of the table units its attributes came from, and those walked to the end
}

// prepare reads the closure of a batch of attributes down to what the database or an earlier
// prepared batch has, decides which new derivations need a job, and publishes the new .drv
// files and sources. The caller holds the publication lock (publication.Hold) from the first
// prepare until the commit of its rows.
func (in *ingester) prepare(ctx context.Context, attrs []Attr) (batch, error) {
	var units []Attr
	attrs = slices.DeleteFunc(attrs, func(a Attr) bool {
		if a.unit != 0 {
			units = append(units, a)
		}
		return a.unitDone
	})
	attrs, err := in.verify(ctx, attrs)
	if err != nil {
		return batch{}, err
	}
	b := batch{attrs: attrs, units: units}
	var roots []string
	for _, a := range attrs {
		if a.DrvPath != "" {
			roots = append(roots, a.DrvPath)
		}
	}
	fresh, texts, preexisting, err := in.closure(ctx, roots)
	if err != nil {
		return b, err
	}
	if err := in.checkSharedOutputs(ctx, fresh); err != nil {
		return b, err
	}
	// Texts the closure did not take are of derivations the database knows: keep only hashes.
	for p, c := range in.checked {
		if c.drv != nil {
			c.text, c.drv = nil, nil
			in.checked[p] = c
		}
	}
	b.preexisting = preexisting
	// Checked before anything of the batch is published or written.
	if in.added += len(fresh); in.maxDerivations > 0 && in.added > in.maxDerivations {
		return b, fmt.Errorf("%w: more than %d new derivations (eval.max_derivations)", ErrTooLarge, in.maxDerivations)
	}
	newDrvs := slices.Sorted(maps.Keys(fresh))
	b.derivs = make([]queue.Derivation, 0, len(newDrvs))
	for _, p := range newDrvs {
		d := fresh[p]
		// A .drv file's NAR is that of one regular file: its hash and size follow from the text,
		// exactly as Nix's database records them, without a query per file.
		nar := nix.FileNAR(texts[p], false)
		qd := queue.Derivation{DrvPath: p, Name: d.Name(), System: d.Platform,
			RequiredFeatures: d.RequiredSystemFeatures(), NarHash: nix.FormatSHA256(sha256.Sum256(nar)),
			NarSize: int64(len(nar)), InputSrcs: d.InputSrcs}
		for _, name := range d.OutputNames() {
			qd.Outputs = append(qd.Outputs, queue.Output{Name: name, Path: d.Outputs[name].Path})
		}
		for _, in := range slices.Sorted(maps.Keys(d.InputDrvs)) {
			qd.Inputs = append(qd.Inputs, queue.Input{DrvPath: in, Outputs: d.InputDrvs[in]})
		}
		if qd.Name == "" {
			qd.Name = drvName(p)
		}
		b.derivs = append(b.derivs, qd)
	}
	if b.build, b.promote, err = in.needBuild(ctx, roots, fresh); err != nil {
		return b, err
	}
	if err := in.publish(ctx, newDrvs, fresh); err != nil {
		return b, err
	}
	for _, p := range newDrvs {
		in.prepared[p] = true
	}
	return b, nil
}

// commit inserts prepared batches in one transaction: layer 1, the attributes and the jobs
// (queue.EnqueueTx), and revives cancelled jobs they need again.
func (in *ingester) commit(ctx context.Context, batches []batch) error {
	var derivs []queue.Derivation
	var names, drvs, errs, preexisting, promote []string
	var unitIDs []int64
	var units []Attr
	build := []string{}
	for _, b := range batches {
		derivs = append(derivs, b.derivs...)
		build = append(build, b.build...)
		preexisting = append(preexisting, b.preexisting...)
		promote = append(promote, b.promote...)
		for _, a := range b.attrs {
			names, drvs, errs = append(names, a.Name), append(drvs, a.DrvPath), append(errs, a.Error)
			unitIDs = append(unitIDs, a.unit)
		}
		units = append(units, b.units...)
	}
	if len(names) == 0 && len(units) == 0 {
		return nil
	}
	preexisting = uniq(preexisting)
	var res queue.EnqueueResult
	var raised bool
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		raised = false
		if err := in.holdClaim(ctx, tx); err != nil {
			return err
		}
		done, err := in.holdUnits(ctx, tx, units, false)
		if err != nil {
			return err
		}
		// Job-need lock before the enqueue lock: evaluation.Rollback takes them in this order too.
		if err := evaluation.LockJobNeed(ctx, tx); err != nil {
			return err
		}
		pid := in.projectID
		res, err = queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &pid, Derivations: derivs, Build: build,
			Order: in.order, DeferRaise: true, Untrusted: !in.trusted,
			RetryLimit: in.retry.Retries, RetryBackoff: in.retry.Backoff})
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlInsertAttrs, in.evalID, names, drvs, errs, unitIDs); err != nil {
			return fmt.Errorf("insert attributes: %w", err)
		}
		n, err := in.need(ctx, tx, preexisting, uniq(promote))
		if err != nil {
			return err
		}
		res.NewJobs += n
		if in.helper && done && in.order == queue.OrderCriticalPath {
			// The claimant finishes the evaluation once every unit is done, without this
			// node's jobs: their chains are raised before the units that found them are done.
			if _, err := queue.RaiseDeferred(ctx, tx, append(slices.Clip(in.enqueued), derivs...), uniq(append(slices.Clip(in.needed), build...))); err != nil {
				return err
			}
			raised = true
		}
		if done {
			// Last: under per-role logins, what a helper writes is let through only while it
			// walks a unit of the evaluation.
			_, err = in.holdUnits(ctx, tx, units, true)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("ingest %d attributes: %w", len(names), err)
	}
	for _, d := range derivs {
		in.known[d.DrvPath] = true
		delete(in.prepared, d.DrvPath)
	}
	if raised {
		in.enqueued, in.needed = nil, nil
	} else if in.order == queue.OrderCriticalPath {
		in.enqueued = append(in.enqueued, derivs...)
		in.needed = append(in.needed, build...)
	}
	in.stats.Attrs += len(names)
	in.stats.Derivations += len(derivs)
	in.stats.Jobs += res.NewJobs
	in.stats.Commits++
	return nil
}

// need is what the evaluation does, in its ingest transaction, to the jobs it needs that exist
// already, in the closure of the known derivations it met (preexisting): cancelled ones go back
// to pending. A trusted evaluation also makes them trusted and takes the outputs there that
// only pull requests built (quarantined) as built (promotion), or, when its project does not
// promote them, resets their jobs to pending, trusted, to be built again (the readiness
// triggers make their dependents wait); and it promotes promote, the quarantined outputs its
// new derivations share. It returns how many jobs went back to the queue.
func (in *ingester) need(ctx context.Context, tx pgx.Tx, preexisting, promote []string) (int, error) {
	if in.trusted && in.promote && len(promote) > 0 {
		if _, err := tx.Exec(ctx, sqlPromoteOutputs, promote); err != nil {
			return 0, fmt.Errorf("promote quarantined outputs: %w", err)
		}
	}
	if len(preexisting) == 0 {
		return 0, nil
	}
	expired, dependents, err := in.applyRetryPolicy(ctx, tx, preexisting)
	if err != nil {
		return 0, err
	}
	var revived, reset []string
	if err := tx.QueryRow(ctx, sqlNeedJobs, preexisting, in.trusted, in.promote).Scan(&revived, &reset); err != nil {
		return 0, fmt.Errorf("revive and trust the jobs it needs: %w", err)
	}
	// Once cancelled inputs are revived: a dependent reset with an expired failure that still
	// has another failed input can never build, and is dep-failed again.
	if len(dependents) > 0 {
		if _, err := tx.Exec(ctx, sqlRefailDependents, dependents); err != nil {
			return 0, fmt.Errorf("mark dependents of failures dep-failed again: %w", err)
		}
	}
	for _, s := range uniq(slices.Concat(expired, revived, reset)) {
		if err := queue.NotifyJobs(ctx, tx, map[string]string{"system": s}); err != nil {
			return 0, err
		}
	}
	return len(revived) + len(reset), nil
}

// applyRetryPolicy records the evaluation's retry policy on the jobs it needs in the closure
// of preexisting that retry less, and sends the failed ones older than its failure expiry back
// to the queue with their dep-failed dependents. It returns the systems of the jobs reset and
// the ids of the dependents among them. Without a policy or an expiry it does nothing: the
// walk of the closure is the cost of asking for one.
func (in *ingester) applyRetryPolicy(ctx context.Context, tx pgx.Tx, preexisting []string) (systems []string, dependents []int64, err error) {
	if in.retry.Retries == 0 && in.failureExpiry == 0 {
		return nil, nil, nil
	}
	err = tx.QueryRow(ctx, sqlApplyRetryPolicy, preexisting, in.retry.Retries, int64(in.retry.Backoff.Seconds()),
		int64(in.failureExpiry.Seconds())).Scan(&systems, &dependents)
	if err != nil {
		return nil, nil, fmt.Errorf("apply the retry policy and failure expiry: %w", err)
	}
	return systems, dependents, nil
}

// holdClaim locks the evaluation's row for tx (FOR SHARE), errStale unless this attempt still
// runs it: every ingest transaction proves its claim first.
func (in *ingester) holdClaim(ctx context.Context, tx pgx.Tx) error {
	var st status.EvalStatus
	var err error
	if in.helper {
		err = tx.QueryRow(ctx, sqlHoldEval, in.evalID, in.attempt).Scan(&st)
	} else {
		err = tx.QueryRow(ctx, sqlHoldClaim, in.evalID, in.node, in.attempt).Scan(&st)
	}
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && st != status.EvalRunning) {
		return errStale
	}
	return err
}

// holdUnits proves, in tx, that this node still holds the claims of the table units whose
// attributes tx commits (errStale if one was reaped and claimed again), and with markDone marks
// done those walked to the end. It reports whether any was walked to the end.
func (in *ingester) holdUnits(ctx context.Context, tx pgx.Tx, units []Attr, markDone bool) (bool, error) {
	if len(units) == 0 {
		return false, nil
	}
	byID := map[int64]Attr{}
	for _, u := range units {
		if u.unitAttempt != byID[u.unit].unitAttempt && byID[u.unit].unit != 0 {
			return false, errStale // two claims of one unit: the older one is not ours any more
		}
		u.unitDone = u.unitDone || byID[u.unit].unitDone
		byID[u.unit] = u
	}
	var ids []int64
	var attempts []int
	var done []bool
	anyDone := false
	for id, u := range byID {
		ids, attempts, done = append(ids, id), append(attempts, u.unitAttempt), append(done, u.unitDone && markDone)
		anyDone = anyDone || u.unitDone
	}
	rows, err := tx.Query(ctx, sqlHoldUnits, in.node, ids, attempts, done)
	if err != nil {
		return false, fmt.Errorf("hold units: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return false, fmt.Errorf("hold units: %w", err)
	}
	if len(held) != len(ids) {
		return false, errStale
	}
	return anyDone, nil
}

// raiseChains brings the dependent chains of the evaluation's jobs, and of the pending jobs below
// them, up to date once the last batch is committed: each commit left the jobs before it as
// they were (queue.EnqueueParams.DeferRaise). Chains only order ready jobs, so the jobs
// claimed meanwhile lost nothing they needed.
func (in *ingester) raiseChains(ctx context.Context) error {
	if len(in.needed) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, in.pool, func(tx pgx.Tx) error {
		if err := in.holdClaim(ctx, tx); err != nil {
			return err
		}
		_, err := queue.RaiseDeferred(ctx, tx, in.enqueued, uniq(in.needed))
		return err
	})
	if err != nil {
		return fmt.Errorf("ingest: %w", err)
	}
	return nil
}

// closure walks the derivation graph from roots, one database round trip per level: it returns
// the derivations the database lacks (parsed, and their texts) and the known ones it met, whose
// cancelled jobs this evaluation may need again. A known derivation's closure is known too
// (every ingest writes a closure whole), so the walk stops there, and so it does at a
// derivation of a prepared batch, whose closure that batch holds.
func (in *ingester) closure(ctx context.Context, roots []string) (map[string]*nix.Derivation, map[string][]byte, []string, error) {
	fresh := map[string]*nix.Derivation{}
	texts := map[string][]byte{}
	var preexisting []string
	frontier := uniq(roots)
	for len(frontier) > 0 {
		var ask []string
		for _, p := range frontier {
			if in.known[p] {
				preexisting = append(preexisting, p)
			} else if fresh[p] == nil && !in.prepared[p] {
				ask = append(ask, p)
			}
		}
		var found []string
		if len(ask) > 0 {
			rows, err := in.pool.Query(ctx, sqlKnownDerivations, ask)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("look up derivations: %w", err)
			}
			if found, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return nil, nil, nil, fmt.Errorf("look up derivations: %w", err)
			}
		}
		for _, p := range found {
			in.known[p] = true
			preexisting = append(preexisting, p)
		}
		var next []string
		for _, p := range ask {
			if in.known[p] || fresh[p] != nil {
				continue
			}
			text, d, err := in.derivation(p)
			if err != nil {
				return nil, nil, nil, err
			}
			fresh[p], texts[p] = d, text
			for input := range d.InputDrvs {
				if !in.known[input] && fresh[input] == nil && !in.prepared[input] {
					next = append(next, input)
				}
			}
		}
		frontier = uniq(next)
	}
	return fresh, texts, uniq(preexisting), nil
}

// derivation is the .drv p as verify read it, or read now.
func (in *ingester) derivation(p string) ([]byte, *nix.Derivation, error) {
	if c, ok := in.checked[p]; ok && c.drv != nil {
		text, d := c.text, c.drv
		c.text, c.drv = nil, nil // kept no longer than needed: closures can be large
		in.checked[p] = c
		return text, d, nil
	}
	return in.readDerivation(p)
}

// readDerivation reads and parses the .drv file p from the evaluator's store.
func (in *ingester) readDerivation(p string) ([]byte, *nix.Derivation, error) {
	// Validated first, so that p names nothing outside the store (no "..").
	if _, err := nix.ParseStorePath(p); err != nil {
		return nil, nil, fmt.Errorf("read derivation: %w", err)
	}
	root := in.storeRoot
	if root == "" {
		root = "/"
	}
	text, err := os.ReadFile(filepath.Join(root, p))
	if err != nil {
		return nil, nil, fmt.Errorf("read derivation: %w", err)
	}
	d, err := nix.ParseDerivation(text)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", p, err)
	}
	return text, d, nil
}

// drvCheck is the outcome of verifying one derivation: its hash for the derivations above it,
// or why it is refused.
type drvCheck struct {
	hash nix.DrvHash
	err  error
	// text and drv are the .drv read for the check, until closure takes them.
	text []byte
	drv  *nix.Derivation
}

// verify keeps the attributes whose derivation Nix would build as it stands: a valid path of the
// evaluation's store (registered by Nix, which checks a derivation's outputs before it
// registers it) whose declared output paths, and those of every derivation below it, are the
// ones their texts give. A project can write any file into the store directory, and name any
// path as an attribute's drvPath: such an attribute becomes an evaluation error saying why.
func (in *ingester) verify(ctx context.Context, attrs []Attr) ([]Attr, error) {
	var roots []string
	for _, a := range attrs {
		if a.DrvPath != "" {
			roots = append(roots, a.DrvPath)
		}
	}
	if len(roots) == 0 {
		return attrs, nil
	}
	valid, err := in.storeDB.PathInfos(ctx, roots)
	if err != nil {
		return nil, fmt.Errorf("verify derivations: %w", err)
	}
	out := slices.Clone(attrs)
	for i, a := range out {
		if a.DrvPath == "" {
			continue
		}
		if _, ok := valid[a.DrvPath]; !ok {
			out[i].DrvPath, out[i].Error = "", fmt.Sprintf("derivation %s is not a valid path of the store: Nix did not register it (a file the project wrote into the store directory?)", a.DrvPath)
		} else if _, err := in.drvHash(a.DrvPath); err != nil {
			out[i].DrvPath, out[i].Error = "", fmt.Sprintf("derivation %s refused: %v", a.DrvPath, err)
		}
	}
	return out, nil
}

// drvHash verifies the derivation p and those below it (see verify) and returns its hash for
// the derivations that use it, once per evaluation.
func (in *ingester) drvHash(p string) (nix.DrvHash, error) {
	if c, ok := in.checked[p]; ok {
		return c.hash, c.err
	}
	text, d, err := in.readDerivation(p)
	c := drvCheck{text: text, drv: d}
	switch {
	case err != nil:
		c.err = err
	case !bytes.Equal(d.Unparse(), text):
		c.err = fmt.Errorf("%s is not in the form Nix writes a derivation", p)
	default:
		if c.err = d.CheckOutputs(p, in.drvHash); c.err == nil {
			c.hash, c.err = d.Hash(p, in.drvHash)
		}
	}
	in.checked[p] = c
	return c.hash, c.err
}

// needBuild decides which new derivations get a job: a derivation needs one unless all its
// outputs are in the cache or upstream, and only if an attribute needs it (itself, or through
// a dependent that is built): the inputs of something already cached are never built.
//
// A trusted evaluation takes a quarantined output as cached only if its project promotes them,
// and then returns it among promote, for the commit to clear its quarantine.
func (in *ingester) needBuild(ctx context.Context, roots []string, fresh map[string]*nix.Derivation) (build, promote []string, err error) {
	var outs []string
	for _, d := range fresh {
		for _, o := range d.Outputs {
			if o.Path != "" {
				outs = append(outs, o.Path)
			}
		}
	}
	have, promote, err := in.cachedOutputs(ctx, outs)
	if err != nil {
		return nil, nil, err
	}
	cached := func(d *nix.Derivation) bool {
		for _, o := range d.Outputs {
			if o.Path == "" || !have[o.Path] {
				return false
			}
		}
		return len(d.Outputs) > 0
	}
	need := map[string]bool{}
	var stack []string
	for _, r := range uniq(roots) {
		if d := fresh[r]; d != nil && !cached(d) && !need[r] {
			need[r] = true
			stack = append(stack, r)
		}
	}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for input := range fresh[p].InputDrvs {
			if d := fresh[input]; d != nil && !need[input] && !cached(d) {
				need[input] = true
				stack = append(stack, input)
			}
		}
	}
	build = slices.Sorted(maps.Keys(need))
	if build == nil {
		build = []string{}
	}
	return build, promote, nil
}

// cachedOutputs returns the output paths the cache holds, by the signer's record in the
// database, by asking the cache, or signed by a trusted upstream substituter. A quarantined
// output (built only for pull requests) counts for a pull request's evaluation; for a trusted
// one only if the project promotes them (returned in promote), and otherwise it is not asked
// of the cache either, which holds its narinfo.
func (in *ingester) cachedOutputs(ctx context.Context, outs []string) (have map[string]bool, promote []string, err error) {
	have = map[string]bool{}
	if len(outs) == 0 {
		return have, nil, nil
	}
	rows, err := in.pool.Query(ctx, sqlCachedOutputs, outs)
	if err != nil {
		return nil, nil, fmt.Errorf("look up cached outputs: %w", err)
	}
	var p string
	var quarantined bool
	rebuild := map[string]bool{}
	_, err = pgx.ForEachRow(rows, []any{&p, &quarantined}, func() error {
		switch {
		case !quarantined || !in.trusted:
			have[p] = true
		case in.promote:
			have[p] = true
			promote = append(promote, p)
		default:
			rebuild[p] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("look up cached outputs: %w", err)
	}
	rest := missing(missing(outs, have), rebuild)
	if in.cache != nil && len(rest) > 0 {
		for chunk := range slices.Chunk(rest, 1000) {
			present, err := in.cache.CacheLookup(ctx, chunk)
			if err != nil {
				return nil, nil, fmt.Errorf("ask the cache: %w", err)
			}
			for _, p := range present {
				have[p] = true
			}
		}
		rest = missing(rest, have)
	}
	if in.upstream != nil && len(rest) > 0 {
		present, err := in.upstream.Have(ctx, rest)
		if err != nil {
			return nil, nil, err
		}
		for _, p := range present {
			have[p] = true
		}
	}
	return have, promote, nil
}

// publish uploads the new .drv files and the sources they need, so that a builder on another
// machine can fetch the closure from the cache. The .drv files go inputs first: the signer
// publishes nothing that refers to what the cache does not have yet.
func (in *ingester) publish(ctx context.Context, newDrvs []string, fresh map[string]*nix.Derivation) error {
	if in.publisher == nil {
		return nil
	}
	var sources []upload.Path
	var drvs []string
	// The sources and everything they refer to: a narinfo never points at what the cache lacks.
	var queue []string
	for _, p := range newDrvs {
		queue = append(queue, fresh[p].InputSrcs...)
	}
	for len(queue) > 0 {
		// One store database query per level of references; most evaluations have a few
		// sources shared by every derivation.
		var ask []string
		for _, src := range uniq(queue) {
			if !in.published[src] {
				ask = append(ask, src)
			}
		}
		queue = nil
		if len(ask) == 0 {
			break
		}
		infos, err := in.storeDB.PathInfos(ctx, ask)
		if err != nil {
			return fmt.Errorf("read store database: %w", err)
		}
		for _, src := range ask {
			info, ok := infos[src]
			if !ok {
				return fmt.Errorf("source %s is not valid in the evaluator's store", src)
			}
			in.published[src] = true
			sources = append(sources, upload.Path{StorePath: src, References: info.References})
			queue = append(queue, info.References...)
		}
	}
	for _, p := range inputsFirst(newDrvs, fresh) {
		if !in.published[p] {
			in.published[p] = true
			drvs = append(drvs, p)
		}
	}
	if len(drvs)+len(sources) == 0 {
		return nil
	}
	claim := signerapi.EvalClaim{ID: in.evalID, Attempt: in.attempt}
	if _, err := in.publisher.PublishEval(ctx, claim, drvs, sources); err != nil {
		for _, p := range drvs {
			delete(in.published, p)
		}
		for _, p := range sources {
			delete(in.published, p.StorePath)
		}
		return fmt.Errorf("publish .drv closure: %w", err)
	}
	in.stats.Published += len(drvs) + len(sources)
	return nil
}

// inputsFirst orders drvs so that each comes after the ones among drvs it depends on.
func inputsFirst(drvs []string, fresh map[string]*nix.Derivation) []string {
	in := map[string]bool{}
	for _, p := range drvs {
		in[p] = true
	}
	done := map[string]bool{}
	out := make([]string, 0, len(drvs))
	var visit func(p string)
	visit = func(p string) {
		if done[p] {
			return
		}
		done[p] = true
		for _, dep := range slices.Sorted(maps.Keys(fresh[p].InputDrvs)) {
			if in[dep] {
				visit(dep)
			}
		}
		out = append(out, p)
	}
	for _, p := range drvs {
		visit(p)
	}
	return out
}

func missing(all []string, have map[string]bool) []string {
	var out []string
	for _, p := range all {
		if !have[p] {
			out = append(out, p)
		}
	}
	return out
}

func uniq(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// drvName is the name part of a .drv path: /nix/store/<hash>-<name>.drv.
func drvName(p string) string {
	sp, err := nix.ParseStorePath(p)
	if err != nil {
		return p
	}
	name := sp.Name
	if len(name) > 4 {
		name = name[:len(name)-4]
	}
	return name
}
