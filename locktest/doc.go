// Package locktest is the conformance suite of guard's backend contract (guard.Backend, and
// guard.Notifier and guard.Inspector when a backend has them). Every store of this module runs
// it, exactly as a third-party store — etcd, DynamoDB, a company's own database — should: build
// a Harness that reaches the backend on a real server, call Run from a test and Bench from a
// benchmark.
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, locktest.Harness{
//			New:       func(tb testing.TB) locktest.Target { … a Store with its own client … },
//			Delete:    func(tb testing.TB, name string) { … remove the lock behind its holder's back … },
//			Overwrite: func(tb testing.TB, name string) { … give it to another token … },
//			Wipe:      func(tb testing.TB) { … lose every lock and fence … },
//		})
//	}
//
// Each test can fail for the reason it names: contention tests contend on one name and detect
// overlap, loss tests hurt the backend behind the holder's back and check that the holder's
// context ends before its lease can, waiting tests check what ended a wait. Run them with
// -race. Bench reports the cost of an uncontended acquire and release, and of a hand-over
// between two instances, in time, allocations and round trips; Handoff measures another lock
// library the same way.
package locktest
