package workerproto

import (
	"fmt"
	"strings"
)

// The daemon's messages while it works on an operation ("stderr" in Nix's sources), until last.
const (
	msgWrite         = 0x64617416
	msgRead          = 0x64617461
	msgError         = 0x63787470
	msgNext          = 0x6f6c6d67
	msgStartActivity = 0x53545254
	msgStopActivity  = 0x53544f50
	msgResult        = 0x52534c54
	msgLast          = 0x616c7473
)

// Result types the daemon reports for an activity.
const (
	resBuildLogLine = 101
	resPostBuildLog = 107
)

// ActBuild is the type of a build's activity; its text is "building '/nix/store/….drv'".
const ActBuild = 105

// Error is an error the daemon reported for an operation: the connection stays usable.
type Error struct {
	Message string
	Traces  []string // outermost first, as Nix prints them
	Status  uint64   // the exit status Nix would use (protocol < 1.26 only; else 1)
}

func (e *Error) Error() string {
	if len(e.Traces) == 0 {
		return "nix-daemon: " + e.Message
	}
	return "nix-daemon: " + e.Message + " (" + strings.Join(e.Traces, "; ") + ")"
}

// Field is a field of an activity or a result: a number or a string.
type Field struct {
	Int    uint64
	String string
	IsInt  bool
}

// Logger receives what the daemon reports while it works. Any method may be nil.
type Logger struct {
	// Line is a line of a build's log (without its newline), or a line the daemon logs.
	Line func(line string)
	// Activity is an activity starting: id, type, text and fields.
	Activity func(id, typ uint64, text string, fields []Field)
}

// readFields reads an activity's or a result's fields.
func (r *reader) fields() []Field {
	n := r.length(1024, "a field list")
	out := make([]Field, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		switch t := r.uint64(); t {
		case 0:
			out = append(out, Field{Int: r.uint64(), IsInt: true})
		case 1:
			out = append(out, Field{String: r.string()})
		default:
			if r.err == nil {
				r.fail(fmt.Errorf("%w: field type %d", ErrMalformed, t))
			}
		}
	}
	return out
}

// readError reads the error of a msgError (protocol 1.26 and later: the structured form).
func (r *reader) daemonError() *Error {
	typ := r.string()
	if r.err == nil && typ != "Error" {
		r.fail(fmt.Errorf("%w: error type %q", ErrMalformed, typ))
		return nil
	}
	r.uint64() // level
	r.string() // name
	msg := r.string()
	if r.uint64() != 0 && r.err == nil { // a position: never sent by 2.8 ("havePos" is 0)
		r.fail(fmt.Errorf("%w: an error position", ErrMalformed))
	}
	n := r.length(1024, "a trace list")
	e := &Error{Message: strings.TrimSpace(stripANSI(msg)), Status: 1}
	for i := 0; i < n && r.err == nil; i++ {
		if r.uint64() != 0 && r.err == nil {
			r.fail(fmt.Errorf("%w: a trace position", ErrMalformed))
		}
		e.Traces = append(e.Traces, strings.TrimSpace(stripANSI(r.string())))
	}
	return e
}

// processStderr reads the daemon's messages up to msgLast, passing logs to l. A daemon error
// ends the operation: it is returned as *Error. An error reading is returned as it is.
func (c *Conn) processStderr(l *Logger) error {
	r := c.r
	for {
		switch msg := r.uint64(); msg {
		case msgLast:
			return r.err
		case msgError:
			e := r.daemonError()
			if r.err != nil {
				return r.err
			}
			return e
		case msgNext:
			line := strings.TrimSuffix(r.string(), "\n")
			if r.err == nil && l != nil && l.Line != nil {
				l.Line(line)
			}
		case msgStartActivity:
			id, _, typ := r.uint64(), r.uint64(), r.uint64()
			text := r.string()
			fields := r.fields()
			r.uint64() // parent
			if r.err == nil && l != nil && l.Activity != nil {
				l.Activity(id, typ, text, fields)
			}
		case msgStopActivity:
			r.uint64()
		case msgResult:
			r.uint64() // activity
			typ := r.uint64()
			fields := r.fields()
			if r.err == nil && (typ == resBuildLogLine || typ == resPostBuildLog) && len(fields) > 0 && !fields[0].IsInt &&
				l != nil && l.Line != nil {
				l.Line(fields[0].String)
			}
		case msgWrite, msgRead:
			// Only the import/export operations this client never sends use these.
			if r.err == nil {
				r.fail(fmt.Errorf("%w: the daemon asked to transfer data (message %#x)", ErrMalformed, msg))
			}
		default:
			if r.err == nil {
				r.fail(fmt.Errorf("%w: unknown message %#x", ErrMalformed, msg))
			}
		}
		if r.err != nil {
			return r.err
		}
	}
}

// stripANSI removes the terminal escape sequences Nix puts in its error messages.
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b[") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
