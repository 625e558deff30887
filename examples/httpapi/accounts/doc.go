// Package accounts is the service of the httpapi example: accounts of tenants, with deposit,
// withdraw and balance over HTTP, whose mutating routes run under a distributed lock per
// account.
//
//	POST /accounts/{id}/deposit   {"amount": 100}   X-Tenant: acme
//	POST /accounts/{id}/withdraw  {"amount": 30}    X-Tenant: acme
//	GET  /accounts/{id}                             X-Tenant: acme
//
// The lock is declared once, on the routes, with middleware.Lock and the template
// LockTemplate ("tenant:{header.X-Tenant}:account:{id}"): two requests on one account of one
// tenant never run at the same time, a request waits up to two seconds for the one before it
// (then gets 423 Locked), and requests on other accounts run in parallel. The middleware wraps
// each route (chi's r.With), not the router: before routing there is no {id}.
//
// The Ledger stands for the database the instances of the service share. It shows fencing:
// a write carries the fence of the lock it was made under (guard.FromContext), and the
// ledger rejects a write whose fence is lower than one it already accepted for that account —
// the write of a holder that paused while its lock expired and someone else took it. It also
// counts overlapping read-modify-writes of one account, which the lock must make impossible.
package accounts
