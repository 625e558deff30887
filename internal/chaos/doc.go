// Package chaos runs guard under injected faults with real processes and real servers, and
// checks afterwards, from the recorded history, that guard's guarantees held.
//
// A run (Run) starts worker processes — the test binary executed again, each with its own
// Guard and its own client — that contend for a few lock names on one backend. While they
// hold a lock they send fenced writes to a Resource that lives in the coordinator (the test
// process). Every worker prints one JSON line per event (Event): acquire call and grant,
// fence, local validity deadline, the end of the lock's context, release, each write and its
// outcome. The coordinator injects faults chosen from a seed — through a
// testserver.FaultProxy in front of the server (latency, a lost or delayed reply, a
// partition, resets, refused connections), on the server process (SIGSTOP, kill -9 and
// restart, with or without its data) and on the workers (SIGKILL and respawn, SIGSTOP past
// their lease) — and records each of them.
//
// Check then verifies, per lock name:
//
//  1. validity windows of different acquisitions never overlap;
//  2. the lock history is linearizable against a sequential lock with fences (porcupine);
//  3. the Resource accepted writes in fence order only — no stale write accepted — and how
//     many stale writes it rejected;
//  4. no holder's context outlived its server-side lease.
//
// Overlaps that follow a restart which lost the server's data are reported apart
// (Report.DataLossOverlaps): docs/semantics.md documents that two holders are then possible,
// and fencing is what protects the resource — the fence must still increase, which property
// 2 checks.
//
// # Running and replaying
//
// TestChaos runs about 20 s of chaos per backend (Redis, Redis Cluster, MongoDB through
// FerretDB) and prints the seed and a one-line summary per backend; it fails on a broken
// guarantee, with history excerpts and the faults around them. Replay a seed with
//
//	go test -race -run 'TestChaos$/redis$' ./internal/chaos -chaos.seed=N
//
// (or GUARD_CHAOS_SEED=N for go test ./...). The same seed gives the same fault schedule and
// the same choices in every worker; the timing, and so the interleaving, differs from run to
// run. -chaos.duration sets the time per backend, -chaos.workers the number of workers; with
// go test -artifacts the history (history.json) and porcupine's timeline of a failing name
// are kept.
package chaos
