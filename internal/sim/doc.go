// Package sim is the deterministic simulation of guard's engine: several Guards, as processes
// of many goroutines each, run the real Guard code against a simulated backend with the
// semantics of the queueing stores, under testing/synctest's clock, with a seeded workload
// and seeded faults. After each run its history is checked.
//
// The workload: Acquire, TryAcquire, WaitTime and contexts cancelled at any point of a wait
// or of a release; LeaseTime and watchdog locks; MinHold; Extend, shorter and longer;
// re-entry; Do; an Observer that calls back into the Guard (it reads and releases the lock it
// is given, and releases a lock whose loss it hears of).
//
// The faults, in storms between calm spells: a request lost, a reply lost, a reply late past
// the lease, a request slow (so that two replies come in another order than their requests),
// a process paused past its lease or killed (its Guard never closed), the server restarted
// with its state lost (fences floored by its clock), an operator's forced release, a process
// closed and replaced, a Watch slow or failed, notices lost, duplicated or late, and the
// server's clock running up to 0.5% fast or slow.
//
// The checks:
//
//	(a) no two validity windows of one name overlap — a window runs from the grant its
//	    holder learned of to the end of its lock's context (which ends no later than its
//	    local deadline) or its process's death — and each lies within its holder's tenure
//	    as the server saw it;
//	(b) fences strictly increase per name in grant order, and each holder got its own;
//	(c) in calm spells, a name that is free while a live caller waits for it is granted
//	    within a bound: a notice's delay plus a round trip and a jittered wake-up after a
//	    release or the end of a kept MinHold window; half the longest place in a queue more
//	    after a lease ran out;
//	(d) a paused or killed process keeps nothing on the server — no lease, no place in a
//	    queue — once the longest lease it asked for and a request still on the wire could
//	    have run out;
//	(e) a MinHold window is never shortened: the next holder is granted no sooner;
//	(f) every Release, Close and bounded wait returns within its bound, and no goroutine is
//	    left when the run ends (synctest fails the test otherwise).
//
// Windows and windows' checks skip what a restart that lost the server's state, or an
// operator's forced release, broke: docs/semantics.md says two holders are then possible, and
// fences, which (b) checks always, are what protects a resource.
//
// A seed fixes the workload, the fault plan and the network's draws of each process; which
// goroutine runs first within one simulated instant is up to Go's scheduler, so a replay
// (go test ./internal/sim -run TestSimulation -sim.seed=N) reproduces most failures, not all:
// -sim.repeat runs the seed again and again.
package sim
