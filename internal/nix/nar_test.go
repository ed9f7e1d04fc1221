package nix

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// makeTree builds a directory exercising every NAR case Nix distinguishes.
func makeTree(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "tree")
	big := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	writeFile(t, filepath.Join(root, "B"), []byte("upper\n"), 0o644)
	writeFile(t, filepath.Join(root, "a"), []byte("lower\n"), 0o644)
	writeFile(t, filepath.Join(root, "_z"), []byte("underscore"), 0o644)
	writeFile(t, filepath.Join(root, "empty-file"), nil, 0o644)
	writeFile(t, filepath.Join(root, "bin", "run"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	// Only the owner's x bit makes a file executable in a NAR.
	writeFile(t, filepath.Join(root, "bin", "other-x"), []byte("x"), 0o645)
	writeFile(t, filepath.Join(root, "bin", "user-x-only"), []byte("x"), 0o744)
	writeFile(t, filepath.Join(root, "data", "big"), big, 0o644)
	writeFile(t, filepath.Join(root, "data", "seven"), []byte("1234567"), 0o644)
	writeFile(t, filepath.Join(root, "data", "eight"), []byte("12345678"), 0o644)
	writeFile(t, filepath.Join(root, "deep", "er", "est", "leaf"), []byte("leaf"), 0o600)
	for _, d := range []string{filepath.Join(root, "empty-dir"), filepath.Join(root, "deep", "er", "empty")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"abs-link":      "/nonexistent/absolute/target",
		"rel-link":      "../a",
		"data/dir-link": "../deep",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func narBytes(t *testing.T, path string) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteNAR(&b, path); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func nixDump(t *testing.T, path string) []byte {
	t.Helper()
	requireNix(t)
	out, err := exec.Command("nix-store", "--dump", path).Output()
	if err != nil {
		t.Fatalf("nix-store --dump %s: %v", path, err)
	}
	return out
}

func TestWriteNARMatchesNixStoreDump(t *testing.T) {
	root := makeTree(t)
	for _, p := range []string{
		root,
		filepath.Join(root, "a"),          // top-level regular file
		filepath.Join(root, "bin", "run"), // top-level executable
		filepath.Join(root, "empty-file"),
		filepath.Join(root, "empty-dir"),
		filepath.Join(root, "abs-link"), // top-level symlink is archived, not followed
		filepath.Join(root, "data"),
	} {
		name := strings.TrimPrefix(p, root)
		if name == "" {
			name = "tree"
		}
		t.Run(name, func(t *testing.T) {
			got, want := narBytes(t, p), nixDump(t, p)
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Fatalf("NAR of %s differs from nix-store --dump at byte %d (len %d vs %d)\n ours: %q\n nix:  %q",
					p, i, len(got), len(want), window(got, i), window(want, i))
			}
		})
	}
}

func window(b []byte, i int) []byte {
	lo, hi := max(0, i-32), min(len(b), i+32)
	return b[lo:hi]
}

func TestHashNARMatchesNix(t *testing.T) {
	root := makeTree(t)
	for _, p := range []string{root, filepath.Join(root, "data", "big"), filepath.Join(root, "rel-link")} {
		hash, size, err := HashNAR(p)
		if err != nil {
			t.Fatal(err)
		}
		want := "sha256:" + runNix(t, "nix", "hash", "path", "--type", "sha256", "--base32", p)
		if hash != want {
			t.Errorf("HashNAR(%s) = %s, nix hash path says %s", p, hash, want)
		}
		if n := int64(len(nixDump(t, p))); size != n {
			t.Errorf("HashNAR(%s) size = %d, nix-store --dump wrote %d bytes", p, size, n)
		}
	}
}

func TestWriteNARRejectsSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteNAR(&bytes.Buffer{}, dir)
	if err == nil || !strings.Contains(err.Error(), "unsupported file type") {
		t.Fatalf("WriteNAR of a directory with a FIFO: err = %v, want unsupported file type", err)
	}
	if err := WriteNAR(&bytes.Buffer{}, filepath.Join(dir, "missing")); err == nil {
		t.Fatal("WriteNAR of a missing path succeeded")
	}
}

// failWriter fails after n bytes, to check that write errors surface instead of being dropped.
type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		return 0, os.ErrClosed
	}
	w.n -= len(p)
	return len(p), nil
}

func TestWriteNARPropagatesWriteErrors(t *testing.T) {
	root := makeTree(t)
	if err := WriteNAR(&failWriter{n: 100 << 10}, root); err == nil {
		t.Fatal("WriteNAR into a failing writer succeeded")
	}
}
