package builder

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/substitute"
	"github.com/harmonia-ci/harmonia-ci/internal/workerproto"
)

// Session is one connection to the store's Nix daemon, a `nix-daemon --stdio` child or a
// connection to an existing daemon's socket: a build slot's, reused from job to job and
// replaced after an error. Everything a job does in the store goes through it (validity, path
// infos, adding fetched NARs, the build, reading outputs back), so no Nix process starts per
// job. A Session runs one operation at a time.
//
// A daemon that trusts the builder (its own child, or a socket whose daemon lists the builder's
// user in trusted-users) builds the derivation the builder sends, with the builder's settings.
// One that does not builds only derivations in its store, with its own settings: the session
// then adds the .drv closure from the cache first, and the daemon checks every input's
// signature against its own trusted-public-keys, which must hold the cluster's key.
type Session struct {
	store   *Store
	conn    *workerproto.Conn
	home    string
	keys    string // the trusted keys the daemon was started with
	trusted bool   // the daemon builds derivations the builder sends
}

// MinNixVersion and minProtocol are the oldest Nix a builder builds with, and its worker
// protocol: the oldest tested (Debian 12's), whose protocol has every operation used here.
const (
	MinNixVersion = "2.8"
	minProtocol   = 34
)

// ErrNixTooOld is returned by Store.Open for a daemon older than MinNixVersion.
var ErrNixTooOld = errors.New("nix-daemon too old")

const (
	// smallNAR is the largest NAR a substitution fetches ahead into memory, while earlier paths
	// are added; bigger ones stream from the cache into the daemon in turn.
	smallNAR = 4 << 20
	// prefetch bounds the NARs fetched at once.
	prefetch = 8
	// maxDrvSize bounds a .drv file fetched from a cache.
	maxDrvSize = 64 << 20
)

// Open starts a daemon for the store with the builder's settings: Nix's sandbox (and in the
// system store its build users), nothing substituted or built remotely by the daemon itself
// (the builder fetches inputs), signatures required by the store's trusted keys, and no
// cached validity (another session or the store's GC may delete a path at any time). With
// Daemon set it connects to that daemon instead. A daemon older than MinNixVersion is refused
// (ErrNixTooOld).
func (s *Store) Open(ctx context.Context) (*Session, error) {
	home, err := os.MkdirTemp("", "harmonia-build-home-")
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", s.where(), err)
	}
	keys := strings.Join(s.TrustedKeys, " ")
	opts := map[string]string{
		"substituters":               "",
		"builders":                   "",
		"trusted-public-keys":        keys,
		"require-sigs":               "true",
		"narinfo-cache-positive-ttl": "0",
		"narinfo-cache-negative-ttl": "0",
		"keep-going":                 "false",
		"sandbox":                    strconv.FormatBool(!s.Unsandboxed),
		"sandbox-paths":              strings.Join(nix.SandboxPaths(s.SandboxPaths), " "),
		"build-users-group":          "",
		"auto-optimise-store":        "false",
		"min-free":                   "0",
		"keep-build-log":             "false",
		"max-silent-time":            "0",
		"timeout":                    "0",
		"max-build-log-size":         "0",
	}
	if s.Root == "" && s.BuildUsersGroup != "" {
		opts["build-users-group"] = s.BuildUsersGroup
	}
	var conn *workerproto.Conn
	var overrides map[string]string
	if s.Daemon != "" {
		conn, err = workerproto.Dial(ctx, s.Daemon)
		if err == nil && conn.Trust == workerproto.Trusted {
			// Its settings hold but for what the builder does itself: fetching inputs, which
			// it checks against the cluster's keys, and the limits it enforces.
			overrides = map[string]string{"substituters": "", "builders": "", "trusted-public-keys": keys,
				"require-sigs": "true", "max-silent-time": "0", "timeout": "0", "max-build-log-size": "0"}
		}
	} else {
		conn, err = workerproto.Start(ctx, workerproto.StartOptions{
			Store: s.Root, Options: opts, Env: s.childEnv(home), Dir: home, KillGrace: s.killGrace, Nice: s.Nice,
			Cgroup: s.Cgroup,
		})
	}
	if err != nil {
		os.RemoveAll(home)
		return nil, fmt.Errorf("open store %s: %w", s.where(), err)
	}
	// Its own child trusts the builder even when too old to say so.
	ss := &Session{store: s, conn: conn, home: home, keys: keys, trusted: s.Daemon == "" || conn.Trust == workerproto.Trusted}
	if conn.Minor < minProtocol {
		ss.Close()
		return nil, fmt.Errorf("open store %s: %w: it is %s (protocol 1.%d); harmonia-ci builds with Nix %s (protocol 1.%d) or later",
			s.where(), ErrNixTooOld, cmp.Or(conn.DaemonVersion, "older than 2.4"), conn.Minor, MinNixVersion, minProtocol)
	}
	if s.onStart != nil {
		s.onStart(conn.Pid())
	}
	// Never substituting: the builder fetches and checks inputs itself.
	if err := conn.SetOptions(ctx, workerproto.Options{MaxBuildJobs: 1, Overrides: overrides}); err != nil {
		ss.Close()
		return nil, fmt.Errorf("open store %s: %w", s.where(), err)
	}
	return ss, nil
}

// Daemon is what the session's daemon said of itself: its Nix version, the protocol version
// both speak, and whether it builds derivations the builder sends.
func (ss *Session) Daemon() (version string, protocol uint64, trusted bool) {
	return ss.conn.DaemonVersion, ss.conn.Minor, ss.trusted
}

// Close ends the session: a build still running is killed by its daemon. Idempotent.
func (ss *Session) Close() {
	ss.conn.Close()
	os.RemoveAll(ss.home)
}

// Broken reports whether the session can no longer be used.
func (ss *Session) Broken() bool { return ss.conn.Broken() }

// Trusts reports whether the session's daemon trusts exactly keys (a daemon reads its keys
// once: another set needs another session).
func (ss *Session) Trusts(keys []string) bool { return ss.keys == strings.Join(keys, " ") }

// PathInfos returns the infos of the valid paths among paths.
func (ss *Session) PathInfos(ctx context.Context, paths []string) (map[string]nix.PathInfo, error) {
	valid, err := ss.conn.QueryValidPaths(ctx, paths)
	if err != nil {
		return nil, fmt.Errorf("path infos: %w", err)
	}
	infos := make(map[string]nix.PathInfo, len(valid))
	for _, p := range valid {
		info, ok, err := ss.conn.QueryPathInfo(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("path info of %s: %w", p, err)
		}
		if ok {
			infos[p] = nix.PathInfo{Path: p, NarHash: info.NarHash, NarSize: int64(info.NarSize),
				References: slices.Sorted(slices.Values(info.References)), Deriver: info.Deriver}
		}
	}
	return infos, nil
}

// fetcher fetches from the store's substituters, trusting its keys.
func (ss *Session) fetcher() (*substitute.Fetcher, error) {
	keys := make([]nix.PublicKey, 0, len(ss.store.TrustedKeys))
	for _, k := range ss.store.TrustedKeys {
		pk, err := nix.ParsePublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("trusted key %q: %w", k, err)
		}
		keys = append(keys, pk)
	}
	return &substitute.Fetcher{Caches: ss.store.Substituters, Keys: keys, HTTP: ss.store.HTTP}, nil
}

// Derivation returns drvPath's derivation: from the store if it is there, else fetched from the
// first substituter that has it signed. The .drv is not added to the store: the build gets
// the derivation over the connection, so the .drv closure is never needed.
func (ss *Session) Derivation(ctx context.Context, drvPath string) (*nix.Derivation, error) {
	if _, err := nix.ParseStorePath(drvPath); err != nil || !strings.HasSuffix(drvPath, ".drv") {
		return nil, fmt.Errorf("fetch derivation: %q is not a .drv store path", drvPath)
	}
	if d, err := nix.ReadDerivation(ss.store.Root, drvPath); err == nil {
		return d, nil
	}
	f, err := ss.fetcher()
	if err != nil {
		return nil, fmt.Errorf("fetch derivation %s: %w", drvPath, err)
	}
	found, err := f.Lookup(ctx, drvPath)
	if err != nil {
		if errors.Is(err, substitute.ErrNotFound) {
			return nil, fmt.Errorf("fetch derivation %s: %w: %w", drvPath, ErrInputUnavailable, err)
		}
		return nil, fmt.Errorf("fetch derivation %s: %w", drvPath, err)
	}
	text, err := f.ReadFile(ctx, found, maxDrvSize)
	if err != nil {
		return nil, fmt.Errorf("fetch derivation %s: %w", drvPath, err)
	}
	// The signature covers the NAR; the path must also be the one the text hashes to.
	name := drvPath[strings.IndexByte(drvPath, '-')+1:]
	p, d, err := nix.DerivationPath(name, text)
	switch {
	case err != nil:
		return nil, fmt.Errorf("fetch derivation %s: the cache's text does not parse: %w", drvPath, err)
	case p != drvPath:
		return nil, fmt.Errorf("fetch derivation %s: the cache's text is another derivation's (it hashes to %s)", drvPath, p)
	}
	return d, nil
}

// InputPaths returns the store paths a build of drv needs, sorted: its input sources and the
// selected outputs of its input derivations. outputs maps input .drv paths to their outputs
// (name → path), as the database records them; an input it lacks is read from its .drv.
func (ss *Session) InputPaths(ctx context.Context, drvPath string, drv *nix.Derivation, outputs map[string]map[string]string) ([]string, error) {
	paths := slices.Clone(drv.InputSrcs)
	for inDrv, names := range drv.InputDrvs {
		outs := outputs[inDrv]
		if outs == nil {
			in, err := ss.Derivation(ctx, inDrv)
			if err != nil {
				return nil, fmt.Errorf("input paths of %s: %w", drvPath, err)
			}
			outs = map[string]string{}
			for name, o := range in.Outputs {
				outs[name] = o.Path
			}
		}
		for _, name := range names {
			p, ok := outs[name]
			switch {
			case !ok:
				return nil, fmt.Errorf("input paths of %s: %s has no output %q", drvPath, inDrv, name)
			case p == "":
				return nil, fmt.Errorf("input paths of %s: output %q of %s is content-addressed, which is not supported", drvPath, name, inDrv)
			}
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths), nil
}

// EnsureInputs makes every path valid locally and canonical: a build never uses an input that
// differs from what the cache serves. A present path whose NAR hash differs from the canonical
// one is a Frankenbuild: it is logged, deleted with its referrers (Nix deletes nothing still
// referenced) and substituted again. Missing paths and their missing references are fetched
// from the substituters over HTTP, several at once, checked (signature, NAR hash and size, the
// canonical hash) and added through the daemon, which checks them again; nothing is ever
// built, so a path no substituter has is an error wrapping ErrInputUnavailable. canonical may
// be nil.
func (ss *Session) EnsureInputs(ctx context.Context, paths []string, canonical Canonical, logger *slog.Logger) (mismatches []string, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	paths = slices.Compact(slices.Sorted(slices.Values(paths)))
	want := map[string]string{}
	if canonical != nil && len(paths) > 0 {
		// All paths, not just present ones: substituted paths are checked too.
		if want, err = canonical(ctx, paths); err != nil {
			return nil, fmt.Errorf("ensure inputs: canonical hashes: %w", err)
		}
	}
	// Only paths with a canonical hash need their info: the others are only checked for validity.
	var checked []string
	for _, p := range paths {
		if want[p] != "" {
			checked = append(checked, p)
		}
	}
	local, err := ss.PathInfos(ctx, checked)
	if err != nil {
		return nil, fmt.Errorf("ensure inputs: %w", err)
	}
	for _, p := range checked {
		if info, ok := local[p]; ok && want[p] != info.NarHash {
			logger.Warn("input differs from the binary cache (non-reproducible build?): deleting and substituting it",
				"path", p, "local_nar_hash", info.NarHash, "canonical_nar_hash", want[p])
			mismatches = append(mismatches, p)
		}
	}
	if len(mismatches) > 0 {
		if err := ss.deleteWithReferrers(ctx, mismatches); err != nil {
			return mismatches, fmt.Errorf("ensure inputs: %w", err)
		}
	}
	f, err := ss.fetcher()
	if err != nil {
		return mismatches, fmt.Errorf("ensure inputs: %w", err)
	}
	have := func(ctx context.Context, ps []string) ([]string, error) { return ss.conn.QueryValidPaths(ctx, ps) }
	todo, err := f.Closure(ctx, paths, have)
	if err != nil {
		if errors.Is(err, substitute.ErrNotFound) {
			return mismatches, fmt.Errorf("ensure inputs: %w: %w", ErrInputUnavailable, err)
		}
		return mismatches, fmt.Errorf("ensure inputs: %w", err)
	}
	for _, found := range todo {
		if h := want[found.Info.StorePath]; h != "" && h != found.Info.NarHash {
			return mismatches, fmt.Errorf("ensure inputs: %s: %s serves NAR hash %s, not the canonical %s",
				found.Info.StorePath, found.Cache, found.Info.NarHash, h)
		}
	}
	if err := ss.add(ctx, f, todo); err != nil {
		return mismatches, fmt.Errorf("ensure inputs: %w", err)
	}
	return mismatches, nil
}

// add adds the found paths to the store, in their order (references first): small NARs are
// fetched ahead, several at once, while earlier ones are added.
func (ss *Session) add(ctx context.Context, f *substitute.Fetcher, todo []*substitute.Found) error {
	if len(todo) == 0 {
		return nil
	}
	ahead := make([]*fetched, len(todo))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(prefetch)
	for i, found := range todo {
		if found.Info.NarSize > smallNAR {
			continue
		}
		ahead[i] = &fetched{done: make(chan struct{})}
	}
	fetchCtx, stop := context.WithCancel(gctx)
	launched := make(chan struct{})
	go func() {
		defer close(launched)
		for i, found := range todo {
			a := ahead[i]
			if a == nil {
				continue
			}
			if fetchCtx.Err() != nil {
				a.err = context.Cause(fetchCtx)
				close(a.done)
				continue
			}
			g.Go(func() error {
				defer close(a.done)
				r, err := f.OpenNAR(fetchCtx, found)
				if err != nil {
					a.err = err
					return nil
				}
				defer r.Close()
				a.nar, a.err = io.ReadAll(io.LimitReader(r, smallNAR+1))
				return nil
			})
		}
	}()
	defer func() {
		stop()
		<-launched
		_ = g.Wait()
	}()
	for i, found := range todo {
		if err := ss.addOne(ctx, f, found, ahead[i]); err != nil {
			return err
		}
	}
	return nil
}

// fetched is a NAR fetched ahead, once done is closed.
type fetched struct {
	nar  []byte
	err  error
	done chan struct{}
}

// addOne adds one found path: from its NAR fetched ahead, or streamed from the cache now.
func (ss *Session) addOne(ctx context.Context, f *substitute.Fetcher, found *substitute.Found, ahead *fetched) error {
	var nar io.Reader
	if ahead != nil {
		select {
		case <-ahead.done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		if ahead.err != nil {
			return fmt.Errorf("fetch %s from %s: %w", found.Info.StorePath, found.Cache, ahead.err)
		}
		nar = bytes.NewReader(ahead.nar)
	} else {
		r, err := f.OpenNAR(ctx, found)
		if err != nil {
			return fmt.Errorf("fetch %s from %s: %w", found.Info.StorePath, found.Cache, err)
		}
		defer r.Close()
		nar = r
	}
	if err := ss.conn.AddToStoreNar(ctx, pathInfo(found), nar, true); err != nil {
		var de *workerproto.Error
		if !ss.trusted && errors.As(err, &de) && strings.Contains(de.Message, "signature") {
			// Nix 2.8: "lacks a valid signature"; 2.26: "lacks a signature by a trusted key".
			return fmt.Errorf("add %s from %s: %w; the nix-daemon at %s does not trust this builder (or, older than Nix 2.15, does not say it does), so it takes only paths signed by a key of its own trusted-public-keys: add the cluster's key (%s) there, or this builder's user to its trusted-users",
				found.Info.StorePath, found.Cache, err, ss.store.Daemon, strings.Join(ss.store.TrustedKeys, " "))
		}
		return fmt.Errorf("add %s from %s: %w", found.Info.StorePath, found.Cache, err)
	}
	return nil
}

// pathInfo is what AddToStoreNar needs of a narinfo.
func pathInfo(found *substitute.Found) workerproto.PathInfo {
	ni := found.Info
	info := workerproto.PathInfo{Path: ni.StorePath, NarHash: ni.NarHash, NarSize: uint64(ni.NarSize), Sigs: ni.Sigs, CA: ni.CA}
	if ni.Deriver != "" {
		info.Deriver = nix.StoreDir + "/" + ni.Deriver
	}
	for _, r := range ni.References {
		info.References = append(info.References, nix.StoreDir+"/"+r)
	}
	return info
}

// Discard deletes those of paths the store holds, with every local path referring to them,
// even if rooted: a trusted rebuild of outputs only a pull request built must not find them
// valid, nor keep anything built against them.
func (ss *Session) Discard(ctx context.Context, paths []string, logger *slog.Logger) error {
	if len(paths) == 0 {
		return nil
	}
	valid, err := ss.conn.QueryValidPaths(ctx, paths)
	if err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	if len(valid) == 0 {
		return nil
	}
	if logger != nil {
		logger.Info("building again outputs only a pull request built: deleting the store's copy", "paths", valid)
	}
	if err := ss.deleteWithReferrers(ctx, valid); err != nil {
		return fmt.Errorf("discard: %w", err)
	}
	return nil
}

// deleteWithReferrers deletes paths and every local path referring to them, even if rooted:
// anything built against a Frankenbuild is suspect too. The daemon refuses to ignore roots, so
// this rare step is a Nix process, between this connection and a fresh one.
func (ss *Session) deleteWithReferrers(ctx context.Context, paths []string) error {
	return ss.reopenAround(ctx, func() error { return ss.store.deleteWithReferrers(ctx, paths) })
}

// reopenAround closes the connection, runs f, and opens a fresh connection: the daemon holds
// temporary roots on everything it built or added, which would keep f from deleting them.
func (ss *Session) reopenAround(ctx context.Context, f func() error) error {
	ss.conn.Close()
	os.RemoveAll(ss.home)
	err := f()
	fresh, oerr := ss.store.Open(ctx)
	if oerr != nil {
		return errors.Join(err, oerr) // the session stays broken; its owner replaces it
	}
	ss.conn, ss.home = fresh.conn, fresh.home
	return err
}

// Build builds drv (stored at drvPath; inputs are its input derivations' outputs, which must be
// valid with its sources) with nothing substituted and no other derivation built, streaming its
// log to log. The limits are enforced here, from the streamed log: Nix's own would end in a
// status that does not say which limit was hit. A limit hit or a cancelled ctx closes the
// connection, and the daemon kills the build. It returns the outputs (name → path), a
// *BuildError, or the context's error when ctx ended first.
func (ss *Session) Build(ctx context.Context, drvPath string, drv *nix.Derivation, inputs []string, limits BuildLimits, log io.Writer) (map[string]string, error) {
	if log == nil {
		log = io.Discard
	}
	outputs, err := ss.checkBuildable(ctx, drvPath, drv, inputs)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
		}
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
	}
	out := &nixOutput{w: log, start: time.Now()}
	l := &workerproto.Logger{
		Line: func(line string) { _, _ = out.Write([]byte(line + "\n")) },
		Activity: func(_, typ uint64, text string, _ []workerproto.Field) {
			if typ == workerproto.ActBuild && text != "" {
				_, _ = out.Write([]byte(text + "\n"))
			}
		},
	}
	if !ss.trusted {
		// Such a daemon builds only a derivation in its store, read from there with its inputs.
		if err := ss.addDerivation(ctx, drvPath); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
			}
			return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
		}
	}
	bctx, stopBuild := context.WithCancelCause(ctx)
	defer stopBuild(nil)
	done := make(chan struct{})
	stopped := make(chan buildStop, 1)
	go func() { stopped <- watchdog(bctx, limits, out, done, stopBuild) }()
	// The connection closes when bctx ends (a limit, a cancel): the daemon then kills the build.
	res, err := ss.build(bctx, drvPath, drv, inputs, l)
	close(done)
	reason := <-stopped
	if reason != buildNotStopped {
		// Closing waits for the daemon, and with it the build, to be gone.
		ss.conn.Close()
	}
	// A limit hit just as the daemon reported success does not undo the build.
	if err != nil || !res.Status.Success() {
		switch reason {
		case buildTimedOut:
			return nil, &BuildError{Kind: "timeout", Message: fmt.Sprintf("build timed out after %s", limits.Timeout), ExitCode: -1}
		case buildSilent:
			return nil, &BuildError{Kind: "silent", Message: fmt.Sprintf("no output for %s", limits.MaxSilent), ExitCode: -1}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
		}
	}
	if err != nil {
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	if !res.Status.Success() {
		return nil, buildFailure(res)
	}
	return ss.checkOutputs(ctx, outputs, limits.MaxOutputSize)
}

// build builds drv: sent to a daemon that trusts the builder, else from the store.
func (ss *Session) build(ctx context.Context, drvPath string, drv *nix.Derivation, inputs []string, l *workerproto.Logger) (workerproto.BuildResult, error) {
	if ss.trusted {
		return ss.conn.BuildDerivation(ctx, drvPath, drv, inputs, l)
	}
	res, err := ss.conn.BuildPaths(ctx, []string{drvPath + "!*"}, l)
	if err != nil {
		return workerproto.BuildResult{}, err
	}
	return res[0], nil
}

// addDerivation adds drvPath and the .drv files and sources it refers to, recursively, from the
// substituters: a daemon building from its store reads them all. They are content-addressed,
// so the daemon needs no signature on them.
func (ss *Session) addDerivation(ctx context.Context, drvPath string) error {
	f, err := ss.fetcher()
	if err != nil {
		return fmt.Errorf("add %s to the store: %w", drvPath, err)
	}
	have := func(ctx context.Context, ps []string) ([]string, error) { return ss.conn.QueryValidPaths(ctx, ps) }
	todo, err := f.Closure(ctx, []string{drvPath}, have)
	if err != nil {
		return fmt.Errorf("add %s to the store: %w", drvPath, err)
	}
	if err := ss.add(ctx, f, todo); err != nil {
		return fmt.Errorf("add %s to the store: %w", drvPath, err)
	}
	return nil
}

// buildFailure is the BuildError of a build the daemon reports failed. Its exit code is the one
// `nix-store --realise` would have exited with (100 for a failed build), which users of
// Nix know.
func buildFailure(res workerproto.BuildResult) *BuildError {
	msg := res.ErrorMsg
	if msg == "" {
		msg = "the build failed: " + res.Status.String()
	}
	switch res.Status {
	case workerproto.PermanentFailure, workerproto.CachedFailure, workerproto.InputRejected, workerproto.LogLimitExceeded:
		return &BuildError{Kind: "failed", Message: msg, ExitCode: 0x60 | 0x04}
	case workerproto.OutputRejected:
		// A fixed output's hash mismatch: the derivation is wrong, trying again cannot help.
		return &BuildError{Kind: "failed", Message: msg, ExitCode: 0x60 | 0x02}
	case workerproto.NotDeterministic:
		return &BuildError{Kind: "failed", Message: msg, ExitCode: 0x60 | 0x08}
	case workerproto.TimedOut:
		return &BuildError{Kind: "timeout", Message: msg, ExitCode: 0x60 | 0x01}
	default: // transient and miscellaneous failures: Nix's, not the build's
		return &BuildError{Kind: "nix", Message: msg, ExitCode: 1}
	}
}

// checkBuildable returns drv's outputs after checking that every input is valid: the daemon
// would otherwise fail the build with a less helpful error.
func (ss *Session) checkBuildable(ctx context.Context, drvPath string, drv *nix.Derivation, inputs []string) (map[string]string, error) {
	outputs := map[string]string{}
	for name, o := range drv.Outputs {
		if o.Path == "" {
			return nil, fmt.Errorf("output %q of %s is content-addressed, which is not supported", name, drvPath)
		}
		outputs[name] = o.Path
	}
	need := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(drv.InputSrcs), inputs...))))
	valid, err := ss.conn.QueryValidPaths(ctx, need)
	if err != nil {
		return nil, err
	}
	for _, p := range need {
		if !slices.Contains(valid, p) {
			return nil, fmt.Errorf("input %s of %s is not valid in the store", p, drvPath)
		}
	}
	return outputs, nil
}

// checkOutputs checks a successful build's outputs against maxSize. Oversized outputs are
// deleted at once unless rooted (the builder, which roots a job's outputs, deletes them itself
// then): they must not wait for the store's GC, which runs only when the disk is short.
func (ss *Session) checkOutputs(ctx context.Context, outputs map[string]string, maxSize int64) (map[string]string, error) {
	paths := slices.Sorted(maps.Values(outputs))
	infos, err := ss.PathInfos(ctx, paths)
	if err != nil {
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	var total int64
	for _, p := range paths {
		info, ok := infos[p]
		if !ok {
			return nil, &BuildError{Kind: "nix", Message: fmt.Sprintf("output %s is not valid after the build", p), ExitCode: -1}
		}
		total += info.NarSize
	}
	if maxSize > 0 && total > maxSize {
		_ = ss.DeleteDead(ctx, paths)
		return nil, &BuildError{Kind: "output-size",
			Message: fmt.Sprintf("outputs are %s, over max_output_size %s", approxSize(total), approxSize(maxSize)), ExitCode: -1}
	}
	return outputs, nil
}

// DeleteDead deletes paths unless something keeps them (a root, a referrer); the connection is
// replaced around it (see reopenAround).
func (ss *Session) DeleteDead(ctx context.Context, paths []string) error {
	return ss.reopenAround(ctx, func() error { return ss.store.deleteDead(ctx, paths) })
}

// OutputInfos returns the path infos of the outputs (for upload: NarHash, NarSize, References,
// Deriver); every path must be valid.
func (ss *Session) OutputInfos(ctx context.Context, paths []string) (map[string]nix.PathInfo, error) {
	infos, err := ss.PathInfos(ctx, paths)
	if err != nil {
		return nil, fmt.Errorf("output infos: %w", err)
	}
	for _, p := range paths {
		if _, ok := infos[p]; !ok {
			return nil, fmt.Errorf("output infos: %s is not valid in the store", p)
		}
	}
	return infos, nil
}

// DumpNAR writes path's NAR to w, as `nix-store --dump` would: the upload's source.
func (ss *Session) DumpNAR(ctx context.Context, path string, w io.Writer) error {
	if err := ss.conn.NarFromPath(ctx, path, w); err != nil {
		return fmt.Errorf("dump %s: %w", path, err)
	}
	return nil
}
