package config

import (
	"os"
	"strings"
	"testing"
)

// The README's configuration reference is example.toml verbatim; this keeps the two in step.
func TestReadmeShowsExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```toml\n"+string(example)+"```") {
		t.Fatal("README.md's configuration block differs from internal/config/example.toml; paste the file into the README")
	}
}
