package nodetoken

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestTicket(t *testing.T) {
	t.Parallel()
	k, err := NewKey("cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewKey("another-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	want := Ticket{NodeID: "eval-1", EvalID: 42, Attempt: 3, Expires: now.Add(2 * time.Minute)}
	good, err := k.IssueTicket(want)
	if err != nil {
		t.Fatal(err)
	}
	fromOther, err := other.IssueTicket(want)
	if err != nil {
		t.Fatal(err)
	}
	token, err := k.Issue(Identity{NodeID: "eval-1", Roles: []string{"evaluator"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, ticket string
		at           time.Time
		ok           bool
	}{
		{"good", good, now, true},
		{"expired", good, want.Expires, false},
		{"another cluster's", fromOther, now, false},
		{"another evaluation", strings.Replace(good, ":42:", ":43:", 1), now, false},
		{"another attempt", strings.Replace(good, ":3:", ":4:", 1), now, false},
		{"another node", strings.Replace(good, ":eval-1:", ":eval-2:", 1), now, false},
		{"a node token", token, now, false},
		{"garbage", "hcit1:x", now, false},
	}
	for _, tt := range tests {
		got, err := k.VerifyTicket(tt.ticket, tt.at)
		if tt.ok {
			if err != nil || got != want {
				t.Errorf("%s: %+v, %v; want %+v", tt.name, got, err, want)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %+v, %v; want ErrInvalid", tt.name, got, err)
		}
	}
	if _, err := k.Verify(good); err == nil {
		t.Error("a ticket passed as a node token")
	}
	if _, err := k.IssueTicket(Ticket{NodeID: "eval-1", EvalID: 0, Attempt: 1, Expires: now}); err == nil {
		t.Error("a ticket for no evaluation was issued")
	}
}
