package grpcguard_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/guardlock/guard"
)

// bank is the test service's descriptors, compiled from testdata/bank.proto.
type bank struct {
	files    *protoregistry.Files
	accounts protoreflect.ServiceDescriptor
}

var (
	bankOnce sync.Once
	bankDesc bank
	bankErr  error
)

// loadBank compiles testdata/bank.proto once.
func loadBank(tb testing.TB) bank {
	tb.Helper()
	bankOnce.Do(func() {
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"testdata"}})}
		files, err := c.Compile(context.Background(), "bank.proto")
		if err != nil {
			bankErr = err
			return
		}
		reg := new(protoregistry.Files)
		if err := reg.RegisterFile(files[0]); err != nil {
			bankErr = err
			return
		}
		bankDesc = bank{files: reg, accounts: files[0].Services().ByName("Accounts")}
	})
	require.NoError(tb, bankErr, "compiling testdata/bank.proto")
	return bankDesc
}

// message makes a request or reply of the test service from its JSON form.
func (b bank) message(tb testing.TB, name, json string) *dynamicpb.Message {
	tb.Helper()
	d, err := b.files.FindDescriptorByName(protoreflect.FullName("bank.v1." + name))
	require.NoError(tb, err)
	m := dynamicpb.NewMessage(d.(protoreflect.MessageDescriptor))
	if json != "" {
		require.NoError(tb, protojson.Unmarshal([]byte(json), m))
	}
	return m
}

// handlers are the test service's implementation; nil ones answer with an empty reply.
type handlers struct {
	withdraw func(ctx context.Context, req *dynamicpb.Message) (*dynamicpb.Message, error)
	audit    func(req *dynamicpb.Message, stream grpc.ServerStream) error
	imports  func(stream grpc.ServerStream) error
}

// register registers the test service on s, with h's handlers for Withdraw and Deposit
// (both withdraw), Audit and Import, as generated code would.
func (b bank) register(s *grpc.Server, h *handlers) {
	methods := b.accounts.Methods()
	unary := func(md protoreflect.MethodDescriptor) grpc.MethodDesc {
		full := "/" + string(b.accounts.FullName()) + "/" + string(md.Name())
		return grpc.MethodDesc{MethodName: string(md.Name()), Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := dynamicpb.NewMessage(md.Input())
			if err := dec(in); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) {
				if h.withdraw == nil {
					return dynamicpb.NewMessage(md.Output()), nil
				}
				return h.withdraw(ctx, req.(*dynamicpb.Message))
			}
			if ic == nil {
				return run(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, run)
		}}
	}
	audit := methods.ByName("Audit")
	desc := grpc.ServiceDesc{
		ServiceName: string(b.accounts.FullName()),
		HandlerType: (*any)(nil),
		Methods:     []grpc.MethodDesc{unary(methods.ByName("Withdraw")), unary(methods.ByName("Deposit"))},
		Streams: []grpc.StreamDesc{
			{StreamName: "Audit", ServerStreams: true, Handler: func(srv any, stream grpc.ServerStream) error {
				in := dynamicpb.NewMessage(audit.Input())
				if err := stream.RecvMsg(in); err != nil {
					return err
				}
				if h.audit == nil {
					return nil
				}
				return h.audit(in, stream)
			}},
			{StreamName: "Import", ClientStreams: true, Handler: func(srv any, stream grpc.ServerStream) error {
				if h.imports != nil {
					return h.imports(stream)
				}
				for {
					if err := stream.RecvMsg(dynamicpb.NewMessage(audit.Output())); errors.Is(err, io.EOF) {
						return stream.SendMsg(dynamicpb.NewMessage(methods.ByName("Import").Output()))
					} else if err != nil {
						return err
					}
				}
			}},
		},
		Metadata: "bank.proto",
	}
	s.RegisterService(&desc, struct{}{})
}

// serve starts a gRPC server with the interceptors on a loopback TCP port, and returns a
// client connection to it. Both stop when the test ends.
func serve(t *testing.T, b bank, h *handlers, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer(opts...)
	b.register(s, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		s.Stop()
		<-done
	})
	return conn
}

// fenceReply is a Withdraw reply with the fence of the lock the handler ran under.
func (b bank) fenceReply(tb testing.TB, ctx context.Context) *dynamicpb.Message {
	out := b.message(tb, "WithdrawReply", "")
	if l, ok := guard.FromContext(ctx); ok {
		out.Set(out.Descriptor().Fields().ByName("fence"), protoreflect.ValueOfUint64(l.Fence()))
	}
	return out
}

// hold sleeps for the request's hold_ms, or until ctx ends; it returns ctx's cause then.
func hold(ctx context.Context, req *dynamicpb.Message) error {
	d := time.Duration(req.Get(req.Descriptor().Fields().ByName("hold_ms")).Int()) * time.Millisecond
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func protoValueUint(v uint64) protoreflect.Value { return protoreflect.ValueOfUint64(v) }
