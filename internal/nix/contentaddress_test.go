package nix

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The content-address computations are checked against the paths real Nix gives the same
// objects.
func TestContentAddressMatchesNix(t *testing.T) {
	salt := fmt.Sprint(time.Now().UnixNano())
	dir := t.TempDir()

	// builtins.toFile, with and without a reference.
	plain := runNix(t, "nix-instantiate", "--eval", "--read-write-mode", "-E",
		fmt.Sprintf(`builtins.toFile "x-%s" "hello"`, salt))
	plain = strings.Trim(plain, `"`)
	withRef := strings.Trim(runNix(t, "nix-instantiate", "--eval", "--read-write-mode", "-E",
		fmt.Sprintf(`builtins.toFile "y-%s" "see ${builtins.toFile "x-%s" "hello"}"`, salt, salt)), `"`)

	// A source directory added recursively, and a flat file added with a fixed sha256.
	src := filepath.Join(dir, "src-"+salt)
	if err := os.MkdirAll(filepath.Join(src, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho "+salt+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	source := runNix(t, "nix-store", "--add", src)
	flatFile := filepath.Join(dir, "flat-"+salt)
	if err := os.WriteFile(flatFile, []byte("flat "+salt), 0o644); err != nil {
		t.Fatal(err)
	}
	flat := runNix(t, "nix-store", "--add-fixed", "sha256", flatFile)

	// A derivation using all of them.
	expr := fmt.Sprintf(`derivation { name = "ca-%s"; system = "x86_64-linux"; builder = "/bin/sh";
		args = [ "-c" "echo ${builtins.toFile "y-%s" "see ${builtins.toFile "x-%s" "hello"}"} ${builtins.storePath %q} > $out" ]; }`,
		salt, salt, salt, source)
	drvPath := runNix(t, "nix-instantiate", "-E", expr)

	narOf := func(p string) NARFacts {
		t.Helper()
		var b bytes.Buffer
		if err := WriteNAR(&b, p); err != nil {
			t.Fatal(err)
		}
		f, err := InspectNAR(&b)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, tt := range []struct {
		name, path string
		refs       []string
		wantCA     string
	}{
		{"text", plain, nil, "text:"},
		{"text with a reference", withRef, []string{plain}, "text:"},
		{"recursive source", source, nil, "fixed:r:"},
		{"flat fixed", flat, nil, "fixed:sha256:"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ca, err := ContentAddress(tt.path, narOf(tt.path), tt.refs)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(ca, tt.wantCA) {
				t.Fatalf("CA %q, want %s…", ca, tt.wantCA)
			}
			// A wrong reference set or another name does not give the same path.
			if _, err := ContentAddress(tt.path, narOf(tt.path), append(tt.refs, source+"x")); err == nil && tt.name != "recursive source" {
				t.Fatal("a path was accepted with a made-up reference")
			}
		})
	}
	t.Run("derivation", func(t *testing.T) {
		text, err := os.ReadFile(drvPath)
		if err != nil {
			t.Fatal(err)
		}
		sp, _ := ParseStorePath(drvPath)
		got, _, err := DerivationPath(sp.Name, text)
		if err != nil {
			t.Fatal(err)
		}
		if got != drvPath {
			t.Fatalf("DerivationPath = %s, Nix made %s", got, drvPath)
		}
		if got, _, _ := DerivationPath(sp.Name, append(text, ' ')); got == drvPath {
			t.Fatal("changed text, same path")
		}
		// The .drv's NAR as FileNAR builds it is the one Nix serves.
		f, err := InspectNAR(bytes.NewReader(FileNAR(text, false)))
		if err != nil {
			t.Fatal(err)
		}
		want := narOf(drvPath)
		if f != want {
			t.Fatalf("FileNAR facts %+v, nix-store --dump %+v", f, want)
		}
		if f.FileHash != sha256.Sum256(text) || !f.SingleFile {
			t.Fatalf("file facts %+v", f)
		}
	})
	t.Run("not content-addressed", func(t *testing.T) {
		if _, err := ContentAddress(StoreDir+"/"+strings.Repeat("a", 32)+"-forged", narOf(source), nil); err == nil {
			t.Fatal("a made-up path was accepted")
		}
	})
}

func TestInspectNARRejectsGarbage(t *testing.T) {
	for _, in := range [][]byte{nil, []byte("not a nar"), FileNAR([]byte("x"), false)[:20]} {
		if _, err := InspectNAR(bytes.NewReader(in)); err == nil {
			t.Errorf("InspectNAR(%q) succeeded", in)
		}
	}
}
