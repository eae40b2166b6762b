package control

import (
	"context"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/inplaced/inplaced/pkg/caller"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// auditor writes one line per control call when it ends: who (uid, pid,
// executable), what (method and request, secrets removed), the gRPC code
// and how long it took.
type auditor struct{ log *zap.Logger }

func (a auditor) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	a.write(ctx, info.FullMethod, req, err, start)
	return resp, err
}

func (a auditor) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	rs := &recvSpy{ServerStream: ss}
	err := handler(srv, rs)
	a.write(ss.Context(), info.FullMethod, rs.first, err, start)
	return err
}

// recvSpy keeps the first message a streaming call received: the request.
type recvSpy struct {
	grpc.ServerStream
	first any
}

func (r *recvSpy) RecvMsg(m any) error {
	err := r.ServerStream.RecvMsg(m)
	if err == nil && r.first == nil {
		r.first = m
	}
	return err
}

func (a auditor) write(ctx context.Context, method string, req any, err error, start time.Time) {
	c := caller.FromContext(ctx)
	fields := []zap.Field{
		zap.String("method", method),
		zap.Int64("uid", c.UID), zap.Int64("pid", c.PID), zap.String("exe", c.Exe),
		zap.String("code", status.Code(err).String()),
		zap.Duration("duration", time.Since(start)),
	}
	if m, ok := req.(proto.Message); ok {
		fields = append(fields, zap.Any("request", jsonRaw(redact(m))))
	}
	if err != nil {
		fields = append(fields, zap.String("error", status.Convert(err).Message()))
	}
	a.log.Info("control call", fields...)
}

// jsonRaw logs as an embedded JSON object.
type jsonRaw []byte

func (j jsonRaw) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("{}"), nil
	}
	return j, nil
}

// Redacted replaces a secret's value in the audit log.
const Redacted = "<redacted>"

// redact returns the request as JSON with the secrets taken out: registry
// credentials (only the server address is kept) and the values of env
// variables (they often are secrets; the keys stay).
func redact(m proto.Message) []byte {
	c := proto.Clone(m)
	scrub(c.ProtoReflect())
	b, _ := protojson.MarshalOptions{UseProtoNames: true}.Marshal(c)
	return b
}

var registryAuthName = (&inplacedv1.RegistryAuth{}).ProtoReflect().Descriptor().FullName()

func scrub(m protoreflect.Message) {
	if m.Descriptor().FullName() == registryAuthName {
		m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			if fd.Name() != "server_address" {
				m.Set(fd, protoreflect.ValueOfString(Redacted))
			}
			return true
		})
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap() && fd.Name() == "set_env":
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				mp.Set(k, protoreflect.ValueOfString(Redacted))
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				scrub(l.Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			scrub(v.Message())
		}
		return true
	})
}
