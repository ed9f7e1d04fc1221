package nix

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// NarInfo is the metadata file a binary cache serves as <hash>.narinfo.
type NarInfo struct {
	StorePath   string // full store path
	URL         string // NAR file, relative to the cache root
	Compression string // "zstd", "xz", "none", ...
	FileHash    string // "sha256:<nix32>" of the compressed file
	FileSize    int64
	NarHash     string // "sha256:<nix32>" of the NAR
	NarSize     int64
	References  []string // basenames ("<hash>-<name>")
	Deriver     string   // basename, optional
	Sigs        []string // "keyname:base64"
	CA          string   // content address, optional ("fixed:r:sha256:…", "text:sha256:…")
	// Quarantined marks the narinfo of an output built for a pull request (quarantineKey):
	// harmonia-ci's cache serves it only to those who may read quarantined paths until a
	// trusted evaluation releases the path. Nix ignores keys it does not know, and the
	// signature does not cover it.
	Quarantined bool
}

// quarantineKey is the narinfo key of NarInfo.Quarantined.
const quarantineKey = "HarmoniaQuarantined"

// quarantineLine is how MarshalText writes NarInfo.Quarantined: the last line.
var quarantineLine = []byte("\n" + quarantineKey + ": 1\n")

// NarInfoQuarantined reports whether a narinfo's text, as MarshalText wrote it, is marked
// Quarantined, without parsing it (the cache asks of every narinfo it serves).
func NarInfoQuarantined(text []byte) bool { return bytes.HasSuffix(text, quarantineLine) }

// unknownDeriver is what Nix writes (and reads) for "no deriver".
const unknownDeriver = "unknown-deriver"

// MarshalText renders the narinfo exactly as Nix does: fixed key order, References always
// present (possibly empty), and References and Sig sorted because Nix keeps both in ordered sets.
// The narinfo is validated first so that a cache never publishes one Nix would reject.
func (ni *NarInfo) MarshalText() ([]byte, error) {
	if err := ni.Validate(); err != nil {
		return nil, fmt.Errorf("marshal narinfo: %w", err)
	}
	var b bytes.Buffer
	line := func(k, v string) { b.WriteString(k + ": " + v + "\n") }
	line("StorePath", ni.StorePath)
	line("URL", ni.URL)
	line("Compression", ni.Compression)
	if ni.FileHash != "" {
		line("FileHash", ni.FileHash)
	}
	if ni.FileHash != "" || ni.FileSize != 0 {
		line("FileSize", strconv.FormatInt(ni.FileSize, 10))
	}
	line("NarHash", ni.NarHash)
	line("NarSize", strconv.FormatInt(ni.NarSize, 10))
	line("References", strings.Join(sortedSet(ni.References), " "))
	if ni.Deriver != "" {
		line("Deriver", ni.Deriver)
	}
	for _, s := range sortedSet(ni.Sigs) {
		line("Sig", s)
	}
	if ni.CA != "" {
		line("CA", ni.CA)
	}
	if ni.Quarantined {
		line(quarantineKey, "1")
	}
	return b.Bytes(), nil
}

// sortedSet returns a sorted, de-duplicated copy, mirroring Nix's std::set fields.
func sortedSet(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// Validate checks every field Nix would check when reading the narinfo back.
func (ni *NarInfo) Validate() error {
	if _, err := ParseStorePath(ni.StorePath); err != nil {
		return err
	}
	if ni.URL == "" || strings.ContainsAny(ni.URL, " \t\r\n") {
		return fmt.Errorf("invalid URL %q", ni.URL)
	}
	if ni.Compression == "" || strings.ContainsAny(ni.Compression, " \t\r\n") {
		return fmt.Errorf("invalid Compression %q", ni.Compression)
	}
	if ni.FileHash != "" {
		if _, err := ParseSHA256(ni.FileHash); err != nil {
			return fmt.Errorf("FileHash: %w", err)
		}
	}
	if ni.FileSize < 0 {
		return fmt.Errorf("negative FileSize %d", ni.FileSize)
	}
	if _, err := ParseSHA256(ni.NarHash); err != nil {
		return fmt.Errorf("NarHash: %w", err)
	}
	// Nix treats NarSize 0 as "unknown" and refuses both the narinfo and its fingerprint.
	if ni.NarSize <= 0 {
		return fmt.Errorf("NarSize must be positive, got %d", ni.NarSize)
	}
	for _, r := range ni.References {
		if _, err := ParseStorePathBase(r); err != nil {
			return fmt.Errorf("References: %w", err)
		}
	}
	if ni.Deriver != "" {
		if _, err := ParseStorePathBase(ni.Deriver); err != nil {
			return fmt.Errorf("Deriver: %w", err)
		}
	}
	for _, s := range ni.Sigs {
		if _, _, err := splitSig(s); err != nil {
			return fmt.Errorf("Sig: %w", err)
		}
	}
	if ni.CA != "" && !strings.HasPrefix(ni.CA, "text:") && !strings.HasPrefix(ni.CA, "fixed:") {
		return fmt.Errorf("invalid CA %q: want text:… or fixed:…", ni.CA)
	}
	return nil
}

// ParseNarInfo parses a narinfo file. Unknown keys are ignored (newer Nix versions add some),
// but known keys are validated, may not repeat (except Sig), and StorePath, URL, NarHash and
// NarSize are required. A missing Compression means bzip2, as in Nix.
func ParseNarInfo(data []byte) (*NarInfo, error) {
	ni := &NarInfo{}
	seen := map[string]bool{}
	text := string(data)
	if !strings.HasSuffix(text, "\n") {
		return nil, errors.New("parse narinfo: empty or missing final newline")
	}
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		key, value, ok := strings.Cut(l, ":")
		if ok && value != "" {
			value, ok = strings.CutPrefix(value, " ")
		}
		if !ok || key == "" {
			return nil, fmt.Errorf("parse narinfo: line %d: want \"Key: value\", got %q", i+1, l)
		}
		if key != "Sig" && seen[key] {
			return nil, fmt.Errorf("parse narinfo: line %d: duplicate %s", i+1, key)
		}
		seen[key] = true
		if err := ni.set(key, value); err != nil {
			return nil, fmt.Errorf("parse narinfo: line %d: %w", i+1, err)
		}
	}
	for _, k := range []string{"StorePath", "URL", "NarHash", "NarSize"} {
		if !seen[k] {
			return nil, fmt.Errorf("parse narinfo: missing %s", k)
		}
	}
	if ni.Compression == "" {
		ni.Compression = "bzip2"
	}
	if err := ni.Validate(); err != nil {
		return nil, fmt.Errorf("parse narinfo: %w", err)
	}
	return ni, nil
}

func (ni *NarInfo) set(key, value string) error {
	// Only References may be empty; Nix would read an empty Compression as bzip2, which is never
	// what a writer meant.
	if value == "" && key != "References" {
		return fmt.Errorf("empty %s", key)
	}
	var err error
	switch key {
	case "StorePath":
		ni.StorePath = value
	case "URL":
		ni.URL = value
	case "Compression":
		ni.Compression = value
	case "FileHash":
		ni.FileHash = value
	case "FileSize":
		ni.FileSize, err = parseSize(value)
	case "NarHash":
		ni.NarHash = value
	case "NarSize":
		ni.NarSize, err = parseSize(value)
	case "References":
		ni.References = strings.Fields(value)
	case "Deriver":
		if value != unknownDeriver {
			ni.Deriver = value
		}
	case "Sig":
		ni.Sigs = append(ni.Sigs, value)
	case "CA":
		ni.CA = value
	case quarantineKey:
		ni.Quarantined = value == "1"
	}
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

func parseSize(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || strconv.FormatInt(n, 10) != s {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n, nil
}

// NarURL is where a binary cache keeps a zstd-compressed NAR, relative to the cache root:
// nar/<nix32 file hash>.nar.zst (fileHash as "sha256:<nix32>").
func NarURL(fileHash string) string {
	return "nar/" + strings.TrimPrefix(fileHash, "sha256:") + ".nar.zst"
}

// NewNarInfo describes a store path that CompressNAR turned into s, as a zstd binary cache
// serves it; references are basenames. Sign it before publishing.
func NewNarInfo(storePath string, s Sizes, references []string) *NarInfo {
	return &NarInfo{
		StorePath: storePath, URL: NarURL(s.FileHash), Compression: "zstd",
		FileHash: s.FileHash, FileSize: s.FileSize, NarHash: s.NarHash, NarSize: s.NarSize,
		References: references,
	}
}

// Fingerprint returns the string Nix signs for a store path:
// "1;<store path>;<nar hash>;<nar size>;<comma-separated full reference paths>", with the
// references sorted as Nix's ordered set sorts them. refs are basenames.
func Fingerprint(storePath, narHash string, narSize int64, refs []string) (string, error) {
	if _, err := ParseStorePath(storePath); err != nil {
		return "", fmt.Errorf("fingerprint: %w", err)
	}
	if _, err := ParseSHA256(narHash); err != nil {
		return "", fmt.Errorf("fingerprint: %w", err)
	}
	if narSize <= 0 {
		return "", fmt.Errorf("fingerprint %s: NAR size must be positive, got %d", storePath, narSize)
	}
	full := make([]string, 0, len(refs))
	for _, r := range sortedSet(refs) {
		sp, err := ParseStorePathBase(r)
		if err != nil {
			return "", fmt.Errorf("fingerprint: reference: %w", err)
		}
		full = append(full, sp.String())
	}
	return "1;" + storePath + ";" + narHash + ";" + strconv.FormatInt(narSize, 10) + ";" + strings.Join(full, ","), nil
}

// Fingerprint returns the fingerprint of the narinfo's path (see Fingerprint).
func (ni *NarInfo) Fingerprint() (string, error) {
	return Fingerprint(ni.StorePath, ni.NarHash, ni.NarSize, ni.References)
}

// Sign adds a signature by k, replacing any earlier signature by a key of the same name.
func (ni *NarInfo) Sign(k SecretKey) error {
	fp, err := ni.Fingerprint()
	if err != nil {
		return fmt.Errorf("sign narinfo: %w", err)
	}
	ni.Sigs = slices.DeleteFunc(ni.Sigs, func(s string) bool {
		name, _, _ := strings.Cut(s, ":")
		return name == k.Name
	})
	ni.Sigs = append(ni.Sigs, k.Sign(fp))
	return nil
}

// Verify reports whether any of the narinfo's signatures is a valid signature by k.
func (ni *NarInfo) Verify(k PublicKey) bool {
	fp, err := ni.Fingerprint()
	if err != nil {
		return false
	}
	for _, s := range ni.Sigs {
		if k.Verify(fp, s) {
			return true
		}
	}
	return false
}
