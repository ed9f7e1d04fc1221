package nodetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ticketPrefix starts every evaluation ticket.
const ticketPrefix = "hcit1"

// Ticket is what an evaluation ticket asserts: node held attempt Attempt of evaluation EvalID
// when a signer issued it, and it is good until Expires.
type Ticket struct {
	NodeID  string
	EvalID  int64
	Attempt int
	Expires time.Time
}

// IssueTicket returns t as a ticket:
//
//	hcit1:<eval id>:<attempt>:<node id>:<expires, unix seconds>:<base64url mac>
//
// A signer issues one to the evaluator that holds the evaluation (it has checked the claim),
// and the evaluator shows it to a frontend instead of its node token: the frontend, which
// holds no cluster secret, asks a signer whether it is good (VerifyTicket). Its key is derived
// apart from the node tokens' key, so a ticket is never a token and a token never a ticket.
func (k *Key) IssueTicket(t Ticket) (string, error) {
	if !nodeIDPattern.MatchString(t.NodeID) || t.EvalID <= 0 || t.Attempt <= 0 {
		return "", fmt.Errorf("ticket for node %q, evaluation %d attempt %d: not a claim", t.NodeID, t.EvalID, t.Attempt)
	}
	body := strings.Join([]string{ticketPrefix, strconv.FormatInt(t.EvalID, 10), strconv.Itoa(t.Attempt),
		t.NodeID, strconv.FormatInt(t.Expires.Unix(), 10)}, ":")
	return body + ":" + base64.RawURLEncoding.EncodeToString(k.ticketSum(body)), nil
}

// VerifyTicket returns what ticket asserts if a key of this cluster signed it and it has not
// expired at now; an error wrapping ErrInvalid otherwise.
func (k *Key) VerifyTicket(ticket string, now time.Time) (Ticket, error) {
	parts := strings.Split(ticket, ":")
	if len(parts) != 6 || parts[0] != ticketPrefix {
		return Ticket{}, fmt.Errorf("%w: want %s:<evaluation>:<attempt>:<node>:<expires>:<mac>", ErrInvalid, ticketPrefix)
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[5])
	if err != nil || len(mac) != sha256.Size {
		return Ticket{}, fmt.Errorf("%w: malformed ticket mac", ErrInvalid)
	}
	if !hmac.Equal(mac, k.ticketSum(strings.Join(parts[:5], ":"))) {
		return Ticket{}, fmt.Errorf("%w: ticket not signed by this cluster's secret", ErrInvalid)
	}
	id, err1 := strconv.ParseInt(parts[1], 10, 64)
	attempt, err2 := strconv.Atoi(parts[2])
	exp, err3 := strconv.ParseInt(parts[4], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return Ticket{}, fmt.Errorf("%w: malformed ticket", ErrInvalid)
	}
	t := Ticket{NodeID: parts[3], EvalID: id, Attempt: attempt, Expires: time.Unix(exp, 0)}
	if !now.Before(t.Expires) {
		return Ticket{}, fmt.Errorf("%w: ticket expired at %s", ErrInvalid, t.Expires.UTC().Format(time.RFC3339))
	}
	return t, nil
}

func (k *Key) ticketSum(body string) []byte {
	m := hmac.New(sha256.New, k.ticket)
	m.Write([]byte(body))
	return m.Sum(nil)
}
