package nix

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// ReadFileNAR reads a NAR that is a single regular file, the inverse of FileNAR, and returns the
// file's contents and executable bit. A NAR of anything else (a directory, a symlink), a file
// longer than limit bytes, non-zero padding and any byte after the NAR's end are errors. The
// NAR is read to its end, so a reader that checks the whole stream at EOF gets to check it.
func ReadFileNAR(r io.Reader, limit int64) (contents []byte, executable bool, err error) {
	contents, executable, err = readFileNAR(bufio.NewReader(r), limit)
	if err != nil {
		return nil, false, fmt.Errorf("read file nar: %w", err)
	}
	return contents, executable, nil
}

func readFileNAR(br *bufio.Reader, limit int64) ([]byte, bool, error) {
	p := narTokens{r: br}
	expect := func(want string) error {
		got, err := p.str(256)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("want %q, got %q", want, got)
		}
		return nil
	}
	for _, want := range []string{narMagic, "(", "type"} {
		if err := expect(want); err != nil {
			return nil, false, fmt.Errorf("not a NAR: %w", err)
		}
	}
	typ, err := p.str(256)
	if err != nil {
		return nil, false, err
	}
	if typ != "regular" {
		return nil, false, fmt.Errorf("NAR is a %s, not a single regular file", typ)
	}
	tok, err := p.str(256)
	if err != nil {
		return nil, false, err
	}
	executable := tok == "executable"
	if executable {
		if err := expect(""); err != nil {
			return nil, false, err
		}
		if tok, err = p.str(256); err != nil {
			return nil, false, err
		}
	}
	if tok != "contents" {
		return nil, false, fmt.Errorf("want %q, got %q", "contents", tok)
	}
	size, err := p.u64()
	if err != nil {
		return nil, false, err
	}
	if limit < 0 || size > uint64(limit) {
		return nil, false, fmt.Errorf("file is %d bytes, more than the limit of %d", size, limit)
	}
	contents := make([]byte, size+(8-size%8)%8)
	if _, err := io.ReadFull(br, contents); err != nil {
		return nil, false, fmt.Errorf("file contents: truncated: %w", err)
	}
	for _, b := range contents[size:] {
		if b != 0 {
			return nil, false, errors.New("non-zero padding after the file contents")
		}
	}
	if err := expect(")"); err != nil {
		return nil, false, err
	}
	switch _, err := br.ReadByte(); {
	case err == nil:
		return nil, false, errors.New("data after the end of the NAR")
	case !errors.Is(err, io.EOF):
		return nil, false, err
	}
	return contents[:size], executable, nil
}
