package signer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/publication"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// jobFacts is what the database says about a claimed job's derivation.
type jobFacts struct {
	claim       queue.Claim
	drvPath     string
	outputNames []string // sorted
	outputs     []string // its output paths, by outputNames; "" for a floating content-addressed output
	inputs      []string // its input derivations' selected outputs and its input sources
	// drvText is the .drv the signer stored when the evaluation published it (nil if none), and
	// inputHashes the hashes it recorded for the input derivations the database lists.
	drvText     []byte
	inputHashes map[string][32]byte
	fit         claimFit
	// trusted: a trusted evaluation needs the job, so its outputs are not quarantined;
	// quarantined are its output paths whose every built row is (a pull request built them).
	trusted     bool
	quarantined []string
}

func (f jobFacts) drvBase() string { return path.Base(f.drvPath) }

// logKey is the job's latest log, which every claim of it may write; attemptLogKey is the
// claim's own, the only other log key it may write.
func (f jobFacts) logKey() string { return queue.LogKey(f.drvPath) }

func (f jobFacts) attemptLogKey() string { return queue.AttemptLogKey(f.drvPath, f.claim.Attempt) }

// mayWriteLog reports whether key is one of the logs the job's claim may write.
func (f jobFacts) mayWriteLog(key string) bool { return key == f.logKey() || key == f.attemptLogKey() }

func staleClaim(c queue.Claim) error {
	return httpapi.Errorf(http.StatusConflict, "job %d is not in building/uploading for node %s attempt %d", c.JobID, c.NodeID, c.Attempt)
}

// jobFacts answers 409 unless node id holds claim on a job that is building or uploading.
func (s *Server) jobFacts(ctx context.Context, id nodetoken.Identity, claim signerapi.JobClaim) (jobFacts, error) {
	var f jobFacts
	b := &pgx.Batch{}
	queueJobFacts(b, id, claim, &f)
	err := s.pool.SendBatch(ctx, b).Close()
	return f, checkJobFacts(f, err)
}

// queueJobFacts queues the query of jobFacts; checkJobFacts tells what its answer means.
func queueJobFacts(b *pgx.Batch, id nodetoken.Identity, claim signerapi.JobClaim, f *jobFacts) {
	f.claim = queue.Claim{JobID: claim.ID, NodeID: id.NodeID, Attempt: claim.Attempt}
	b.Queue(sqlJobFacts, claim.ID, id.NodeID, claim.Attempt).QueryRow(func(row pgx.Row) error {
		var inDrvs []string
		var inHashes [][]byte
		if err := row.Scan(&f.drvPath, &f.outputNames, &f.outputs, &f.inputs, &f.drvText, &inDrvs, &inHashes,
			&f.trusted, &f.quarantined); err != nil {
			return err
		}
		f.inputHashes = make(map[string][32]byte, len(inDrvs))
		for i, in := range inDrvs {
			if i < len(inHashes) && len(inHashes[i]) == 32 {
				f.inputHashes[in] = [32]byte(inHashes[i])
			}
		}
		return nil
	})
	queueClaimFit(b, f)
}

func checkJobFacts(f jobFacts, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return staleClaim(f.claim)
	}
	if err != nil {
		return internal("checking the claim failed", err)
	}
	if err := checkClaimFit(f); err != nil {
		return err
	}
	if slices.Contains(f.outputs, "") {
		return badRequest("%s has content-addressed outputs, which are not supported", f.drvPath)
	}
	return nil
}

// checkDerivation answers 400 unless the outputs the database lists for the job's derivation
// are the ones Nix gives it, recomputed from the .drv the signer stored when the evaluation
// published it and from its inputs' hashes: the rows are the evaluator's word, and a login that
// can write them (or a .drv stored before the signer checked them) must not get another
// derivation's output path signed. drvs reads the hashes the query did not bring.
func checkDerivation(ctx context.Context, drvs *blob.Derivations, f jobFacts) error {
	if f.drvText == nil {
		return badRequest("the cache has no .drv for %s, so its outputs cannot be checked: refusing to sign them (an evaluation publishes a .drv before it enqueues its job)", f.drvPath)
	}
	d, err := nix.ParseDerivation(f.drvText)
	if err != nil {
		return internal("reading the stored .drv failed", fmt.Errorf("%s: %w", f.drvPath, err))
	}
	name, err := nix.DrvName(f.drvPath)
	if err != nil {
		return badRequest("%v", err)
	}
	hashes := make(map[string]nix.DrvHash, len(d.InputDrvs))
	var missing []string
	for in, outs := range d.InputDrvs {
		// The output names an input has were checked when the .drv was published; its hash is
		// what gives the outputs.
		if sum, ok := f.inputHashes[in]; ok {
			hashes[in] = nix.DrvHash{Sum: sum, Outputs: slices.Sorted(slices.Values(outs))}
		} else {
			missing = append(missing, in)
		}
	}
	if len(missing) > 0 {
		more, err := drvs.Hashes(ctx, missing)
		if errors.Is(err, nix.ErrWrongOutputs) {
			return badRequest("an input of %s: %v", f.drvPath, err)
		}
		if err != nil {
			return unavailable("reading the input derivations' hashes failed", err)
		}
		maps.Copy(hashes, more)
	}
	want, err := d.OutputPaths(name, func(p string) (nix.DrvHash, error) {
		if h, ok := hashes[p]; ok {
			return h, nil
		}
		return nix.DrvHash{}, fmt.Errorf("the cache has no .drv for its input %s", p)
	})
	if err != nil {
		return badRequest("checking the outputs of %s: %v", f.drvPath, err)
	}
	same := len(want) == len(f.outputNames)
	for i, o := range f.outputNames {
		same = same && want[o] == f.outputs[i]
	}
	if !same {
		listed := make([]string, len(f.outputNames))
		for i, o := range f.outputNames {
			listed[i] = o + "=" + f.outputs[i]
		}
		given := make([]string, 0, len(want))
		for _, o := range slices.Sorted(maps.Keys(want)) {
			given = append(given, o+"="+want[o])
		}
		return badRequest("the outputs the database lists for %s (%s) are not the ones its text gives (%s): refusing to sign them",
			f.drvPath, strings.Join(listed, " "), strings.Join(given, " "))
	}
	return nil
}

// checkJobOutputs answers 400 unless every output is one of the job's derivation's outputs
// (and, for a completion, all of them are there), with that derivation as deriver.
func checkJobOutputs(f jobFacts, outs []output, complete bool) error {
	for i := range outs {
		o := &outs[i]
		if !slices.Contains(f.outputs, o.path.String()) {
			return badRequest("outputs[%d]: %s is not an output of %s", i, o.path, f.drvPath)
		}
		if o.deriver != "" && o.deriver != f.drvBase() {
			return badRequest("outputs[%d].deriver: %s, but the job builds %s", i, o.deriver, f.drvPath)
		}
		o.deriver = f.drvBase()
	}
	if complete && len(outs) != len(f.outputs) {
		for _, p := range f.outputs {
			if !slices.ContainsFunc(outs, func(o output) bool { return o.path.String() == p }) {
				return badRequest("outputs: %s, an output of %s, is missing", p, f.drvPath)
			}
		}
	}
	return nil
}

func (s *Server) handleUploadSlots(ctx context.Context, id nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.UploadSlotsRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	outs, err := parseOutputs("outputs", req.Outputs)
	if err != nil {
		return nil, err
	}
	var resp signerapi.UploadSlotsResponse
	switch {
	case req.Job != nil && req.Eval == nil:
		if !id.Has(config.RoleBuilder) {
			return nil, forbidden(id, config.RoleBuilder)
		}
		f, err := s.jobFacts(ctx, id, *req.Job)
		if err != nil {
			return nil, err
		}
		if len(outs) > 0 {
			if err := checkDerivation(ctx, s.drvs, f); err != nil {
				return nil, err
			}
		}
		if err := checkJobOutputs(f, outs, false); err != nil {
			return nil, err
		}
		if len(outs) == 0 && req.Log == nil {
			return nil, badRequest("outputs: nothing to upload")
		}
		if req.Log != nil {
			if resp.Log, err = s.logSlot(ctx, f, *req.Log); err != nil {
				return nil, err
			}
		}
	case req.Eval != nil && req.Job == nil:
		if !id.Has(config.RoleEvaluator) {
			return nil, forbidden(id, config.RoleEvaluator)
		}
		if err := s.checkEvalClaim(ctx, id, *req.Eval); err != nil {
			return nil, err
		}
		if req.Log != nil {
			return nil, badRequest("log: only a build uploads a log")
		}
		if len(outs) == 0 {
			return nil, badRequest("outputs: nothing to upload")
		}
	default:
		return nil, badRequest("exactly one of job and eval is required")
	}
	if resp.Outputs, err = s.slots(ctx, outs); err != nil {
		return nil, err
	}
	return resp, nil
}

// logSlot presigns the upload of the job's log, at the one key its claim may write.
func (s *Server) logSlot(ctx context.Context, f jobFacts, l signerapi.LogUpload) (*signerapi.Upload, error) {
	if !f.mayWriteLog(l.Key) {
		return nil, badRequest("log.key: %q, but the job's logs are %s and %s", l.Key, f.logKey(), f.attemptLogKey())
	}
	if l.Size < 0 {
		return nil, badRequest("log.size: must not be negative, got %d", l.Size)
	}
	sum, err := hex.DecodeString(l.SHA256)
	if err != nil || len(sum) != sha256.Size {
		return nil, badRequest("log.sha256: want 64 hex characters")
	}
	u, err := s.presign(ctx, l.Key, l.Size, sum)
	if err == nil {
		s.metrics.logGranted(l.Size)
	}
	return u, err
}

func (s *Server) handleBuildComplete(ctx context.Context, id nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.BuildCompleteRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	outs, err := parseOutputs("outputs", req.Outputs)
	if err != nil {
		return nil, err
	}
	if len(outs) == 0 {
		return nil, badRequest("outputs: at least one output is required")
	}
	// From the checks that trust what the cache holds (references, uploads) to the narinfos and
	// hashes that make it live, the garbage collector's sweep waits. The claim is read in the
	// same round trip, and everything the handler asks of the database runs on the lock's
	// connection (see publication.Lock).
	var f jobFacts
	b := &pgx.Batch{}
	queueJobFacts(b, id, req.Job, &f)
	pub, err := publication.HoldWith(ctx, s.pool, b)
	if errors.Is(err, publication.ErrLock) {
		return nil, unavailable("database unavailable", err)
	}
	if err != nil {
		return nil, checkJobFacts(f, err)
	}
	// Released once everything is committed, without making the builder wait for the unlock.
	defer func() { go pub.Release() }()
	if err := checkJobFacts(f, nil); err != nil {
		return nil, err
	}
	if err := checkDerivation(ctx, blob.NewDerivations(pub.Conn()), f); err != nil {
		return nil, err
	}
	if err := checkJobOutputs(f, outs, true); err != nil {
		return nil, err
	}
	if req.LogKey != "" && !f.mayWriteLog(req.LogKey) {
		return nil, badRequest("log_key: %q, but the job's logs are %s and %s", req.LogKey, f.logKey(), f.attemptLogKey())
	}
	ref, err := s.unservedReference(ctx, blob.NewDerivations(pub.Conn()), outs, f.inputs)
	if err != nil {
		return nil, err
	}
	if ref != "" {
		return nil, badRequest("references: %s is neither an output of %s nor in the closure of its inputs that the cache serves", ref, f.drvPath)
	}

	// Everything is checked before anything is written.
	if err := s.checkUploaded(ctx, "outputs", outs); err != nil {
		return nil, err
	}
	if req.LogKey != "" {
		have, err := s.head(ctx, req.LogKey, -1)
		if err != nil {
			return nil, err
		}
		if !have {
			return nil, badRequest("log_key: %s not uploaded", req.LogKey)
		}
	}
	// The uploads become durable before any narinfo refers to them, and the narinfos before
	// the build is recorded (stores that buffer writes; see blob.Syncer).
	keys := make([]string, 0, len(outs)+1)
	for _, o := range outs {
		keys = append(keys, o.narKey)
	}
	if req.LogKey != "" {
		keys = append(keys, req.LogKey)
	}
	if err := s.syncObjects(ctx, keys); err != nil {
		return nil, err
	}
	// A trusted build replaces what only pull requests built, should the two differ.
	var replace map[string]bool
	if f.trusted {
		replace = map[string]bool{}
		for _, p := range f.quarantined {
			replace[p] = true
		}
	}
	canon, resp, err := s.publishAll(ctx, outs, replace, !f.trusted)
	if err != nil {
		return nil, err
	}
	flaky, err := succeed(ctx, pub.Conn(), f, req.LogKey, canon)
	if err != nil {
		return nil, err
	}
	if flaky {
		s.metrics.flakySucceeded()
	}
	if s.cfg.Announcer != nil {
		s.cfg.Announcer.Finished(f.drvPath, status.JobSucceeded)
	}
	s.logger.Info("build succeeded", "job", f.claim.JobID, "node", f.claim.NodeID, "attempt", f.claim.Attempt,
		"drv", f.drvPath, "written", resp.Written, "skipped", resp.Skipped, "conflicts", resp.Conflicts, "flaky", flaky)
	return resp, nil
}

// succeed records the outputs' canonical hashes on the job's derivation's rows, marks the job
// succeeded and records its log, in one round trip (a batch is one implicit transaction). A
// stale claim records nothing of the job; the hashes are those of narinfos already written, so
// they stand either way. It returns whether the job is flaky (it failed before).
func succeed(ctx context.Context, conn *pgx.Conn, f jobFacts, logKey string, canon []canonical) (bool, error) {
	c := f.claim
	b := &pgx.Batch{}
	queueRecordHashes(b, f.drvPath, canon, f.trusted)
	var out queue.Outcome
	queue.QueueSucceed(b, c, logKey, &out)
	err := conn.SendBatch(ctx, b).Close()
	if errors.Is(err, queue.ErrStale) {
		return false, staleClaim(c)
	}
	if err != nil {
		return false, internal("marking the job succeeded failed", err)
	}
	return out.Flaky, nil
}

// checkEvalClaim answers 409 unless node id holds claim on a running evaluation.
func (s *Server) checkEvalClaim(ctx context.Context, id nodetoken.Identity, claim signerapi.EvalClaim) error {
	var ok bool
	if err := s.pool.QueryRow(ctx, sqlCheckEvalClaim, claim.ID, id.NodeID, claim.Attempt).Scan(&ok); err != nil {
		return internal("checking the claim failed", err)
	}
	if !ok {
		return httpapi.Errorf(http.StatusConflict, "evaluation %d is not running for node %s attempt %d", claim.ID, id.NodeID, claim.Attempt)
	}
	return nil
}
