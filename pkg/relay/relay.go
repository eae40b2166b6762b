package relay

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// MaxMsgSize bounds messages in both directions. kubelet uses 16 MiB; a
// ListContainers on a busy node must never be cut by the proxy first.
const MaxMsgSize = 64 << 20

// Flow-control windows of the caller-facing server and of the backend
// client. gRPC's default window is dynamic: the receiver sizes it with a
// BDP ping sent along with received data, which on a local socket is one
// more write, read and wake-up per relayed call on each side of the proxy
// (docs/performance.md, "Static windows"). Static windows, large enough
// that a kubelet-sized ListContainers answer never waits for a
// WINDOW_UPDATE, turn the pings off. A window is credit the peer may use,
// not memory held.
const (
	streamWindow = 16 << 20
	connWindow   = 32 << 20
)

// imageServicePrefix routes ImageService calls to the image backend.
var imageServicePrefix = "/" + runtimeapi.ImageService_ServiceDesc.ServiceName + "/"

// Relay forwards CRI calls to the backend connections.
type Relay struct {
	runtime *grpc.ClientConn
	image   *grpc.ClientConn
	table   Table
	filters map[string]StreamFilter
	gates   map[string]func() bool
	unary   map[string]bool
	routes  map[string]route // the router's view of the above, one lookup per stream
	log     *zap.Logger
	debug   bool // the log wants every call, with the IDs decoded from it
	observe Observer
	abuse   AbuseObserver
	grpcAll bool // every call through grpc-go's server and client (WithGRPCServer)
	// ioTimeout bounds a write to a peer that does not read, and the
	// caller's preface (the const ioTimeout; tests shorten it).
	ioTimeout time.Duration
	// onPause is told of each pause of a paced caller (pacePause; tests).
	onPause func()

	drainOnce sync.Once
	drain     chan struct{} // closed on shutdown: endless streams end
}

// Option configures a Relay.
type Option func(*Relay)

// WithLogger sets the logger; the default is a no-op logger.
func WithLogger(l *zap.Logger) Option { return func(r *Relay) { r.log = l } }

// WithGRPCServer serves every call with grpc-go's server and client, as
// the intercepted methods are served, instead of the HTTP/2 router: the
// fallback should the router misbehave with a caller or a backend
// (config relay: grpc). It costs 3-5x the router's CPU per call
// (docs/architecture.md).
func WithGRPCServer() Option { return func(r *Relay) { r.grpcAll = true } }

// WithImageConn routes ImageService calls to a separate backend.
func WithImageConn(c *grpc.ClientConn) Option { return func(r *Relay) { r.image = c } }

// WithInterceptors installs the interceptor table.
func WithInterceptors(t Table) Option { return func(r *Relay) { r.table = t } }

// StreamFilter sees each message a backend stream sends for one method and
// says whether the caller gets it. It is how the interceptors keep a swap
// out of GetContainerEvents.
type StreamFilter func(ctx context.Context, msg []byte) bool

// WithStreamFilter installs a filter for a streaming method.
func WithStreamFilter(method string, f StreamFilter) Option {
	return func(r *Relay) { r.filters[method] = f }
}

// WithGate makes a method's interceptors apply only while active()
// returns true; otherwise the call takes the pass-through path (gRPC's
// buffers forwarded, no decode, no copy). It is how a read method that only
// needs rewriting during a swap costs nothing the rest of the time.
func WithGate(method string, active func() bool) Option {
	return func(r *Relay) { r.gates[method] = active }
}

func (r *Relay) gatedOff(method string) bool {
	g := r.gates[method]
	return g != nil && !g()
}

// New returns a relay to the runtime backend conn.
func New(runtime *grpc.ClientConn, opts ...Option) *Relay {
	r := &Relay{runtime: runtime, table: Table{}, filters: map[string]StreamFilter{}, gates: map[string]func() bool{}, log: zap.NewNop(), drain: make(chan struct{}),
		ioTimeout: ioTimeout}
	for _, o := range opts {
		o(r)
	}
	if r.image == nil {
		r.image = runtime
	}
	r.unary = unaryMethods()
	r.debug = r.log.Core().Enabled(zapcore.DebugLevel)
	r.routes = r.makeRoutes()
	return r
}

// unaryMethods lists the unary methods of the CRI services this build knows.
// Anything not listed is relayed as a stream, which is correct for any shape.
func unaryMethods() map[string]bool {
	m := map[string]bool{}
	for _, sd := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, md := range sd.Methods {
			m["/"+sd.ServiceName+"/"+md.MethodName] = true
		}
	}
	return m
}

// ServerOptions are the options a grpc.Server needs to serve this relay.
func (r *Relay) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnknownServiceHandler(r.handle),
		grpc.ForceServerCodecV2(codecV2{}),
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
	}
}

// Drain makes the relayed streams that never end by themselves
// (GetContainerEvents: endless, drain.go) end with Unavailable; every other
// call is left to finish, so that a graceful stop can let it.
func (r *Relay) Drain() { r.drainOnce.Do(func() { close(r.drain) }) }

func (r *Relay) conn(method string) *grpc.ClientConn {
	if strings.HasPrefix(method, imageServicePrefix) {
		return r.image
	}
	return r.runtime
}

func (r *Relay) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return status.Error(codes.Internal, "relay: no method in stream")
	}
	start := time.Now()
	ctx := outgoing(ss.Context())
	var err error
	var req []byte
	if r.unary[method] {
		req, err = r.handleUnary(ctx, method, ss)
	} else {
		err = r.handleStream(ctx, method, ss)
	}
	if ce := r.log.Check(zapcore.DebugLevel, "rpc"); ce != nil {
		fields := []zap.Field{
			zap.String("method", method),
			zap.Duration("duration", time.Since(start)),
			zap.String("code", status.Code(err).String()),
		}
		fields = append(fields, idFields(method, req)...)
		if err != nil {
			fields = append(fields, zap.String("error", status.Convert(err).Message()))
		}
		ce.Write(fields...)
	}
	return err
}

func (r *Relay) handleUnary(ctx context.Context, method string, ss grpc.ServerStream) ([]byte, error) {
	if (len(r.table[method]) == 0 || r.gatedOff(method)) && !r.debug {
		return nil, r.passUnary(ctx, method, ss)
	}
	var in Frame
	if err := ss.RecvMsg(&in); err != nil {
		return nil, err
	}
	var header, trailer metadata.MD
	conn := r.conn(method)
	final := func(ctx context.Context, req []byte) ([]byte, error) {
		var out Frame
		err := conn.Invoke(ctx, method, &Frame{Data: req}, &out, grpc.Header(&header), grpc.Trailer(&trailer))
		return out.Data, err
	}
	invoke := Invoker(final)
	if ics := r.table[method]; len(ics) > 0 {
		invoke = chain(ics, final)
	}
	out, err := invoke(ctx, in.Data)
	if len(header) > 0 {
		_ = ss.SetHeader(header)
	}
	if len(trailer) > 0 {
		ss.SetTrailer(trailer)
	}
	if err != nil {
		return in.Data, err
	}
	return in.Data, ss.SendMsg(&Frame{Data: out})
}

// passUnary relays a unary call that nothing looks at: the request and the
// answer stay in gRPC's buffers from the socket they arrived on to the one
// they leave by.
func (r *Relay) passUnary(ctx context.Context, method string, ss grpc.ServerStream) error {
	var in, out passFrame
	defer in.free()
	defer out.free()
	if err := ss.RecvMsg(&in); err != nil {
		return err
	}
	var header, trailer metadata.MD
	err := r.conn(method).Invoke(ctx, method, &in, &out, grpc.Header(&header), grpc.Trailer(&trailer))
	if len(header) > 0 {
		_ = ss.SetHeader(header)
	}
	if len(trailer) > 0 {
		ss.SetTrailer(trailer)
	}
	if err != nil {
		return err
	}
	return ss.SendMsg(&out)
}

var bidi = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// handleStream pumps frames both ways until the backend ends the stream, the
// caller goes away or the relay drains.
func (r *Relay) handleStream(ctx context.Context, method string, ss grpc.ServerStream) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.drainOf(method):
			cancel()
		case <-ctx.Done():
		}
	}()
	cs, err := r.conn(method).NewStream(ctx, bidi, method)
	if err != nil {
		return err
	}
	go forwardRequests(ss, cs, cancel)
	return r.forwardAnswers(ctx, method, ss, cs)
}

// forwardRequests pumps the caller's messages to the backend until the
// caller ends its side (passed on) or fails (the call is cancelled).
func forwardRequests(ss grpc.ServerStream, cs grpc.ClientStream, cancel func()) {
	for {
		var f Frame
		if err := ss.RecvMsg(&f); err != nil {
			if errors.Is(err, io.EOF) {
				_ = cs.CloseSend()
			} else {
				cancel()
			}
			return
		}
		if err := cs.SendMsg(&f); err != nil {
			return // the backend's error surfaces on RecvMsg in forwardAnswers
		}
	}
}

// forwardAnswers pumps the backend's messages to the caller, those the
// method's stream filter lets through, until the backend ends the stream.
func (r *Relay) forwardAnswers(ctx context.Context, method string, ss grpc.ServerStream, cs grpc.ClientStream) error {
	filter := r.filters[method]
	headerSent := false
	for {
		var f Frame
		err := cs.RecvMsg(&f)
		if !headerSent {
			if md, herr := cs.Header(); herr == nil && len(md) > 0 {
				_ = ss.SetHeader(md)
			}
			headerSent = true
		}
		if err != nil {
			return r.streamEnd(ss, cs, method, err)
		}
		if filter != nil && !filter(ctx, f.Data) {
			continue
		}
		if err := ss.SendMsg(&f); err != nil {
			return err
		}
	}
}

// streamEnd is what the caller gets when the backend ended its stream
// with err: the backend's trailers and status, or Unavailable when the
// call was cancelled because the relay drains.
func (r *Relay) streamEnd(ss grpc.ServerStream, cs grpc.ClientStream, method string, err error) error {
	if md := cs.Trailer(); len(md) > 0 {
		ss.SetTrailer(md)
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	if status.Code(err) == codes.Canceled {
		select {
		case <-r.drainOf(method):
			return status.Error(codes.Unavailable, "inplaced is shutting down")
		default:
		}
	}
	return err
}

// outgoing turns the caller's metadata into metadata for the backend call.
// The context keeps the caller's deadline and cancellation.
func outgoing(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	out := make(metadata.MD, len(md))
	for k, v := range md {
		// Transport-level headers are the client connection's own to set.
		if strings.HasPrefix(k, ":") || k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	return metadata.NewOutgoingContext(ctx, out)
}

// FallbackLimits are the limits grpc-go's server advertises and enforces
// when it serves the callers' connections itself (WithGRPCServer): the
// router's stream limit, which grpc-go enforces with REFUSED_STREAM and
// which also bounds its running handlers (grpc-go's answer to
// CVE-2023-44487). Message sizes and windows are ServerOptions'.
func FallbackLimits() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxConcurrentStreams(maxStreams)}
}
