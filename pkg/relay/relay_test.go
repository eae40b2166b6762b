package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeBackend is a gRPC server that accepts any method as raw frames: it
// records what reached it and answers with a frame that names the method.
type fakeBackend struct {
	mu        sync.Mutex
	calls     map[string]int
	md        map[string]metadata.MD
	hasDL     map[string]bool
	reply     func(method string, req []byte) ([]byte, error)
	streamN   int             // frames a streaming call sends back
	streaming map[string]bool // methods that answer with streamN frames
}

func (b *fakeBackend) handle(_ any, ss grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(ss)
	md, _ := metadata.FromIncomingContext(ss.Context())
	_, hasDL := ss.Context().Deadline()
	b.mu.Lock()
	b.calls[method]++
	b.md[method] = md
	b.hasDL[method] = hasDL
	b.mu.Unlock()
	var in Frame
	if err := ss.RecvMsg(&in); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_ = ss.SetHeader(metadata.Pairs("x-backend-header", "h"))
	ss.SetTrailer(metadata.Pairs("x-backend-trailer", "t"))
	out, err := b.reply(method, in.Data)
	if err != nil {
		return err
	}
	n := 1
	if b.streaming[method] {
		n = b.streamN
	}
	for i := 0; i < n; i++ {
		if err := ss.SendMsg(&Frame{Data: out}); err != nil {
			return err
		}
	}
	return nil
}

func (b *fakeBackend) count(method string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[method]
}

type setup struct {
	backend *fakeBackend
	client  *grpc.ClientConn
	relay   *Relay
	server  *Server
}

func start(t testing.TB, table Table, opts ...Option) *setup {
	t.Helper()
	dir := t.TempDir()
	be := &fakeBackend{
		calls: map[string]int{}, md: map[string]metadata.MD{}, hasDL: map[string]bool{},
		reply: func(method string, req []byte) ([]byte, error) {
			// Version's field 1 is a string: answer with the method name so
			// the caller can prove where its call went.
			resp := &runtimeapi.VersionResponse{Version: method}
			return codec{}.Marshal(resp)
		},
	}
	beSock := filepath.Join(dir, "be.sock")
	beLis, err := net.Listen("unix", beSock)
	if err != nil {
		t.Fatal(err)
	}
	beSrv := grpc.NewServer(grpc.UnknownServiceHandler(be.handle), grpc.ForceServerCodec(codec{}))
	go func() { _ = beSrv.Serve(beLis) }()
	t.Cleanup(beSrv.Stop)

	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := New(conn, append(append(modeOpts(), WithInterceptors(table)), opts...)...)
	pxSock := filepath.Join(dir, "px.sock")
	pxLis, err := net.Listen("unix", pxSock)
	if err != nil {
		t.Fatal(err)
	}
	pxSrv := r.NewServer()
	go func() { _ = pxSrv.Serve(pxLis) }()
	t.Cleanup(pxSrv.Stop)

	client, err := grpc.NewClient("unix://"+pxSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &setup{backend: be, client: client, relay: r, server: pxSrv}
}

// TestEveryMethodReachesBackend walks the CRI service descriptors and proves
// that each method, unary or streaming, and a method this build does not
// know, arrives at the backend and that its answer comes back.
func TestEveryMethodReachesBackend(t *testing.T) {
	s := start(t, nil)
	s.backend.streamN = 3
	var methods []string
	streaming := map[string]bool{}
	s.backend.streaming = streaming
	for _, sd := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, m := range sd.Methods {
			methods = append(methods, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, st := range sd.Streams {
			name := "/" + sd.ServiceName + "/" + st.StreamName
			methods = append(methods, name)
			streaming[name] = true
		}
	}
	// A method of a future CRI version and a service this build never heard of.
	methods = append(methods, "/runtime.v1.RuntimeService/FutureMethod", "/runtime.v2.RuntimeService/Version")
	if len(methods) < 40 {
		t.Fatalf("only %d CRI methods found: descriptor walk is broken", len(methods))
	}
	for _, m := range methods {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if streaming[m] {
			cs, err := s.client.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, m)
			if err != nil {
				t.Fatalf("%s: open stream: %v", m, err)
			}
			if err := cs.SendMsg(&runtimeapi.GetEventsRequest{}); err != nil {
				t.Fatalf("%s: send: %v", m, err)
			}
			_ = cs.CloseSend()
			n := 0
			for {
				var resp runtimeapi.VersionResponse
				if err := cs.RecvMsg(&resp); err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatalf("%s: recv: %v", m, err)
					}
					break
				}
				if resp.Version != m {
					t.Fatalf("%s: answer came from %q", m, resp.Version)
				}
				n++
			}
			if n != 3 {
				t.Fatalf("%s: got %d stream messages, want 3", m, n)
			}
		} else {
			var resp runtimeapi.VersionResponse
			if err := s.client.Invoke(ctx, m, &runtimeapi.VersionRequest{Version: "x"}, &resp); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			if resp.Version != m {
				t.Fatalf("%s: answer came from %q", m, resp.Version)
			}
		}
		cancel()
		if got := s.backend.count(m); got != 1 {
			t.Fatalf("%s reached the backend %d times, want 1", m, got)
		}
	}
}

func TestStatusMetadataDeadlinePassThrough(t *testing.T) {
	s := start(t, nil)
	want := status.New(codes.NotFound, "container \"abc\" not found")
	s.backend.reply = func(string, []byte) ([]byte, error) { return nil, want.Err() }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", "42")
	var header, trailer metadata.MD
	method := runtimeapi.RuntimeService_ContainerStatus_FullMethodName
	err := s.client.Invoke(ctx, method, &runtimeapi.ContainerStatusRequest{ContainerId: "abc"}, &runtimeapi.ContainerStatusResponse{},
		grpc.Header(&header), grpc.Trailer(&trailer))
	st := status.Convert(err)
	if st.Code() != want.Code() || st.Message() != want.Message() {
		t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), want.Code(), want.Message())
	}
	if got := s.backend.md[method].Get("x-request-id"); len(got) != 1 || got[0] != "42" {
		t.Fatalf("metadata not forwarded: %v", s.backend.md[method])
	}
	if !s.backend.hasDL[method] {
		t.Fatal("deadline not forwarded")
	}
	if trailer.Get("x-backend-trailer") == nil {
		t.Fatalf("trailer not returned: %v", trailer)
	}
}

func TestCancellationEndsStream(t *testing.T) {
	s := start(t, nil)
	method := runtimeapi.RuntimeService_GetContainerEvents_FullMethodName
	block := make(chan struct{})
	defer close(block)
	s.backend.reply = func(string, []byte) ([]byte, error) {
		<-block // an event stream with nothing to say yet
		return nil, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := s.client.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(&runtimeapi.GetEventsRequest{})
	time.AfterFunc(100*time.Millisecond, cancel)
	var resp runtimeapi.ContainerEventResponse
	if err := cs.RecvMsg(&resp); status.Code(err) != codes.Canceled {
		t.Fatalf("after cancel got %v, want Canceled", err)
	}
}

func TestDrainEndsStreams(t *testing.T) {
	s := start(t, nil)
	block := make(chan struct{})
	defer close(block)
	s.backend.reply = func(string, []byte) ([]byte, error) { <-block; return nil, nil }
	cs, err := s.client.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true},
		runtimeapi.RuntimeService_GetContainerEvents_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(&runtimeapi.GetEventsRequest{})
	time.AfterFunc(100*time.Millisecond, s.relay.Drain)
	var resp runtimeapi.ContainerEventResponse
	if err := cs.RecvMsg(&resp); status.Code(err) != codes.Unavailable {
		t.Fatalf("after drain got %v, want Unavailable", err)
	}
}

func TestInterceptorSeesTypedRequest(t *testing.T) {
	table := Table{}
	var seen string
	table.Add(runtimeapi.RuntimeService_StartContainer_FullMethodName, Unary(
		func(ctx context.Context, req *runtimeapi.StartContainerRequest,
			next func(context.Context, *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error),
		) (*runtimeapi.StartContainerResponse, error) {
			seen = req.ContainerId
			if req.ContainerId == "refuse" {
				return nil, status.Error(codes.FailedPrecondition, "refused by interceptor")
			}
			return next(ctx, req)
		}))
	s := start(t, table)
	ctx := context.Background()
	rt := runtimeapi.NewRuntimeServiceClient(s.client)
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "c1"}); err != nil {
		t.Fatal(err)
	}
	if seen != "c1" || s.backend.count(runtimeapi.RuntimeService_StartContainer_FullMethodName) != 1 {
		t.Fatalf("interceptor saw %q, backend calls %d", seen, s.backend.count(runtimeapi.RuntimeService_StartContainer_FullMethodName))
	}
	_, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "refuse"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	if s.backend.count(runtimeapi.RuntimeService_StartContainer_FullMethodName) != 1 {
		t.Fatal("a refused call reached the backend")
	}
}

func TestBackendDownIsUnavailable(t *testing.T) {
	dir := t.TempDir()
	conn, err := Dial("unix://" + filepath.Join(dir, "nobody.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("took %v to fail: not prompt", time.Since(start))
	}
}

func TestTarget(t *testing.T) {
	for in, want := range map[string]string{
		"unix:///run/x.sock": "unix:///run/x.sock",
		"/run/x.sock":        "unix:///run/x.sock",
		"tcp://1.2.3.4:5":    "",
		"unix://":            "",
		"relative.sock":      "",
	} {
		got, err := Target(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("Target(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestGateSkipsInterceptor: a gated method's interceptor runs only while its
// gate is open; closed, the call is forwarded untouched.
func TestGateSkipsInterceptor(t *testing.T) {
	method := runtimeapi.RuntimeService_ListContainers_FullMethodName
	// Atomics: the relay's goroutines read and write these, and nothing
	// else orders them with the test's (the relay reads and writes its
	// sockets with raw system calls, which the race detector does not see).
	var calls atomic.Int32
	table := Table{}
	table.Add(method, func(ctx context.Context, req []byte, next Invoker) ([]byte, error) {
		calls.Add(1)
		return next(ctx, req)
	})
	var open atomic.Bool
	s := start(t, table, WithGate(method, open.Load))
	ctx := context.Background()
	// The fake backend answers with a VersionResponse naming the method.
	call := func() error {
		return s.client.Invoke(ctx, method, &runtimeapi.ListContainersRequest{}, &runtimeapi.VersionResponse{})
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 0 || s.backend.count(method) != 1 {
		t.Fatalf("gate closed: interceptor ran %d times, backend saw %d calls", calls.Load(), s.backend.count(method))
	}
	open.Store(true)
	if err := call(); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 || s.backend.count(method) != 2 {
		t.Fatalf("gate open: interceptor ran %d times, backend saw %d calls", calls.Load(), s.backend.count(method))
	}
}
