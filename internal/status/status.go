// Package status owns the words the database stores for the state of a build job, an
// evaluation, a node, a garbage collection run and a build attempt: one typed constant per word, and the sets
// of them (unfinished, terminal) that code tests against, so that no package spells a status or
// a set by hand. The schema's CHECK constraints allow exactly these words; the package's test
// holds the two equal.
//
// The types are strings underneath: they scan from and bind to text columns with pgx, and
// marshal to JSON as the bare word.
package status

// JobStatus is a build job's status (build_jobs.status).
type JobStatus string

// Job statuses. A job is unfinished while pending, building or uploading; every other status
// is terminal, until a rebuild or a new evaluation's enqueue moves it back to pending.
const (
	JobPending   JobStatus = "pending"    // waiting for its inputs or a builder
	JobBuilding  JobStatus = "building"   // claimed: a builder runs it
	JobUploading JobStatus = "uploading"  // built: the builder publishes its outputs
	JobSucceeded JobStatus = "succeeded"  // its outputs are in the cache
	JobFailed    JobStatus = "failed"     // its build failed for good
	JobCancelled JobStatus = "cancelled"  // no evaluation needs it any more, or an operator cancelled it
	JobDepFailed JobStatus = "dep-failed" // an input failed, so it was never built
)

// AllJobs returns every job status, in the order a job can move through them.
func AllJobs() []JobStatus {
	return []JobStatus{JobPending, JobBuilding, JobUploading, JobSucceeded, JobFailed, JobCancelled, JobDepFailed}
}

// UnfinishedJobs returns the statuses of a job that will still change: pending and claimed.
func UnfinishedJobs() []JobStatus { return []JobStatus{JobPending, JobBuilding, JobUploading} }

// TerminalJobs returns the statuses a job ends in.
func TerminalJobs() []JobStatus {
	return []JobStatus{JobSucceeded, JobFailed, JobCancelled, JobDepFailed}
}

// Unfinished reports whether a job in status s will still change by itself.
func (s JobStatus) Unfinished() bool { return s == JobPending || s.Claimed() }

// Terminal reports whether s is a status a job ends in.
func (s JobStatus) Terminal() bool {
	return s == JobSucceeded || s == JobFailed || s == JobCancelled || s == JobDepFailed
}

// Claimed reports whether a builder holds the job: building or uploading. The schema requires
// a claimant for exactly these.
func (s JobStatus) Claimed() bool { return s == JobBuilding || s == JobUploading }

// Failed reports whether the job ended without its outputs through a failure, its own or an
// input's (a cancelled job did not fail).
func (s JobStatus) Failed() bool { return s == JobFailed || s == JobDepFailed }

// EvalStatus is an evaluation's status (evaluations.status).
type EvalStatus string

// Evaluation statuses. An evaluation is unfinished while queued or running; every other
// status is terminal, until a re-evaluation queues the same row again.
const (
	EvalQueued    EvalStatus = "queued"    // waiting for an evaluator
	EvalRunning   EvalStatus = "running"   // claimed: an evaluator runs it
	EvalSucceeded EvalStatus = "succeeded" // evaluated; its jobs are enqueued
	EvalFailed    EvalStatus = "failed"    // Nix or the project's settings failed, or it ran out of time
	EvalCancelled EvalStatus = "cancelled" // cancelled, superseded, or a pull request that does not merge
	EvalSkipped   EvalStatus = "skipped"   // not run: it reuses the attributes of an evaluation of the same tree
)

// AllEvals returns every evaluation status, in the order an evaluation can move through them.
func AllEvals() []EvalStatus {
	return []EvalStatus{EvalQueued, EvalRunning, EvalSucceeded, EvalFailed, EvalCancelled, EvalSkipped}
}

// UnfinishedEvals returns the statuses of an evaluation that will still change.
func UnfinishedEvals() []EvalStatus { return []EvalStatus{EvalQueued, EvalRunning} }

// TerminalEvals returns the statuses an evaluation ends in.
func TerminalEvals() []EvalStatus {
	return []EvalStatus{EvalSucceeded, EvalFailed, EvalCancelled, EvalSkipped}
}

// Unfinished reports whether an evaluation in status s will still change.
func (s EvalStatus) Unfinished() bool { return s == EvalQueued || s == EvalRunning }

// Terminal reports whether s is a status an evaluation ends in.
func (s EvalStatus) Terminal() bool {
	return s == EvalSucceeded || s == EvalFailed || s == EvalCancelled || s == EvalSkipped
}

// NodeStatus is a node's lifecycle status (nodes.status).
type NodeStatus string

// Node statuses, in lifecycle order. An operator's drain request is a separate flag: a node
// can be active and asked to drain.
const (
	NodeJoining  NodeStatus = "joining"  // starting up: registered, its services not all running
	NodeActive   NodeStatus = "active"   // taking work
	NodeDraining NodeStatus = "draining" // finishing its work before leaving; takes none
	NodeDead     NodeStatus = "dead"     // silent too long: the maintenance leader declared it dead
)

// AllNodes returns every node status, in lifecycle order.
func AllNodes() []NodeStatus { return []NodeStatus{NodeJoining, NodeActive, NodeDraining, NodeDead} }

// GCRunStatus is a garbage collection run's status (gc_runs.status).
type GCRunStatus string

// Garbage collection run statuses. A run still running when a new one starts was cut short by
// a lost term and is closed as failed.
const (
	GCRunning   GCRunStatus = "running"   // its term's leader is marking or sweeping
	GCSucceeded GCRunStatus = "succeeded" // it swept the whole cache
	GCFailed    GCRunStatus = "failed"    // its sweep failed or was interrupted
)

// AllGCRuns returns every garbage collection run status.
func AllGCRuns() []GCRunStatus { return []GCRunStatus{GCRunning, GCSucceeded, GCFailed} }

// AttemptStatus is how one claim of a job ended (build_attempts.status).
type AttemptStatus string

// Attempt statuses. An attempt is recorded when it ends; a running one has no row yet.
const (
	AttemptSucceeded   AttemptStatus = "succeeded"   // its outputs were published
	AttemptFailed      AttemptStatus = "failed"      // its build failed (for good, or retried by its policy)
	AttemptCancelled   AttemptStatus = "cancelled"   // the job was cancelled while it ran
	AttemptRetried     AttemptStatus = "retried"     // it failed transiently; the job went back to the queue
	AttemptInterrupted AttemptStatus = "interrupted" // its claim was given back or its node lost, with no result
)

// AllAttempts returns every attempt status.
func AllAttempts() []AttemptStatus {
	return []AttemptStatus{AttemptSucceeded, AttemptFailed, AttemptCancelled, AttemptRetried, AttemptInterrupted}
}

// Failed reports whether the attempt's build failed, for good or transiently.
func (s AttemptStatus) Failed() bool { return s == AttemptFailed || s == AttemptRetried }

// UnitStatus is the status of a unit of an evaluation's attribute tree (eval_units.status).
type UnitStatus string

// Unit statuses.
const (
	UnitQueued  UnitStatus = "queued"  // waiting for an evaluator node
	UnitRunning UnitStatus = "running" // claimed: a walker of that node walks it
	UnitDone    UnitStatus = "done"    // walked, and everything it reported committed
)

// AllUnits returns every unit status, in the order a unit moves through them.
func AllUnits() []UnitStatus { return []UnitStatus{UnitQueued, UnitRunning, UnitDone} }
