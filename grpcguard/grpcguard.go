package grpcguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/guardlock/guard"
	"github.com/guardlock/guard/internal/lockname"
)

// Option configures New: a rule per method (Method), and where the methods' descriptors come
// from (Files), how a peer is identified (Identity).
type Option struct {
	set func(*config)
}

type config struct {
	rules    []rule
	files    Resolver
	identity func(context.Context) (string, error)
	idSet    bool
}

type rule struct {
	method, template string
	opts             []guard.LockOption
}

// Resolver finds the descriptors of services: protoregistry.GlobalFiles, where generated code
// registers its files, or a *protoregistry.Files of one's own.
type Resolver interface {
	FindDescriptorByName(protoreflect.FullName) (protoreflect.Descriptor, error)
}

// Method locks the calls of one method, named by its full name ("/bank.v1.Accounts/Withdraw"
// — grpc.UnaryServerInfo.FullMethod), with the lock that template names. opts are the
// acquisition's options (guard.WaitTime, guard.LeaseTime, guard.MinHold, guard.NoReentry,
// Permits), as for the decorators and the middleware; a method has one rule.
func Method(fullMethod, template string, opts ...guard.LockOption) Option {
	return Option{func(c *config) {
		c.rules = append(c.rules, rule{method: fullMethod, template: template, opts: opts})
	}}
}

// Files makes New look the methods up in r instead of protoregistry.GlobalFiles: for services
// whose descriptors are not registered by generated code.
func Files(r Resolver) Option { return Option{func(c *config) { c.files = r }} }

// Identity replaces how "{peer}" reads the caller's identity — by default the verified TLS
// client certificate's first URI SAN, else its subject's common name — with fn, for
// identities that an authentication interceptor before this one put in the context. fn
// returns "" or an error for a call without one: it is answered Unauthenticated.
func Identity(fn func(ctx context.Context) (string, error)) Option {
	return Option{func(c *config) { c.identity, c.idSet = fn, true }}
}

// LockOption is an option of this package that travels with guard's in a Method's list.
type LockOption struct {
	guard.EmptyLockOption
	permits int
}

// Permits admits n calls at a time per name instead of one: the calls share a semaphore of n
// permits (guard.Guard.Semaphore), each permit a lock of its own. A call that finds every
// permit taken is answered ResourceExhausted instead of Aborted. The backend must hold names
// shared (guard.Sharing).
func Permits(n int) LockOption { return LockOption{permits: n} }

// Interceptors holds the rules New compiled. Its Unary and Stream methods are the server
// interceptors; a method without a rule passes through them untouched.
type Interceptors struct {
	g     *guard.Guard
	rules map[string]*compiled
}

// compiled is one method's rule, ready for calls.
type compiled struct {
	method  string
	namer   *lockname.Namer[*call]
	acq     []guard.LockOption
	permits int
	stream  bool
	in      protoreflect.MessageDescriptor
}

// RuleError reports a rule that New refused, naming its method and template.
type RuleError struct {
	Method   string
	Template string
	Reason   string
}

func (e *RuleError) Error() string {
	if e.Template == "" {
		return fmt.Sprintf("guard/grpcguard: %s: %s", e.Method, e.Reason)
	}
	return fmt.Sprintf("guard/grpcguard: %s %q: %s", e.Method, e.Template, e.Reason)
}

// New compiles the rules of opts for g and checks each against its method's descriptor: the
// method must exist in the resolver (Files, else protoregistry.GlobalFiles), every field its
// template names must exist in the method's request message and hold one value that names a
// resource (not a repeated, map, float or message field other than a wrapper), and a streaming
// method's template may name only metadata and the peer. A refused rule is a *RuleError; a bad
// option a *guard.OptionError.
func New(g *guard.Guard, opts ...Option) (*Interceptors, error) {
	if g == nil {
		return nil, errors.New("guard/grpcguard: nil *guard.Guard")
	}
	cfg := config{files: protoregistry.GlobalFiles}
	for _, o := range opts {
		if o.set != nil {
			o.set(&cfg)
		}
	}
	if cfg.files == nil {
		return nil, errors.New("guard/grpcguard: Files(nil)")
	}
	if cfg.idSet && cfg.identity == nil {
		return nil, errors.New("guard/grpcguard: Identity(nil)")
	}
	ic := &Interceptors{g: g, rules: make(map[string]*compiled, len(cfg.rules))}
	for _, r := range cfg.rules {
		c, err := compile(g, &cfg, r)
		if err != nil {
			return nil, err
		}
		if ic.rules[r.method] != nil {
			return nil, &RuleError{Method: r.method, Reason: "a second rule for the method"}
		}
		ic.rules[r.method] = c
	}
	return ic, nil
}

// compile checks and compiles one rule.
func compile(g *guard.Guard, cfg *config, r rule) (*compiled, error) {
	bad := func(format string, args ...any) error {
		return &RuleError{Method: r.method, Template: r.template, Reason: fmt.Sprintf(format, args...)}
	}
	svc, name, ok := splitMethod(r.method)
	if !ok {
		return nil, bad("not a full method name: want /package.Service/Method")
	}
	d, err := cfg.files.FindDescriptorByName(svc)
	if err != nil {
		return nil, bad("no service %s among the registered descriptors (generated code registers its "+
			"files when its package is imported; or pass Files)", svc)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, bad("%s is not a service", svc)
	}
	md := sd.Methods().ByName(name)
	if md == nil {
		return nil, bad("service %s has no method %s", svc, name)
	}
	c := &compiled{method: r.method, stream: md.IsStreamingClient() || md.IsStreamingServer(), in: md.Input()}
	b := &binder{method: r.method, in: md.Input(), identity: cfg.identity}
	if c.stream {
		b.in = nil
	}
	c.namer, err = lockname.Bind(r.template, b.bind)
	if err != nil {
		reason := err.Error()
		if ne, ok := errors.AsType[*guard.NameError](err); ok {
			reason = ne.Reason
		}
		return nil, bad("%s", reason)
	}
	for _, o := range r.opts {
		if p, ok := o.(LockOption); ok {
			if p.permits < 1 {
				return nil, bad("Permits(%d): fewer than one", p.permits)
			}
			c.permits = p.permits
		}
	}
	c.acq, err = lockname.CallOptions(r.template, r.opts)
	if err != nil {
		return nil, bad("%v", err)
	}
	if c.permits > 0 {
		// The backend must hold names shared: say so now, not on every call.
		if _, err := g.Semaphore("grpcguard-check", c.permits); err != nil {
			return nil, bad("Permits(%d): %v", c.permits, err)
		}
	}
	return c, nil
}

// splitMethod splits "/pkg.Service/Method".
func splitMethod(full string) (protoreflect.FullName, protoreflect.Name, bool) {
	rest, ok := strings.CutPrefix(full, "/")
	if !ok {
		return "", "", false
	}
	svc, name, ok := strings.Cut(rest, "/")
	if !ok || svc == "" || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	s, n := protoreflect.FullName(svc), protoreflect.Name(name)
	if !s.IsValid() || !n.IsValid() {
		return "", "", false
	}
	return s, n, true
}

// Check reports, as a *RuleError for each, the rules whose method srv does not serve: a rule
// for a service that is never registered on the server does nothing, silently. Call it with
// the *grpc.Server once its services are registered.
func (ic *Interceptors) Check(srv interface {
	GetServiceInfo() map[string]grpc.ServiceInfo
}) error {
	served := make(map[string]bool)
	for svc, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			served["/"+svc+"/"+m.Name] = true
		}
	}
	var errs []error
	for _, method := range slices.Sorted(maps.Keys(ic.rules)) {
		if !served[method] {
			errs = append(errs, &RuleError{Method: method, Reason: "the server does not serve this method"})
		}
	}
	return errors.Join(errs...)
}

// Unary returns the unary server interceptor.
func (ic *Interceptors) Unary() grpc.UnaryServerInterceptor {
	return ic.unary
}

// Stream returns the stream server interceptor.
func (ic *Interceptors) Stream() grpc.StreamServerInterceptor {
	return ic.stream
}

func (ic *Interceptors) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c := ic.rules[info.FullMethod]
	if c == nil || c.stream {
		return handler(ctx, req)
	}
	m, ok := req.(proto.Message)
	if !ok || m.ProtoReflect().Descriptor().FullName() != c.in.FullName() {
		// The registered handler decoded another type than the descriptor says: a program
		// error, which every call meets.
		return nil, internalError(c.method, req)
	}
	q := &call{ctx: ctx, req: m.ProtoReflect()}
	name, err := c.namer.Name(q)
	if err != nil {
		return nil, nameStatus(q, err)
	}
	var resp any
	var herr error
	ran := false
	err = ic.do(ctx, c, name, func(ctx context.Context) error {
		ran = true
		resp, herr = handler(ctx, req)
		return herr
	})
	return resp, callStatus(c, ran, herr, err)
}

func (ic *Interceptors) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := ic.rules[info.FullMethod]
	if c == nil || !c.stream {
		return handler(srv, ss)
	}
	q := &call{ctx: ss.Context()}
	name, err := c.namer.Name(q)
	if err != nil {
		return nameStatus(q, err)
	}
	l, err := ic.acquire(ss.Context(), c, name)
	if err != nil {
		return callStatus(c, false, nil, err)
	}
	// The handler runs on a goroutine of its own: a stream's RecvMsg and SendMsg follow the
	// call, not the lock, so a handler blocked in one of them when the lock is lost would hold
	// the call open. Then the call ends at once, Aborted; its stream fails the handler's next
	// read or write, and the lock is given back when the handler returns.
	done := make(chan streamResult, 1)
	go func() {
		var r streamResult
		defer func() {
			if p := recover(); p != nil {
				r = streamResult{panicked: true, panic: p}
			}
			done <- r
		}()
		r.err = handler(srv, &lockedStream{ServerStream: ss, ctx: l.Context()})
	}()
	var r streamResult
	select {
	case r = <-done:
	case <-l.Done():
		if !lost(l) {
			r = <-done // the call itself ended (the client left): its handler returns
			break
		}
		go func() {
			r := <-done
			_ = l.Release(context.Background())
			if r.panicked {
				slog.Error(fmt.Sprintf("guard/grpcguard: %s: the handler of a call that lost its lock panicked after the call ended: %v", c.method, r.panic))
			}
		}()
		return lostStatus(c)
	}
	rerr := l.Release(context.Background())
	if r.panicked {
		panic(r.panic) // as if the handler had run on this goroutine: a recovery interceptor sees it
	}
	if lost(l) || errors.Is(rerr, guard.ErrNotHeld) {
		return lostStatus(c)
	}
	return r.err
}

// streamResult is how a stream's handler returned.
type streamResult struct {
	err      error
	panicked bool
	panic    any
}

// lost reports whether l was lost or its lease ran out.
func lost(l *guard.Lock) bool {
	err := l.Err()
	return errors.Is(err, guard.ErrLockLost) || errors.Is(err, guard.ErrLeaseExpired)
}

// acquire takes the rule's lock on name, or a permit of it.
func (ic *Interceptors) acquire(ctx context.Context, c *compiled, name string) (*guard.Lock, error) {
	if c.permits > 0 {
		s, err := ic.g.Semaphore(name, c.permits)
		if err != nil {
			return nil, err
		}
		return s.Acquire(ctx, c.acq...)
	}
	return ic.g.Acquire(ctx, name, c.acq...)
}

// do runs fn under the rule's lock on name.
func (ic *Interceptors) do(ctx context.Context, c *compiled, name string, fn func(context.Context) error) error {
	if c.permits > 0 {
		s, err := ic.g.Semaphore(name, c.permits)
		if err != nil {
			return err
		}
		return s.Do(ctx, fn, c.acq...)
	}
	return ic.g.Do(ctx, name, fn, c.acq...)
}

// lockedStream is a stream whose context is the lock's.
type lockedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *lockedStream) Context() context.Context { return s.ctx }
