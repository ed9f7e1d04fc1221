package nodetoken

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestIssueVerify(t *testing.T) {
	k, err := NewKey("cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewKey("another-secret-0123456789")
	tok, err := k.Issue(Identity{NodeID: "build-1", Roles: []string{"builder", "evaluator", "builder"}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := k.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeID != "build-1" || !slices.Equal(id.Roles, []string{"builder", "evaluator"}) {
		t.Fatalf("identity %+v", id)
	}
	mac := tok[strings.LastIndexByte(tok, ':')+1:]
	for _, tt := range []struct {
		name, token string
	}{
		{"another node id", "hci1:build-2:builder,evaluator:" + mac},
		{"a higher role", "hci1:build-1:builder,evaluator,signer:" + mac},
		{"fewer roles", "hci1:build-1:builder:" + mac},
		{"unsorted roles", "hci1:build-1:evaluator,builder:" + mac},
		{"no mac", "hci1:build-1:builder,evaluator:"},
		{"wrong version", "hci0:build-1:builder,evaluator:" + mac},
		{"extra field", tok + ":x"},
		{"empty", ""},
		{"bad node id", "hci1:../x:builder:" + mac},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := k.Verify(tt.token); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Verify(%q) = %v, want ErrInvalid", tt.token, err)
			}
		})
	}
	if _, err := other.Verify(tok); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a token verified under another cluster secret: %v", err)
	}
	if got, err := Parse(tok); err != nil || got.NodeID != "build-1" {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
	if _, err := NewKey("short"); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
}
