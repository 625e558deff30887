package grpcguard

import (
	"context"

	"google.golang.org/protobuf/proto"
)

// NameOf renders the lock name of a call of method with req under ctx, as the unary
// interceptor does, for tests that look at names alone.
func (ic *Interceptors) NameOf(ctx context.Context, method string, req proto.Message) (string, error) {
	c := ic.rules[method]
	return c.namer.Name(&call{ctx: ctx, req: req.ProtoReflect()})
}
