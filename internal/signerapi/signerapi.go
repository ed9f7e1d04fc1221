// Package signerapi owns the signer's wire format: the JSON requests and answers of its HTTP
// API, shared by the server (package signer) and its client (package signerclient). Every
// request carries the caller's node token (Authorization: Bearer) and the claim it acts under:
// a builder's job claim or an evaluator's evaluation claim. The node is the token's, never the
// body's.
package signerapi

import (
	"net/http"
	"time"
)

// MaxRequestBody bounds a request body; a larger one is answered 413.
const MaxRequestBody = 16 << 20

// JobClaim is a builder's claim of a build job on the wire: the job and the attempt it claimed
// (the node is the token's). Go code holds a queue.Claim and converts at the API's edge.
type JobClaim struct {
	ID      int64 `json:"id"`
	Attempt int   `json:"attempt"`
}

// EvalClaim is an evaluator's claim of an evaluation.
type EvalClaim struct {
	ID      int64 `json:"id"`
	Attempt int   `json:"attempt"`
}

// Output is one store path to publish.
type Output struct {
	StorePath  string   `json:"store_path"`
	NarHash    string   `json:"nar_hash"` // "sha256:<nix32>"
	NarSize    int64    `json:"nar_size"`
	FileHash   string   `json:"file_hash"` // "sha256:<nix32>" of the .nar.zst
	FileSize   int64    `json:"file_size"`
	References []string `json:"references"`        // store paths or basenames
	Deriver    string   `json:"deriver,omitempty"` // basename (a full path is accepted)
}

// LogUpload asks for a presigned upload of a build's log (zstd), stored at log/<drv basename>.
type LogUpload struct {
	Key    string `json:"key"` // log/<the job's drv basename>
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

// UploadSlotsRequest is the body of POST /api/upload-slots: a builder's outputs and log under
// Job, or an evaluator's sources under Eval. Exactly one of Job and Eval is set.
type UploadSlotsRequest struct {
	Job     *JobClaim  `json:"job,omitempty"`
	Eval    *EvalClaim `json:"eval,omitempty"`
	Outputs []Output   `json:"outputs"`
	Log     *LogUpload `json:"log,omitempty"`
}

// Upload is a presigned upload: PUT the exact body to URL with every header in Headers
// (a Go client sets http.Request.ContentLength instead of the Content-Length header).
type Upload struct {
	URL     string      `json:"url"`
	Method  string      `json:"method"`
	Headers http.Header `json:"headers"`
	Expires time.Time   `json:"expires"`
}

// OutputSlot answers for one output: skipped (the store has the file) or where to upload it.
type OutputSlot struct {
	StorePath string  `json:"store_path"`
	Skipped   bool    `json:"skipped"`
	Upload    *Upload `json:"upload,omitempty"`
}

// UploadSlotsResponse is the answer to POST /api/upload-slots, outputs in request order.
type UploadSlotsResponse struct {
	Outputs []OutputSlot `json:"outputs"`
	Log     *Upload      `json:"log,omitempty"`
}

// BuildCompleteRequest is the body of POST /api/build-complete: the outputs of the claimed job,
// uploaded, and its log key if its log was uploaded.
type BuildCompleteRequest struct {
	Job     JobClaim `json:"job"`
	Outputs []Output `json:"outputs"`
	LogKey  string   `json:"log_key,omitempty"`
}

// DerivationText is a .drv file: the signer recomputes its store path from the text.
type DerivationText struct {
	StorePath string `json:"store_path"`
	Text      string `json:"text"`
}

// PublishRequest is the body of POST /api/publish: an evaluator publishes the .drv files and
// sources of the evaluation it holds. Derivations come as their text (the signer writes their
// NARs); sources are uploaded first (upload-slots with Eval) and read back by the signer.
// Everything published is content-addressed, and checked to be.
type PublishRequest struct {
	Eval        EvalClaim        `json:"eval"`
	Sources     []Output         `json:"sources"`
	Derivations []DerivationText `json:"derivations"`
}

// PublishResponse counts narinfos written, already present with the same NarHash (skipped), and
// already present with a different NarHash (conflicts, left unchanged).
type PublishResponse struct {
	Written   int `json:"written"`
	Skipped   int `json:"skipped"`
	Conflicts int `json:"conflicts"`
}

// BuildCompleteResponse is PublishResponse for a build's outputs.
type BuildCompleteResponse = PublishResponse

// CacheLookupRequest asks which store paths the cache holds (has a narinfo for).
type CacheLookupRequest struct {
	StorePaths []string `json:"store_paths"`
}

// CacheLookupResponse lists the store paths of the request that the cache holds.
type CacheLookupResponse struct {
	Present []string `json:"present"`
}

// MaxLookup bounds the store paths of one cache lookup.
const MaxLookup = 1000

// ErrorResponse is the JSON of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
}

// TicketLifetime is how long an evaluation ticket is good: long enough for the evaluator to
// show it to a frontend, which asks a signer about it at once.
const TicketLifetime = 2 * time.Minute

// EvalTicketRequest asks for a ticket proving that the caller holds an evaluation
// (POST /api/eval-ticket, evaluator role), which it shows to a frontend for the evaluation's
// read credential instead of its node token.
type EvalTicketRequest struct {
	Eval EvalClaim `json:"eval"`
}

// EvalTicketResponse is the ticket (package nodetoken's format) and when it expires.
type EvalTicketResponse struct {
	Ticket  string    `json:"ticket"`
	Expires time.Time `json:"expires"`
}

// CheckTicketRequest asks whether a ticket is one this cluster's signers issued and whether
// its evaluation is still running under the claim it names (POST /api/eval-ticket/check,
// frontend role).
type CheckTicketRequest struct {
	Ticket string `json:"ticket"`
}

// CheckTicketResponse is the claim a good ticket names (a bad one is a 403, a finished or
// reassigned evaluation a 409).
type CheckTicketResponse struct {
	Node string    `json:"node"`
	Eval EvalClaim `json:"eval"`
}

// CheckNodeTokenRequest asks whether a node token is one this cluster's signers issued (POST
// /api/node-token/check, cache role): a cache node without the cluster secret cannot verify
// the builders' and evaluators' tokens that read private paths itself.
type CheckNodeTokenRequest struct {
	Token string `json:"token"`
}

// CheckNodeTokenResponse is the identity a good token carries (a bad one is a 403).
type CheckNodeTokenResponse struct {
	Node  string   `json:"node"`
	Roles []string `json:"roles"`
}
