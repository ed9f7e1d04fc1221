// Package cluster is harmonia-ci's membership and coordination through PostgreSQL alone: the
// node registry and heartbeat, fenced leader election per role, leader-only maintenance, and
// the in-flight gate that graceful draining waits on.
//
// # Membership
//
// Each process registers its node id with a fresh incarnation UUID and owns the row from then
// on: heartbeats, status changes and deregistration are guarded by the incarnation. Liveness is
// the database's now() in last_seen; the leader marks silent nodes dead and deletes their rows
// once nothing is claimed in their name.
//
// # Leadership
//
// The leaders row of a role is the authority and its epoch the fencing token; the advisory lock
// on the process's dedicated lock session decides who may start the next epoch. Leader-only
// writes go through Term.RunFenced, which proves the epoch in the same transaction.
package cluster
