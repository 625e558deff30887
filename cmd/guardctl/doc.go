// Command guardctl shows who holds the locks of a guard backend, and force-releases a stuck
// one.
//
// Usage:
//
//	guardctl [flags] list [prefix] | show NAME | release NAME | watch [prefix]
//
// The backend is named by a URL (-backend, or $GUARDCTL_BACKEND) — Redis single, Cluster or
// Sentinel, MongoDB, PostgreSQL, MySQL or MariaDB — and guardctl -h lists the URL forms and
// the flags. guardctl uses the store only through guard.Inspector.
//
// docs/operations.md shows each command with its output, and has the runbook for a lock that
// looks stuck: what to check before a force-release, and why a force-release is safe.
package main
