package nix

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadFileNAR(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "sub", "f"), []byte("x"), 0o644)
	var dirNAR bytes.Buffer
	if err := WriteNAR(&dirNAR, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	var linkNAR bytes.Buffer
	if err := WriteNAR(&linkNAR, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	seven := FileNAR([]byte("1234567"), false)
	badPadding := bytes.Clone(seven)
	// The seventh content byte is followed by one padding byte, before the closing "(" token.
	badPadding[len(badPadding)-17] = 1
	tests := []struct {
		name     string
		nar      []byte
		limit    int64
		want     string
		wantExec bool
		wantErr  string
	}{
		{name: "empty file", nar: FileNAR(nil, false), limit: 10, want: ""},
		{name: "aligned", nar: FileNAR([]byte("12345678"), false), limit: 8, want: "12345678"},
		{name: "padded", nar: seven, limit: 7, want: "1234567"},
		{name: "executable", nar: FileNAR([]byte("#!/bin/sh\n"), true), limit: 100, want: "#!/bin/sh\n", wantExec: true},
		{name: "over the limit", nar: seven, limit: 6, wantErr: "more than the limit of 6"},
		{name: "negative limit", nar: seven, limit: -1, wantErr: "more than the limit"},
		{name: "directory", nar: dirNAR.Bytes(), limit: 100, wantErr: "NAR is a directory"},
		{name: "symlink", nar: linkNAR.Bytes(), limit: 100, wantErr: "NAR is a symlink"},
		{name: "not a NAR", nar: []byte("Derive([])"), limit: 100, wantErr: "not a NAR"},
		{name: "truncated", nar: seven[:len(seven)-9], limit: 100, wantErr: "truncated"},
		{name: "trailing data", nar: append(bytes.Clone(seven), 0), limit: 100, wantErr: "data after the end"},
		{name: "non-zero padding", nar: badPadding, limit: 100, wantErr: "non-zero padding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, exec, err := ReadFileNAR(bytes.NewReader(tt.nar), tt.limit)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ReadFileNAR error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want || exec != tt.wantExec {
				t.Errorf("ReadFileNAR = %q, executable %v; want %q, %v", got, exec, tt.want, tt.wantExec)
			}
		})
	}
}

// errAtEOF stands for a reader that verifies its stream at the end.
var errAtEOF = errors.New("checksum mismatch")

type failAtEOF struct{ r io.Reader }

func (f failAtEOF) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		err = errAtEOF
	}
	return n, err
}

// TestReadFileNARReadsToEOF checks that an error the reader reports only at its end is not lost
// after the NAR's last token.
func TestReadFileNARReadsToEOF(t *testing.T) {
	_, _, err := ReadFileNAR(failAtEOF{bytes.NewReader(FileNAR([]byte("x"), false))}, 10)
	if !errors.Is(err, errAtEOF) {
		t.Errorf("ReadFileNAR error = %v, want %v", err, errAtEOF)
	}
}
