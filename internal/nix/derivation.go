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
// would be much slower, and whole dependency graphs of 10,000+ derivations get parsed.
type drvParser struct {
	b   []byte
	pos int
}

// syntaxErrorf reports an error at byte offset at; format may use %w.
func (p *drvParser) syntaxErrorf(at int, format string, args ...any) error {
	return fmt.Errorf("byte %d: "+format, append([]any{at}, args...)...)
}

// expect consumes tok or reports what was found instead.
func (p *drvParser) expect(tok string) error {
	// The string conversion in a comparison does not allocate.
	if len(p.b)-p.pos >= len(tok) && string(p.b[p.pos:p.pos+len(tok)]) == tok {
		p.pos += len(tok)
		return nil
	}
	return p.syntaxErrorf(p.pos, "expected %q, found %s", tok, p.found())
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
func (p *drvParser) list(elem func() error) error {
	if err := p.expect("["); err != nil {
		return err
	}
	if p.pos < len(p.b) && p.b[p.pos] == ']' {
		p.pos++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		if p.pos < len(p.b) {
			switch p.b[p.pos] {
			case ',':
				p.pos++
				continue
			case ']':
				p.pos++
				return nil
			}
		}
		return p.syntaxErrorf(p.pos, "expected ',' or ']', found %s", p.found())
	}
}

// str parses a quoted string with Nix's escapes: \" \\ \n \r \t. Nix never writes any other
// escape, so anything else is treated as corruption rather than guessed at.
func (p *drvParser) str() (string, error) {
	start := p.pos
	if err := p.expect(`"`); err != nil {
		return "", err
	}
	rest := p.b[p.pos:]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return "", p.syntaxErrorf(start, "unterminated string")
	}
	// Fast path: most strings (paths, names) have no escapes and cost one allocation.
	if bytes.IndexByte(rest[:end], '\\') < 0 {
		p.pos += end + 1
		return string(rest[:end]), nil
	}
	buf := make([]byte, 0, end)
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; c {
		case '"':
			p.pos += i + 1
			return string(buf), nil
		case '\\':
			i++
			if i == len(rest) {
				return "", p.syntaxErrorf(start, "unterminated string")
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
				return "", p.syntaxErrorf(p.pos+i-1, "invalid escape %q", rest[i-1:i+1])
			}
		default:
			buf = append(buf, c)
		}
	}
	return "", p.syntaxErrorf(start, "unterminated string")
}

// path parses a string that must be a store path.
func (p *drvParser) path() (string, error) {
	start := p.pos
	s, err := p.str()
	if err != nil {
		return "", err
	}
	if _, err := ParseStorePath(s); err != nil {
		return "", p.syntaxErrorf(start, "%w", err)
	}
	return s, nil
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
	if err := p.expect("Derive("); err != nil {
		return nil, err
	}

	err := p.list(func() error {
		start := p.pos
		if err := p.expect("("); err != nil {
			return err
		}
		name, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(","); err != nil {
			return err
		}
		var o DerivationOutput
		pathAt := p.pos
		if o.Path, err = p.str(); err != nil {
			return err
		}
		if o.Path != "" {
			if _, err := ParseStorePath(o.Path); err != nil {
				return p.syntaxErrorf(pathAt, "output %q: %w", name, err)
			}
		}
		if err := p.expect(","); err != nil {
			return err
		}
		if o.HashAlgo, err = p.str(); err != nil {
			return err
		}
		if err := p.expect(","); err != nil {
			return err
		}
		if o.Hash, err = p.str(); err != nil {
			return err
		}
		if err := p.expect(")"); err != nil {
			return err
		}
		switch {
		case name == "":
			return p.syntaxErrorf(start, "empty output name")
		case o.Hash != "" && (o.Path == "" || o.HashAlgo == ""):
			return p.syntaxErrorf(start, "fixed output %q needs a path and a hash algorithm", name)
		}
		if _, dup := d.Outputs[name]; dup {
			return p.syntaxErrorf(start, "duplicate output %q", name)
		}
		d.Outputs[name] = o
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(d.Outputs) == 0 {
		return nil, p.syntaxErrorf(p.pos, "derivation has no outputs")
	}

	if err := p.expect(","); err != nil {
		return nil, err
	}
	err = p.list(func() error {
		start := p.pos
		if err := p.expect("("); err != nil {
			return err
		}
		drv, err := p.path()
		if err != nil {
			return err
		}
		if !strings.HasSuffix(drv, ".drv") {
			return p.syntaxErrorf(start+1, "input derivation %q is not a .drv", drv)
		}
		if err := p.expect(","); err != nil {
			return err
		}
		outs := []string{}
		if err := p.list(func() error {
			o, err := p.str()
			outs = append(outs, o)
			return err
		}); err != nil {
			return err
		}
		if err := p.expect(")"); err != nil {
			return err
		}
		if _, dup := d.InputDrvs[drv]; dup {
			return p.syntaxErrorf(start, "duplicate input derivation %q", drv)
		}
		d.InputDrvs[drv] = outs
		return nil
	})
	if err != nil {
		return nil, err
	}

	if err := p.expect(","); err != nil {
		return nil, err
	}
	if err := p.list(func() error {
		s, err := p.path()
		d.InputSrcs = append(d.InputSrcs, s)
		return err
	}); err != nil {
		return nil, err
	}

	if err := p.expect(","); err != nil {
		return nil, err
	}
	if d.Platform, err = p.str(); err != nil {
		return nil, err
	}
	if err := p.expect(","); err != nil {
		return nil, err
	}
	if d.Builder, err = p.str(); err != nil {
		return nil, err
	}
	if err := p.expect(","); err != nil {
		return nil, err
	}
	if err := p.list(func() error {
		s, err := p.str()
		d.Args = append(d.Args, s)
		return err
	}); err != nil {
		return nil, err
	}

	if err := p.expect(","); err != nil {
		return nil, err
	}
	err = p.list(func() error {
		start := p.pos
		if err := p.expect("("); err != nil {
			return err
		}
		k, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(","); err != nil {
			return err
		}
		v, err := p.str()
		if err != nil {
			return err
		}
		if err := p.expect(")"); err != nil {
			return err
		}
		if _, dup := d.Env[k]; dup {
			return p.syntaxErrorf(start, "duplicate environment variable %q", k)
		}
		d.Env[k] = v
		return nil
	})
	if err != nil {
		return nil, err
	}

	if err := p.expect(")"); err != nil {
		return nil, err
	}
	if p.pos != len(b) {
		return nil, p.syntaxErrorf(p.pos, "trailing data after derivation: %s", p.found())
	}
	return d, nil
}
