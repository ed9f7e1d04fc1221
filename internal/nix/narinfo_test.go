package nix

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// nixNarInfo was written by `nix copy --to 'file://…?compression=zstd&secret-key=…'` (Nix 2.8).
const nixNarInfo = `StorePath: /nix/store/3bg33srm85jxx662i9qk4qlvkqimzllk-x
URL: nar/1afvsx5h64bzk6b3x2cl75am64mdikywlvnqqjyw9mmgs2wa2lad.nar.zst
Compression: zstd
FileHash: sha256:1afvsx5h64bzk6b3x2cl75am64mdikywlvnqqjyw9mmgs2wa2lad
FileSize: 124
NarHash: sha256:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3
NarSize: 160
References: dwycdyjrq46n5jwam106ysjkclk3rvzv-y
Sig: test-1:8FpW1B19pMEpi7R6CnnJctPrXIQ5+3Iu1ln6CFoo2zQejCDMLY+BZwNOfUlzBtx8IjnpyahfWk/LUiAP/RxCCw==
CA: text:sha256:010bczvvk46bdhhll49wi83pbcik988gz3mgpzwlxsam8ajgjarj
`

// nixNarInfoKey is the public key of the secret that signed nixNarInfo.
const nixNarInfoKey = "test-1:ouDBbemNin4q4twhMFZIwCZvYZYVlz4XvhiPZ/TYgwY="

func TestNarInfoGolden(t *testing.T) {
	ni, err := ParseNarInfo([]byte(nixNarInfo))
	if err != nil {
		t.Fatal(err)
	}
	want := NarInfo{
		StorePath:   "/nix/store/3bg33srm85jxx662i9qk4qlvkqimzllk-x",
		URL:         "nar/1afvsx5h64bzk6b3x2cl75am64mdikywlvnqqjyw9mmgs2wa2lad.nar.zst",
		Compression: "zstd",
		FileHash:    "sha256:1afvsx5h64bzk6b3x2cl75am64mdikywlvnqqjyw9mmgs2wa2lad",
		FileSize:    124,
		NarHash:     "sha256:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3",
		NarSize:     160,
		References:  []string{"dwycdyjrq46n5jwam106ysjkclk3rvzv-y"},
		Sigs:        []string{"test-1:8FpW1B19pMEpi7R6CnnJctPrXIQ5+3Iu1ln6CFoo2zQejCDMLY+BZwNOfUlzBtx8IjnpyahfWk/LUiAP/RxCCw=="},
		CA:          "text:sha256:010bczvvk46bdhhll49wi83pbcik988gz3mgpzwlxsam8ajgjarj",
	}
	if !equalNarInfo(ni, &want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", ni, want)
	}
	out, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != nixNarInfo {
		t.Fatalf("re-marshalled:\n%s\nwant:\n%s", out, nixNarInfo)
	}
	fp, err := ni.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	if want := "1;/nix/store/3bg33srm85jxx662i9qk4qlvkqimzllk-x;sha256:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3;160;/nix/store/dwycdyjrq46n5jwam106ysjkclk3rvzv-y"; fp != want {
		t.Fatalf("Fingerprint() = %q, want %q", fp, want)
	}
	pub, err := ParsePublicKey(nixNarInfoKey)
	if err != nil {
		t.Fatal(err)
	}
	if !ni.Verify(pub) {
		t.Fatal("Nix's signature does not verify against our fingerprint")
	}
}

func equalNarInfo(a, b *NarInfo) bool {
	ma, erra := a.MarshalText()
	mb, errb := b.MarshalText()
	return erra == nil && errb == nil && bytes.Equal(ma, mb) && a.Deriver == b.Deriver
}

func TestNarInfoMarshalOrder(t *testing.T) {
	sk, err := GenerateKey("b-key")
	if err != nil {
		t.Fatal(err)
	}
	ni := &NarInfo{
		CA:          "fixed:r:sha256:0wgfzzalj4swj4k3d14zv0ynf3hhsp5q3z6km1n2f3wcdifw7y4a",
		Sigs:        []string{"z-key:" + strings.Repeat("A", 86) + "=="},
		Deriver:     "3bg33srm85jxx662i9qk4qlvkqimzllk-x.drv",
		References:  []string{"dwycdyjrq46n5jwam106ysjkclk3rvzv-y", "3bg33srm85jxx662i9qk4qlvkqimzllk-x"},
		NarSize:     456,
		NarHash:     "sha256:0wgfzzalj4swj4k3d14zv0ynf3hhsp5q3z6km1n2f3wcdifw7y4a",
		FileSize:    137,
		FileHash:    "sha256:0g31k6ghp1b7qijqlgh7xqh0dj93vbrzzbc5fnaiiysgycl8f3nw",
		Compression: "zstd",
		URL:         "nar/0g31k6ghp1b7qijqlgh7xqh0dj93vbrzzbc5fnaiiysgycl8f3nw.nar.zst",
		StorePath:   "/nix/store/994w4dfq60x9pxcz5v2ca1n1ax86hdhv-t1",
	}
	if err := ni.Sign(sk); err != nil {
		t.Fatal(err)
	}
	if err := ni.Sign(sk); err != nil { // re-signing replaces, never duplicates
		t.Fatal(err)
	}
	out, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	want := "StorePath: /nix/store/994w4dfq60x9pxcz5v2ca1n1ax86hdhv-t1\n" +
		"URL: nar/0g31k6ghp1b7qijqlgh7xqh0dj93vbrzzbc5fnaiiysgycl8f3nw.nar.zst\n" +
		"Compression: zstd\n" +
		"FileHash: sha256:0g31k6ghp1b7qijqlgh7xqh0dj93vbrzzbc5fnaiiysgycl8f3nw\n" +
		"FileSize: 137\n" +
		"NarHash: sha256:0wgfzzalj4swj4k3d14zv0ynf3hhsp5q3z6km1n2f3wcdifw7y4a\n" +
		"NarSize: 456\n" +
		"References: 3bg33srm85jxx662i9qk4qlvkqimzllk-x dwycdyjrq46n5jwam106ysjkclk3rvzv-y\n" +
		"Deriver: 3bg33srm85jxx662i9qk4qlvkqimzllk-x.drv\n" +
		"Sig: " + ni.Sigs[1] + "\n" +
		"Sig: z-key:" + strings.Repeat("A", 86) + "==\n" +
		"CA: fixed:r:sha256:0wgfzzalj4swj4k3d14zv0ynf3hhsp5q3z6km1n2f3wcdifw7y4a\n"
	if string(out) != want {
		t.Fatalf("MarshalText:\n%s\nwant:\n%s", out, want)
	}
	if !ni.Verify(sk.Public()) {
		t.Fatal("Verify rejected our own signature")
	}
	back, err := ParseNarInfo(out)
	if err != nil || !equalNarInfo(back, ni) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}

	// References is written even when empty, exactly as Nix does ("References: ").
	ni.References, ni.Deriver, ni.Sigs, ni.CA = nil, "", nil, ""
	out, err = ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(out), "NarSize: 456\nReferences: \n") {
		t.Fatalf("MarshalText without references:\n%q", out)
	}
}

func TestParseNarInfoRejects(t *testing.T) {
	good := strings.Split(strings.TrimSuffix(nixNarInfo, "\n"), "\n")
	edit := func(f func(lines []string) []string) string {
		return strings.Join(f(append([]string{}, good...)), "\n") + "\n"
	}
	replace := func(key, line string) string {
		return edit(func(ls []string) []string {
			for i, l := range ls {
				if strings.HasPrefix(l, key+": ") {
					ls[i] = line
				}
			}
			return ls
		})
	}
	drop := func(key string) string { return replace(key, "X-Dropped: yes") }
	tests := map[string]string{
		"empty":                 "",
		"no final newline":      strings.TrimSuffix(nixNarInfo, "\n"),
		"missing StorePath":     drop("StorePath"),
		"missing URL":           drop("URL"),
		"missing NarHash":       drop("NarHash"),
		"missing NarSize":       drop("NarSize"),
		"bad store path":        replace("StorePath", "StorePath: /nix/store/xyz-x"),
		"relative store path":   replace("StorePath", "StorePath: 3bg33srm85jxx662i9qk4qlvkqimzllk-x"),
		"empty URL":             replace("URL", "URL: "),
		"hex NarHash":           replace("NarHash", "NarHash: sha256:"+strings.Repeat("0", 64)),
		"md5 NarHash":           replace("NarHash", "NarHash: md5:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3"),
		"short FileHash":        replace("FileHash", "FileHash: sha256:1afvsx5h64"),
		"zero NarSize":          replace("NarSize", "NarSize: 0"),
		"negative NarSize":      replace("NarSize", "NarSize: -1"),
		"padded NarSize":        replace("NarSize", "NarSize: 0160"),
		"junk FileSize":         replace("FileSize", "FileSize: 12k"),
		"bad reference":         replace("References", "References: /nix/store/dwycdyjrq46n5jwam106ysjkclk3rvzv-y"),
		"bad deriver":           replace("References", "References: \nDeriver: x.drv"),
		"bad sig":               replace("Sig", "Sig: test-1:notbase64!"),
		"unnamed sig":           replace("Sig", "Sig: 8FpW1B19pMEpi7R6CnnJctPrXIQ5"),
		"bad CA":                replace("CA", "CA: sha256:010bczvvk46bdhhll49wi83pbcik988gz3mgpzwlxsam8ajgjarj"),
		"duplicate NarSize":     replace("NarSize", "NarSize: 160\nNarSize: 161"),
		"no space after colon":  replace("URL", "URL:nar/x.nar.zst"),
		"line without colon":    replace("CA", "garbage"),
		"blank line":            replace("CA", ""),
		"empty compression":     replace("Compression", "Compression: "),
		"whitespace in URL":     replace("URL", "URL: nar/a b"),
		"nul byte in reference": replace("References", "References: dwycdyjrq46n5jwam106ysjkclk3rvzv-\x00"),
	}
	for name, text := range tests {
		t.Run(name, func(t *testing.T) {
			if ni, err := ParseNarInfo([]byte(text)); err == nil {
				t.Fatalf("ParseNarInfo accepted:\n%s\n→ %+v", text, ni)
			} else if !strings.HasPrefix(err.Error(), "parse narinfo: ") {
				t.Fatalf("error %q lacks the parse narinfo prefix", err)
			}
		})
	}
}

func TestParseNarInfoLenient(t *testing.T) {
	// Unknown keys are ignored, a missing Compression means bzip2, "unknown-deriver" means
	// none, and several signatures are kept.
	text := strings.Replace(nixNarInfo, "Compression: zstd\n", "System: x86_64-linux\n", 1) +
		"Deriver: unknown-deriver\nSig: other-1:" + strings.Repeat("A", 86) + "==\n"
	ni, err := ParseNarInfo([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if ni.Compression != "bzip2" || ni.Deriver != "" || len(ni.Sigs) != 2 {
		t.Fatalf("got %+v", ni)
	}
}

func TestFingerprintValidates(t *testing.T) {
	const (
		sp  = "/nix/store/3bg33srm85jxx662i9qk4qlvkqimzllk-x"
		nh  = "sha256:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3"
		ref = "dwycdyjrq46n5jwam106ysjkclk3rvzv-y"
	)
	// References are sorted and de-duplicated, as in Nix's set.
	fp, err := Fingerprint(sp, nh, 160, []string{ref, "3bg33srm85jxx662i9qk4qlvkqimzllk-x", ref})
	if err != nil {
		t.Fatal(err)
	}
	if want := "1;" + sp + ";" + nh + ";160;" + sp + ",/nix/store/" + ref; fp != want {
		t.Fatalf("Fingerprint = %q, want %q", fp, want)
	}
	if fp, err := Fingerprint(sp, nh, 160, nil); err != nil || fp != "1;"+sp+";"+nh+";160;" {
		t.Fatalf("Fingerprint without refs = %q, %v", fp, err)
	}
	for name, args := range map[string]struct {
		sp, nh string
		size   int64
		refs   []string
	}{
		"bad store path":    {"/nix/store/x", nh, 160, nil},
		"hex hash":          {sp, "sha256:" + strings.Repeat("0", 64), 160, nil},
		"no algorithm":      {sp, strings.TrimPrefix(nh, "sha256:"), 160, nil},
		"sri hash":          {sp, "sha256-wxpjmiRonU1pEHa++IGqqfVBekfv5o7Pa077nzFEuho=", 160, nil},
		"zero size":         {sp, nh, 0, nil},
		"full path ref":     {sp, nh, 160, []string{"/nix/store/" + ref}},
		"invalid character": {sp, strings.Replace(nh, "0", "e", 1), 160, nil},
	} {
		if fp, err := Fingerprint(args.sp, args.nh, args.size, args.refs); err == nil {
			t.Errorf("%s: Fingerprint = %q, want error", name, fp)
		}
	}
}

// TestNixCopyNarInfo has real Nix write a zstd binary cache with signatures and checks that
// we parse and re-marshal every narinfo byte for byte, verify Nix's signatures with our
// fingerprint, and that Nix's NAR files are what WriteNAR produces.
func TestNixCopyNarInfo(t *testing.T) {
	paths := addTestPaths(t)
	secret := runNix(t, "nix", "key", "generate-secret", "--key-name", "nix-copy-test-1")
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "secret")
	writeFile(t, keyFile, []byte(secret), 0o600)
	sk, err := ParseSecretKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	runNix(t, "nix", append([]string{"copy", "--to", "file://" + cache + "?compression=zstd&secret-key=" + keyFile}, paths...)...)

	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for _, p := range paths {
		sp, err := ParseStorePath(p)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(cache, sp.Hash+".narinfo"))
		if err != nil {
			t.Fatal(err)
		}
		ni, err := ParseNarInfo(raw)
		if err != nil {
			t.Fatalf("%s: %v\n%s", p, err, raw)
		}
		out, err := ni.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, raw) {
			t.Errorf("%s: re-marshalled narinfo differs\n ours:\n%s\n nix:\n%s", p, out, raw)
		}
		if !ni.Verify(sk.Public()) {
			t.Errorf("%s: Nix's signature %v does not verify with our fingerprint", p, ni.Sigs)
		}
		if hash, size, err := HashNAR(p); err != nil || hash != ni.NarHash || size != ni.NarSize {
			t.Errorf("%s: HashNAR = %s/%d/%v, Nix's narinfo says %s/%d", p, hash, size, err, ni.NarHash, ni.NarSize)
		}
		nar, err := dec.DecodeAll([]byte(mustRead(t, filepath.Join(cache, ni.URL))), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(nar, narBytes(t, p)) {
			t.Errorf("%s: Nix's NAR file differs from WriteNAR", p)
		}
	}
}
