package grpcguard

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/guardlock/guard"
)

// The codes, as gRPC's status code guide reads for each case (docs/templates.md, "gRPC", says
// why):
//
//   - the lock is held: Aborted, a concurrency conflict the client may retry at a higher
//     level; every permit taken: ResourceExhausted. Both with a RetryInfo detail carrying the
//     holder's remaining lease, when the backend said it;
//   - a field, metadata key or value the name needs is missing or empty: InvalidArgument; no
//     authenticated identity for "{peer}": Unauthenticated;
//   - the lock lost while the handler ran: Aborted, whatever the handler returned;
//   - the backend unreachable, the Guard closed: Unavailable, which retry policies retry;
//   - the call's own context ended while it waited: Canceled or DeadlineExceeded.

// nameStatus is the status of a call whose lock name cannot be made. Its message carries the
// template's reason, never the call's values.
func nameStatus(c *call, err error) error {
	if c.noIdentity {
		return status.Error(codes.Unauthenticated, "guard: the lock for this call is named after the caller's identity, and the call has none")
	}
	reason := err.Error()
	if ne, ok := errors.AsType[*guard.NameError](err); ok {
		reason = ne.Reason
	}
	return status.Errorf(codes.InvalidArgument, "guard: the lock name for this call cannot be made: %s", reason)
}

// callStatus is what a locked call returns: the handler's own error when it ran and kept its
// lock; otherwise a status that says what the lock did.
func callStatus(c *compiled, ran bool, herr, err error) error {
	if ran {
		if errors.Is(err, guard.ErrLockLost) || errors.Is(err, guard.ErrLeaseExpired) {
			return lostStatus(c)
		}
		return herr
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "guard: the call's deadline passed while it waited for its lock")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "guard: the call was cancelled while it waited for its lock")
	case errors.Is(err, guard.ErrNotAcquired):
		return busy(c, err)
	case errors.Is(err, guard.ErrInvalidName):
		return nameStatus(&call{}, err)
	}
	return status.Error(codes.Unavailable, "guard: the lock service is unavailable; try again later")
}

// lostStatus is the status of a call whose lock was lost while its handler ran.
func lostStatus(c *compiled) error {
	return status.Errorf(codes.Aborted,
		"guard: the lock %q was lost while the call ran, which may not have run alone or to its end", c.namer.String())
}

// busy is the status of a call whose lock another holds.
func busy(c *compiled, err error) error {
	code, msg := codes.Aborted, fmt.Sprintf("guard: another call holds the lock %q; try again later", c.namer.String())
	if c.permits > 0 {
		code, msg = codes.ResourceExhausted, fmt.Sprintf("guard: all %d permits of %q are taken; try again later", c.permits, c.namer.String())
	}
	st := status.New(code, msg)
	if b, ok := errors.AsType[*guard.BusyError](err); ok && b.Remaining > 0 {
		if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(b.Remaining)}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// internalError is the status of a call whose request is not of the method's input type.
func internalError(method string, req any) error {
	return status.Errorf(codes.Internal, "guard: %s: the handler's request is a %T, not the method's input message", method, req)
}
