// Command guardctl shows who holds the locks of a guard backend, and force-releases a stuck
// one.
//
// Usage:
//
//	guardctl [flags] list [prefix] | show NAME | release NAME | watch [prefix]
//
// The backend is named by a URL (-backend, or $GUARDCTL_BACKEND) — Redis single, Cluster or
// Sentinel, MongoDB, PostgreSQL, MySQL or MariaDB, etcd — or a libpq or go-sql-driver DSN, and
// guardctl -h lists the forms and the flags. guardctl never prints the secrets they hold.
// guardctl uses the store only through guard.Inspector.
//
// The [operations guide] shows each command with its output, and has the runbook for a lock
// that looks stuck: what to check before a force-release, and why a force-release is safe.
//
// [operations guide]: https://github.com/guardlock/guard/blob/main/docs/operations.md
package main
