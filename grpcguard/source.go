package grpcguard

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/guardlock/guard/internal/lockname"
)

// call is what a placeholder reads its value from: the call's context (metadata, peer) and,
// for a unary method, its request message.
type call struct {
	ctx context.Context
	req protoreflect.Message // nil for a stream

	noIdentity bool // "{peer}" found no identity: the call is answered Unauthenticated
}

// errMissing is a source's error for a field, metadata key or identity the call does not have.
var errMissing = errors.New("missing")

// errNoIdentity is the source error of "{peer}" for a call without an authenticated peer.
var errNoIdentity = errors.New("no authenticated peer identity")

// binder binds the placeholder keys of one method's template.
type binder struct {
	method   string
	in       protoreflect.MessageDescriptor // nil for a streaming method
	identity func(context.Context) (string, error)
}

// bind returns the source of key: "md.<key>", "peer", or a field path of the request message.
func (b *binder) bind(key string) (lockname.Source[*call], error) {
	switch {
	case strings.HasPrefix(key, "md."):
		return b.metadata(strings.TrimPrefix(key, "md."))
	case key == "peer":
		return b.peer(), nil
	}
	if b.in == nil {
		return nil, errors.New("a stream's messages are not known when it opens: a stream's lock is named " +
			"from its metadata ({md.key}) and its peer ({peer}) only")
	}
	return fieldPath(b.in, key)
}

// metadata returns the source of the incoming metadata key k: its one value.
func (b *binder) metadata(k string) (lockname.Source[*call], error) {
	if k == "" {
		return nil, errors.New("no metadata key after md.")
	}
	if k != strings.ToLower(k) {
		return nil, fmt.Errorf("metadata keys are lower case in gRPC: write md.%s", strings.ToLower(k))
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return nil, fmt.Errorf("%q is not a valid metadata key", k)
		}
	}
	if strings.HasPrefix(k, "grpc-") || k == "te" {
		return nil, fmt.Errorf("gRPC keeps md.%s to itself: a handler never sees it", k)
	}
	return func(c *call) (string, error) {
		vs := metadata.ValueFromIncomingContext(c.ctx, k)
		switch len(vs) {
		case 0:
			return "", errMissing
		case 1:
			return vs[0], nil
		default:
			// Which one names the resource? Refuse rather than pick: one resource, one name.
			return "", fmt.Errorf("%d values, one expected", len(vs))
		}
	}, nil
}

// peer returns the source of "{peer}": the identity function's, else the verified client
// certificate's.
func (b *binder) peer() lockname.Source[*call] {
	return func(c *call) (id string, err error) {
		defer func() { c.noIdentity = err != nil }()
		if b.identity != nil {
			id, err := b.identity(c.ctx)
			if err != nil {
				return "", fmt.Errorf("%w: %v", errNoIdentity, err)
			}
			if id == "" {
				return "", errNoIdentity
			}
			return id, nil
		}
		p, ok := peer.FromContext(c.ctx)
		if !ok {
			return "", errNoIdentity
		}
		tls, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(tls.State.VerifiedChains) == 0 || len(tls.State.VerifiedChains[0]) == 0 {
			return "", errNoIdentity
		}
		if id := certIdentity(tls.State.VerifiedChains[0][0]); id != "" {
			return id, nil
		}
		return "", errNoIdentity
	}
}

// certIdentity is a verified client certificate's identity: its first URI SAN (a SPIFFE ID,
// say), else its subject's common name.
func certIdentity(cert *x509.Certificate) string {
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String()
	}
	return cert.Subject.CommonName
}

// fieldPath returns the source of a dotted path of field names (proto names, as in the .proto
// file) into messages described by in. The path goes through singular message fields and
// ends at a scalar, an enum or a wrapper of google/protobuf/wrappers.proto.
func fieldPath(in protoreflect.MessageDescriptor, path string) (lockname.Source[*call], error) {
	var fields []protoreflect.FieldDescriptor
	md := in
	for i, part := range strings.Split(path, ".") {
		if md == nil {
			return nil, fmt.Errorf("%s is not a message: it has no field %q", strings.Join(strings.Split(path, ".")[:i], "."), part)
		}
		fd := md.Fields().ByName(protoreflect.Name(part))
		if fd == nil {
			if alt := md.Fields().ByJSONName(part); alt != nil {
				return nil, fmt.Errorf("%s has no field %q; its proto name is %q", md.FullName(), part, alt.Name())
			}
			return nil, fmt.Errorf("%s has no field %q", md.FullName(), part)
		}
		if fd.IsList() || fd.IsMap() {
			return nil, fmt.Errorf("%s.%s is repeated: one call would name several resources", md.FullName(), part)
		}
		fields = append(fields, fd)
		md = nil
		if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
			md = fd.Message()
		}
	}
	last := fields[len(fields)-1]
	wrapper := false
	if md != nil {
		if !isWrapper(md) {
			return nil, fmt.Errorf("%s is a message (%s): name one of its fields, {%s.field}", path, md.FullName(), path)
		}
		wrapper = true
		last = md.Fields().ByName("value")
	}
	if err := renderable(last); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return func(c *call) (string, error) {
		m := c.req
		for _, fd := range fields {
			// Through unset messages and to an unset scalar, the value is missing. A scalar
			// without presence (proto3's plain fields) is unset when it holds its default:
			// 0, "" and false cannot be told from a field the client forgot.
			if !m.Has(fd) {
				return "", errMissing
			}
			if fd.Message() == nil {
				return render(fd, m.Get(fd)), nil
			}
			m = m.Get(fd).Message()
		}
		if wrapper {
			// A set wrapper holds a value, its default included: presence is the wrapper's.
			return render(last, m.Get(last)), nil
		}
		return "", errMissing
	}, nil
}

// wrappers are the well-known types that hold one value, from google/protobuf/wrappers.proto.
var wrappers = map[protoreflect.FullName]bool{
	"google.protobuf.StringValue": true, "google.protobuf.BytesValue": true,
	"google.protobuf.Int64Value": true, "google.protobuf.UInt64Value": true,
	"google.protobuf.Int32Value": true, "google.protobuf.UInt32Value": true,
	"google.protobuf.BoolValue": true,
	// DoubleValue and FloatValue are wrappers too; renderable refuses their value.
	"google.protobuf.DoubleValue": true, "google.protobuf.FloatValue": true,
}

func isWrapper(md protoreflect.MessageDescriptor) bool { return wrappers[md.FullName()] }

// renderable refuses the kinds of value that name no resource exactly.
func renderable(fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return fmt.Errorf("a %s field names no resource exactly", fd.Kind())
	}
	return nil
}

// render formats a scalar value: strings as they are, integers in decimal, bools as
// true/false, enums by their number, bytes in unpadded URL-safe base64.
func render(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return v.String()
	case protoreflect.BytesKind:
		return base64.RawURLEncoding.EncodeToString(v.Bytes())
	case protoreflect.BoolKind:
		return strconv.FormatBool(v.Bool())
	case protoreflect.EnumKind:
		// By number, as on the wire: a value's name can change (or be unknown to an older
		// server) while the number stays, and servers of two versions must agree on names.
		return strconv.FormatInt(int64(v.Enum()), 10)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.FormatInt(v.Int(), 10)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.FormatUint(v.Uint(), 10)
	}
	return "" // not reached: fieldPath refused the rest; "" is refused as an empty value
}
