package workerproto

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Operation codes (Nix's worker-protocol.hh).
const (
	opIsValidPath           = 1
	opAddTempRoot           = 11
	opSetOptions            = 19
	opQueryPathInfo         = 26
	opQueryValidPaths       = 31
	opBuildDerivation       = 36
	opNarFromPath           = 38
	opAddToStoreNar         = 39
	opQueryMissing          = 40
	opBuildPathsWithResults = 46
)

// start writes an operation's code and arguments (by args) and flushes them.
func (c *Conn) start(op uint64, args func(w *writer)) error {
	c.w.uint64(op)
	if args != nil {
		args(c.w)
	}
	return c.w.flush()
}

// Options are the daemon's settings for this connection's later operations.
type Options struct {
	KeepFailed     bool
	KeepGoing      bool
	TryFallback    bool
	MaxBuildJobs   uint64
	MaxSilentTime  time.Duration // 0: none
	BuildCores     uint64        // 0: all
	UseSubstitutes bool
	// Overrides are further settings by name (e.g. "sandbox", "timeout", "max-build-log-size");
	// a trusted client's apply to builds.
	Overrides map[string]string
}

// SetOptions sets the connection's options. Build logs are asked for verbosely, so that every
// line of a build's log reaches Logger.Line.
func (c *Conn) SetOptions(ctx context.Context, o Options) error {
	return c.op(ctx, "SetOptions", nil, func(w *writer) {
		w.bool(o.KeepFailed)
		w.bool(o.KeepGoing)
		w.bool(o.TryFallback)
		w.uint64(3) // verbosity: lvlInfo
		w.uint64(o.MaxBuildJobs)
		w.uint64(uint64(o.MaxSilentTime / time.Second))
		w.uint64(0) // obsolete useBuildHook
		w.uint64(0) // verboseBuild: lvlError means "print build logs"
		w.uint64(0) // obsolete logType
		w.uint64(0) // obsolete printBuildTrace
		w.uint64(o.BuildCores)
		w.bool(o.UseSubstitutes)
		w.stringMap(o.Overrides)
	}, nil)
}

// op runs one operation: arguments, the daemon's messages (logs to l), then read for the result.
func (c *Conn) op(ctx context.Context, name string, l *Logger, args func(w *writer), read func(r *reader)) error {
	code, ok := opCodes[name]
	if !ok {
		return fmt.Errorf("workerproto: unknown operation %s", name)
	}
	err := c.do(ctx, func() error {
		if err := c.start(code, args); err != nil {
			return err
		}
		if err := c.processStderr(l); err != nil {
			return err
		}
		if read != nil {
			read(c.r)
		}
		return c.r.err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

var opCodes = map[string]uint64{
	"IsValidPath": opIsValidPath, "AddTempRoot": opAddTempRoot, "SetOptions": opSetOptions,
	"QueryPathInfo": opQueryPathInfo, "QueryValidPaths": opQueryValidPaths,
	"BuildDerivation": opBuildDerivation, "NarFromPath": opNarFromPath,
	"AddToStoreNar": opAddToStoreNar, "QueryMissing": opQueryMissing,
	"BuildPathsWithResults": opBuildPathsWithResults,
}

// IsValidPath reports whether path is valid in the store.
func (c *Conn) IsValidPath(ctx context.Context, path string) (bool, error) {
	var valid bool
	err := c.op(ctx, "IsValidPath", nil, func(w *writer) { w.string(path) },
		func(r *reader) { valid = r.bool() })
	return valid, err
}

// QueryValidPaths returns those of paths that are valid (never substituting).
func (c *Conn) QueryValidPaths(ctx context.Context, paths []string) ([]string, error) {
	var valid []string
	err := c.op(ctx, "QueryValidPaths", nil, func(w *writer) {
		w.strings(paths)
		w.bool(false) // substitute
	}, func(r *reader) { valid = r.strings() })
	return valid, err
}

// PathInfo is what the store knows of a valid path.
type PathInfo struct {
	Path             string
	Deriver          string   // "" if unknown
	NarHash          string   // "sha256:<nix32>", the cluster's format
	References       []string // store paths
	RegistrationTime time.Time
	NarSize          uint64
	Ultimate         bool
	Sigs             []string
	CA               string
}

// QueryPathInfo returns path's info; ok is false when the path is not valid.
func (c *Conn) QueryPathInfo(ctx context.Context, path string) (info PathInfo, ok bool, err error) {
	err = c.op(ctx, "QueryPathInfo", nil, func(w *writer) { w.string(path) }, func(r *reader) {
		if ok = r.bool(); !ok {
			return
		}
		info.Path = path
		info.Deriver = r.string()
		hexHash := r.string()
		info.References = r.strings()
		info.RegistrationTime = time.Unix(int64(r.uint64()), 0)
		info.NarSize = r.uint64()
		info.Ultimate = r.bool()
		info.Sigs = r.strings()
		info.CA = r.string()
		if r.err == nil {
			// The daemon sends base16 without the type; the cluster writes sha256:<nix32>.
			var sum [sha256.Size]byte
			if b, herr := hex.DecodeString(strings.TrimPrefix(hexHash, "sha256:")); herr != nil || len(b) != len(sum) {
				r.fail(fmt.Errorf("%w: nar hash %q", ErrMalformed, hexHash))
				return
			} else {
				copy(sum[:], b)
			}
			info.NarHash = nix.FormatSHA256(sum)
		}
	})
	return info, ok, err
}

// AddTempRoot makes path a temporary GC root for as long as the connection lasts.
func (c *Conn) AddTempRoot(ctx context.Context, path string) error {
	return c.op(ctx, "AddTempRoot", nil, func(w *writer) { w.string(path) }, func(r *reader) { r.uint64() })
}

// NarFromPath writes path's NAR (as `nix-store --dump` would) to dst.
func (c *Conn) NarFromPath(ctx context.Context, path string, dst io.Writer) error {
	return c.op(ctx, "NarFromPath", nil, func(w *writer) { w.string(path) }, func(r *reader) { copyNAR(dst, r) })
}

// Missing is what realising some paths would take.
type Missing struct {
	WillBuild, WillSubstitute, Unknown []string
	DownloadSize, NarSize              uint64
}

// QueryMissing says what realising targets (store paths, or "DRV!out1,out2" for outputs of a
// derivation) would build, substitute or not find.
func (c *Conn) QueryMissing(ctx context.Context, targets []string) (Missing, error) {
	var m Missing
	err := c.op(ctx, "QueryMissing", nil, func(w *writer) { w.strings(targets) }, func(r *reader) {
		m.WillBuild, m.WillSubstitute, m.Unknown = r.strings(), r.strings(), r.strings()
		m.DownloadSize, m.NarSize = r.uint64(), r.uint64()
	})
	return m, err
}

// AddToStoreNar adds a path from its NAR (read from nar until EOF). The daemon checks the NAR
// against info's hash and size, and the signatures unless checkSigs is false.
func (c *Conn) AddToStoreNar(ctx context.Context, info PathInfo, nar io.Reader, checkSigs bool) error {
	hash := info.NarHash
	return c.op(ctx, "AddToStoreNar", nil, func(w *writer) {
		w.string(info.Path)
		w.string(info.Deriver)
		w.string(hash)
		w.strings(info.References)
		var registered uint64 // 0: now
		if !info.RegistrationTime.IsZero() {
			registered = uint64(max(info.RegistrationTime.Unix(), 0))
		}
		w.uint64(registered)
		w.uint64(info.NarSize)
		w.bool(info.Ultimate)
		w.strings(info.Sigs)
		w.string(info.CA)
		w.bool(false)      // repair
		w.bool(!checkSigs) // dontCheckSigs
		// The NAR follows in frames (length, bytes; an empty frame ends it), written before the
		// daemon's messages are read: the daemon reads all of it first, and logs at most a line.
		buf := make([]byte, 64<<10)
		for w.err == nil {
			n, rerr := nar.Read(buf)
			if n > 0 {
				w.uint64(uint64(n))
				if w.err == nil {
					_, w.err = w.w.Write(buf[:n])
				}
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil && w.err == nil {
				w.err = fmt.Errorf("read the NAR: %w", rerr)
			}
		}
		w.uint64(0)
	}, nil)
}

// BuildStatus is the outcome of a build, as Nix's BuildResult says.
type BuildStatus uint64

// Build statuses.
const (
	Built BuildStatus = iota
	Substituted
	AlreadyValid
	PermanentFailure
	InputRejected
	OutputRejected
	TransientFailure
	CachedFailure
	TimedOut
	MiscFailure
	DependencyFailed
	LogLimitExceeded
	NotDeterministic
	ResolvesToAlreadyValid
	NoSubstituters
)

var statusNames = [...]string{"Built", "Substituted", "AlreadyValid", "PermanentFailure", "InputRejected",
	"OutputRejected", "TransientFailure", "CachedFailure", "TimedOut", "MiscFailure", "DependencyFailed",
	"LogLimitExceeded", "NotDeterministic", "ResolvesToAlreadyValid", "NoSubstituters"}

func (s BuildStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("BuildStatus(%d)", uint64(s))
}

// Success reports whether the outputs are valid after the build.
func (s BuildStatus) Success() bool {
	return s == Built || s == Substituted || s == AlreadyValid || s == ResolvesToAlreadyValid
}

// BuildResult is what BuildDerivation returns.
type BuildResult struct {
	Status             BuildStatus
	ErrorMsg           string
	TimesBuilt         uint64
	IsNonDeterministic bool
	Start, Stop        time.Time
	// CPUUser and CPUSystem are the build's CPU times, when the daemon measured them
	// (protocol 1.37 and later; 0 otherwise).
	CPUUser, CPUSystem time.Duration
	// BuiltOutputs maps "DRV_HASH!out" ids to their realisations (JSON), as the daemon says.
	BuiltOutputs map[string]string
}

// read reads a build result as the negotiated protocol version has it.
func (res *BuildResult) read(r *reader, minor uint64) {
	res.Status = BuildStatus(r.uint64())
	res.ErrorMsg = strings.TrimSpace(stripANSI(r.string()))
	res.TimesBuilt = r.uint64()
	res.IsNonDeterministic = r.bool()
	res.Start, res.Stop = time.Unix(int64(r.uint64()), 0), time.Unix(int64(r.uint64()), 0)
	if minor >= 37 {
		res.CPUUser, res.CPUSystem = r.optionalMicroseconds(), r.optionalMicroseconds()
	}
	n := r.length(1024, "a list of outputs")
	res.BuiltOutputs = make(map[string]string, n)
	for i := 0; i < n && r.err == nil; i++ {
		id := r.string()
		res.BuiltOutputs[id] = r.string()
	}
}

// optionalMicroseconds reads an optional duration: a tag (0: none, 1: a count of
// microseconds follows).
func (r *reader) optionalMicroseconds() time.Duration {
	switch tag := r.uint64(); {
	case r.err != nil || tag == 0:
		return 0
	case tag == 1:
		return time.Duration(int64(r.uint64())) * time.Microsecond
	default:
		r.fail(fmt.Errorf("%w: optional tag %d", ErrMalformed, tag))
		return 0
	}
}

// BuildDerivation builds drv (stored at drvPath) and streams its log to l. inputs are the
// output paths of its input derivations, which must be valid with its sources: the daemon
// builds the derivation as given, so they join its sources (the sandbox's view and the
// reference scan). A failed build is a BuildResult with a failure status, not an error.
func (c *Conn) BuildDerivation(ctx context.Context, drvPath string, drv *nix.Derivation, inputs []string, l *Logger) (BuildResult, error) {
	srcs := slices.Sorted(slices.Values(append(slices.Clone(drv.InputSrcs), inputs...)))
	srcs = slices.Compact(srcs)
	var res BuildResult
	err := c.op(ctx, "BuildDerivation", l, func(w *writer) {
		w.string(drvPath)
		names := drv.OutputNames()
		w.uint64(uint64(len(names)))
		for _, name := range names {
			o := drv.Outputs[name]
			w.string(name)
			w.string(o.Path)
			w.string(o.HashAlgo)
			w.string(o.Hash)
		}
		w.strings(srcs)
		w.string(drv.Platform)
		w.string(drv.Builder)
		w.strings(drv.Args)
		w.stringMap(drv.Env)
		w.uint64(0) // buildMode: normal
	}, func(r *reader) { res.read(r, c.Minor) })
	return res, err
}

// BuildPaths builds the outputs of derivations in the store ("DRV!out1,out2", or "DRV!*" for
// all), as `nix-store --realise` would, and streams the logs to l. Unlike BuildDerivation, the
// daemon reads each derivation and its inputs from its store, so an untrusted client may use it.
// A failed build is a result with a failure status, not an error; results are in the order of
// targets. It needs protocol 1.34 (Nix 2.8) or later.
func (c *Conn) BuildPaths(ctx context.Context, targets []string, l *Logger) ([]BuildResult, error) {
	if c.Minor < 34 {
		return nil, fmt.Errorf("BuildPathsWithResults: the daemon speaks protocol 1.%d, 1.34 is needed", c.Minor)
	}
	results := make([]BuildResult, len(targets))
	err := c.op(ctx, "BuildPathsWithResults", l, func(w *writer) {
		w.strings(targets)
		w.uint64(0) // buildMode: normal
	}, func(r *reader) {
		n := r.length(uint64(len(targets)), "a list of build results")
		if r.err == nil && n != len(targets) {
			r.fail(fmt.Errorf("%w: %d build results for %d targets", ErrMalformed, n, len(targets)))
		}
		for i := 0; i < n && r.err == nil; i++ {
			r.string() // the target, as the daemon spells it
			results[i].read(r, c.Minor)
		}
	})
	return results, err
}
