package nix

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Derivation is a parsed .drv file.
type Derivation struct {
	Outputs   map[string]DerivationOutput // output name → output
	InputDrvs map[string][]string         // input .drv path → output names (sorted as in the file)
	InputSrcs []string
	Platform  string // "system"
	Builder   string
	Args      []string
	Env       map[string]string
}

// DerivationOutput is one output of a derivation. Fixed-output derivations set HashAlgo
// ("sha256", or "r:sha256" for recursive/NAR hashing) and Hash (base16); floating
// content-addressed outputs set only HashAlgo.
type DerivationOutput struct {
	Path     string // "" for floating CA (and deferred) outputs
	HashAlgo string
	Hash     string
}

// ReadDerivation reads and parses the derivation drvPath (a /nix/store path) from the store
// rooted at storeRoot: "" for the real root, or the directory of a chroot store.
func ReadDerivation(storeRoot, drvPath string) (*Derivation, error) {
	// Validating first keeps drvPath from naming anything outside the store (no "..").
	if _, err := ParseStorePath(drvPath); err != nil {
		return nil, fmt.Errorf("read derivation: %w", err)
	}
	if storeRoot == "" {
		storeRoot = "/"
	}
	b, err := os.ReadFile(filepath.Join(storeRoot, drvPath))
	if err != nil {
		return nil, fmt.Errorf("read derivation: %w", err)
	}
	d, err := parseDerivation(b)
	if err != nil {
		return nil, fmt.Errorf("parse derivation %s: %w", drvPath, err)
	}
	return d, nil
}

// ParseDerivation parses the ATerm text of a .drv file as Nix writes it.
func ParseDerivation(b []byte) (*Derivation, error) {
	d, err := parseDerivation(b)
	if err != nil {
		return nil, fmt.Errorf("parse derivation: %w", err)
	}
	return d, nil
}

// Name returns the derivation's name attribute.
func (d *Derivation) Name() string {
	if n, ok := d.Env["name"]; ok {
		return n
	}
	return d.structuredAttrs().Name
}

// RequiredSystemFeatures returns the features a builder must offer, or nil if none.
func (d *Derivation) RequiredSystemFeatures() []string {
	var fs []string
	if v, ok := d.Env["requiredSystemFeatures"]; ok {
		fs = strings.Fields(v)
	} else {
		fs = d.structuredAttrs().RequiredSystemFeatures
	}
	if len(fs) == 0 {
		return nil
	}
	return fs
}

// structuredAttrs decodes the attributes of a __structuredAttrs derivation, which Nix keeps
// in a single "__json" variable instead of one variable per attribute. Undecodable JSON reads
// as no attributes: Nix would refuse to build such a derivation anyway.
func (d *Derivation) structuredAttrs() (a struct {
	Name                   string   `json:"name"`
	RequiredSystemFeatures []string `json:"requiredSystemFeatures"`
}) {
	if j, ok := d.Env["__json"]; ok {
		_ = json.Unmarshal([]byte(j), &a)
	}
	return a
}

// OutputNames returns the names of the outputs, sorted.
func (d *Derivation) OutputNames() []string { return slices.Sorted(maps.Keys(d.Outputs)) }

// References returns the store paths the .drv file itself refers to (its input sources and
// input derivations), sorted: exactly what Nix registers as the .drv's references.
func (d *Derivation) References() []string {
	refs := slices.AppendSeq(slices.Clone(d.InputSrcs), maps.Keys(d.InputDrvs))
	slices.Sort(refs)
	return slices.Compact(refs)
}

// drvParser is a hand-written recursive-descent parser: regexps or a general ATerm library
// would be much slower, and whole dependency graphs of 10,000+ derivations get parsed. Its
// errors are sticky: the first one is kept and every later read is a no-op, so a caller reads
// a whole derivation and checks err once at the end.
type drvParser struct {
	b   []byte
	pos int
	err error
}

// fail records an error at byte offset at, unless one is recorded already; format may use %w.
func (p *drvParser) fail(at int, format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("byte %d: "+format, append([]any{at}, args...)...)
	}
}

// expect consumes tok or records what was found instead.
func (p *drvParser) expect(tok string) {
	if p.err != nil {
		return
	}
	// The string conversion in a comparison does not allocate.
	if len(p.b)-p.pos >= len(tok) && string(p.b[p.pos:p.pos+len(tok)]) == tok {
		p.pos += len(tok)
		return
	}
	p.fail(p.pos, "expected %q, found %s", tok, p.found())
}

// found describes the input at the current position for error messages.
func (p *drvParser) found() string {
	rest := p.b[p.pos:]
	if len(rest) == 0 {
		return "end of input"
	}
	const maxShown = 16
	if len(rest) > maxShown {
		return fmt.Sprintf("%q…", rest[:maxShown])
	}
	return fmt.Sprintf("%q", rest)
}

// list parses '[' elem (',' elem)* ']', allowing the empty list.
func (p *drvParser) list(elem func()) {
	p.expect("[")
	if p.err != nil {
		return
	}
	if p.pos < len(p.b) && p.b[p.pos] == ']' {
		p.pos++
		return
	}
	for {
		if elem(); p.err != nil {
			return
		}
		if p.pos < len(p.b) {
			switch p.b[p.pos] {
			case ',':
				p.pos++
				continue
			case ']':
				p.pos++
				return
			}
		}
		p.fail(p.pos, "expected ',' or ']', found %s", p.found())
		return
	}
}

// str parses a quoted string with Nix's escapes: \" \\ \n \r \t. Nix never writes any other
// escape, so anything else is treated as corruption rather than guessed at.
func (p *drvParser) str() string {
	start := p.pos
	if p.expect(`"`); p.err != nil {
		return ""
	}
	rest := p.b[p.pos:]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		p.fail(start, "unterminated string")
		return ""
	}
	// Fast path: most strings (paths, names) have no escapes and cost one allocation.
	if bytes.IndexByte(rest[:end], '\\') < 0 {
		p.pos += end + 1
		return string(rest[:end])
	}
	buf := make([]byte, 0, end)
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; c {
		case '"':
			p.pos += i + 1
			return string(buf)
		case '\\':
			i++
			if i == len(rest) {
				p.fail(start, "unterminated string")
				return ""
			}
			switch e := rest[i]; e {
			case '"', '\\':
				buf = append(buf, e)
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			default:
				p.fail(p.pos+i-1, "invalid escape %q", rest[i-1:i+1])
				return ""
			}
		default:
			buf = append(buf, c)
		}
	}
	p.fail(start, "unterminated string")
	return ""
}

// path parses a string that must be a store path.
func (p *drvParser) path() string {
	start := p.pos
	s := p.str()
	if p.err != nil {
		return ""
	}
	if _, err := ParseStorePath(s); err != nil {
		p.fail(start, "%w", err)
	}
	return s
}

func parseDerivation(b []byte) (*Derivation, error) {
	p := &drvParser{b: b}
	d := &Derivation{
		Outputs:   map[string]DerivationOutput{},
		InputDrvs: map[string][]string{},
		InputSrcs: []string{},
		Args:      []string{},
		Env:       map[string]string{},
	}
	// Newer formats (DrvWithVersion, dynamic derivations) start differently and carry
	// semantics this parser would silently drop, so they are rejected here.
	p.expect("Derive(")

	p.list(func() {
		start := p.pos
		p.expect("(")
		name := p.str()
		p.expect(",")
		pathAt := p.pos
		o := DerivationOutput{Path: p.str()}
		if o.Path != "" {
			if _, err := ParseStorePath(o.Path); err != nil {
				p.fail(pathAt, "output %q: %w", name, err)
			}
		}
		p.expect(",")
		o.HashAlgo = p.str()
		p.expect(",")
		o.Hash = p.str()
		p.expect(")")
		switch _, dup := d.Outputs[name]; {
		case p.err != nil:
		case name == "":
			p.fail(start, "empty output name")
		case o.Hash != "" && (o.Path == "" || o.HashAlgo == ""):
			p.fail(start, "fixed output %q needs a path and a hash algorithm", name)
		case dup:
			p.fail(start, "duplicate output %q", name)
		default:
			d.Outputs[name] = o
		}
	})
	if len(d.Outputs) == 0 {
		p.fail(p.pos, "derivation has no outputs")
	}

	p.expect(",")
	p.list(func() {
		start := p.pos
		p.expect("(")
		drv := p.path()
		if p.err == nil && !strings.HasSuffix(drv, ".drv") {
			p.fail(start+1, "input derivation %q is not a .drv", drv)
		}
		p.expect(",")
		outs := []string{}
		p.list(func() { outs = append(outs, p.str()) })
		p.expect(")")
		if _, dup := d.InputDrvs[drv]; dup {
			p.fail(start, "duplicate input derivation %q", drv)
		}
		d.InputDrvs[drv] = outs
	})

	p.expect(",")
	p.list(func() { d.InputSrcs = append(d.InputSrcs, p.path()) })
	p.expect(",")
	d.Platform = p.str()
	p.expect(",")
	d.Builder = p.str()
	p.expect(",")
	p.list(func() { d.Args = append(d.Args, p.str()) })

	p.expect(",")
	p.list(func() {
		start := p.pos
		p.expect("(")
		k := p.str()
		p.expect(",")
		v := p.str()
		p.expect(")")
		if _, dup := d.Env[k]; dup {
			p.fail(start, "duplicate environment variable %q", k)
		}
		d.Env[k] = v
	})

	p.expect(")")
	if p.err == nil && p.pos != len(b) {
		p.fail(p.pos, "trailing data after derivation: %s", p.found())
	}
	if p.err != nil {
		return nil, p.err
	}
	return d, nil
}
