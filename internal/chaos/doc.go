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
// On a backend that grants shared holds (guard.Sharing), one more goroutine of each worker
// takes permits of a semaphore of two (chaos-sem) and the read and write sides of a read-write
// lock (chaos-rw), holds them briefly — writers send fenced writes — and releases them or lets
// their leases lapse.
//
// Check then verifies, per lock name:
//
//  1. validity windows of different acquisitions never overlap;
//  2. the lock history is linearizable against a sequential lock with fences (porcupine);
//  3. the Resource accepted writes in fence order only — no stale write accepted — and how
//     many stale writes it rejected;
//  4. no holder's context outlived its server-side lease;
//  5. at no permit's grant were more than two permits live, counting each from its grant to the
//     end of its window as property 1 judges it;
//  6. no writer's window intersects another hold of the read-write lock;
//  7. a primitive's fence is above every fence of its name granted before its call began.
//
// Overlaps that follow a restart which lost the server's data are reported apart
// (Report.DataLossOverlaps; Report.PrimDataLoss for properties 5 to 7): docs/semantics.md
// documents that two holders are then possible, and fencing is what protects the resource —
// the fence must still increase, which property 2 checks.
//
// # Running and replaying
//
// TestChaos runs chaos on each backend (Redis, Redis Cluster, MongoDB through FerretDB,
// PostgreSQL, MariaDB): four worker processes of four goroutines each (and one for the
// primitives), mostly quick jobs on four names, for at least 30 s and until the run has seen
// 5,000 mutex grants and 20 faults (up to 150 s). It prints the seed and a one-line summary per backend; it fails on a broken
// guarantee, with history excerpts and the faults around them. Replay a seed with
//
//	go test -race -run 'TestChaos$/redis$' ./internal/chaos -chaos.seed=N
//
// (or GUARD_CHAOS_SEED=N for go test ./...). The same seed gives the same fault schedule and
// the same choices in every worker; the timing, and so the interleaving, differs from run to
// run. -chaos.duration sets the time per backend, -chaos.workers the number of workers,
// -chaos.loops their goroutines, -chaos.acquisitions and -chaos.faults what a run must see; with
// go test -artifacts the history (history.json) and porcupine's timeline of a failing name
// are kept.
package chaos
