package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestLargeMessagesBothWays: messages much larger than the caller's
// default 64 KiB window and the HTTP/2 frame size, both ways, on many
// concurrent streams, through the pass-through and the intercepted path.
func TestLargeMessagesBothWays(t *testing.T) {
	table := Table{}
	intercepted := runtimeapi.RuntimeService_StartContainer_FullMethodName
	table.Add(intercepted, func(ctx context.Context, req []byte, next Invoker) ([]byte, error) { return next(ctx, req) })
	s := start(t, table)
	s.backend.reply = func(_ string, req []byte) ([]byte, error) {
		var in runtimeapi.VersionRequest
		if err := (codec{}).Unmarshal(req, &in); err != nil {
			return nil, err
		}
		// Answer 3× the request: the response direction carries more.
		return codec{}.Marshal(&runtimeapi.VersionResponse{Version: in.Version + in.Version + in.Version})
	}
	var wg sync.WaitGroup
	errc := make(chan error, 32)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			method := runtimeapi.RuntimeService_Version_FullMethodName
			if g%4 == 0 {
				method = intercepted
			}
			for i := range 3 {
				size := (g*3 + i + 1) * 27_000 // answers up to 3.9 MB: under the 4 MiB default of the client and the fake backend
				req := &runtimeapi.VersionRequest{Version: string(bytes.Repeat([]byte{'a' + byte(g)}, size))}
				var resp runtimeapi.VersionResponse
				if err := s.client.Invoke(context.Background(), method, req, &resp); err != nil {
					errc <- fmt.Errorf("%s %d bytes: %w", method, size, err)
					return
				}
				if len(resp.Version) != 3*size || resp.Version[0] != 'a'+byte(g) {
					errc <- fmt.Errorf("%s: %d bytes back, want %d", method, len(resp.Version), 3*size)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// TestMessageLimit: a message above MaxMsgSize is refused by the relay with
// ResourceExhausted, as grpc-go's server did, and does not reach the
// backend.
func TestMessageLimit(t *testing.T) {
	s := start(t, nil)
	method := runtimeapi.RuntimeService_Version_FullMethodName
	req := &runtimeapi.VersionRequest{Version: string(make([]byte, MaxMsgSize+1))}
	err := s.client.Invoke(context.Background(), method, req, &runtimeapi.VersionResponse{}, grpc.MaxCallSendMsgSize(MaxMsgSize+1024))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	// The connection is still good.
	if err := s.client.Invoke(context.Background(), method, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
		t.Fatal(err)
	}
}

// TestBackendDownThroughRelay: with nothing listening behind the relay, a
// call fails at once with Unavailable, and works once the backend is back.
func TestBackendDownThroughRelay(t *testing.T) {
	dir := t.TempDir()
	beSock := filepath.Join(dir, "be.sock")
	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := New(conn, modeOpts()...)
	pxSock := filepath.Join(dir, "px.sock")
	lis, err := net.Listen("unix", pxSock)
	if err != nil {
		t.Fatal(err)
	}
	srv := r.NewServer()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	client, err := grpc.NewClient("unix://"+pxSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	rt := runtimeapi.NewRuntimeServiceClient(client)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	// The backend comes up: the next call works on the same caller connection.
	beLis, err := net.Listen("unix", beSock)
	if err != nil {
		t.Fatal(err)
	}
	be := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(be, &versionServer{})
	go func() { _ = be.Serve(beLis) }()
	defer be.Stop()
	resp, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	for grpcMode() && status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		// grpc-go's client redials after its backoff (1 s), not per call
		time.Sleep(100 * time.Millisecond)
		resp, err = rt.Version(ctx, &runtimeapi.VersionRequest{})
	}
	if err != nil || resp.RuntimeName != "fake" {
		t.Fatalf("after the backend came up: %v %v", resp, err)
	}
}

type versionServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (versionServer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake"}, nil
}

// TestObserver: every call is observed once with its method and code, on
// both paths.
func TestObserver(t *testing.T) {
	type obs struct {
		method string
		code   codes.Code
	}
	var mu sync.Mutex
	var seen []obs
	table := Table{}
	table.Add(runtimeapi.RuntimeService_StartContainer_FullMethodName, func(ctx context.Context, req []byte, next Invoker) ([]byte, error) {
		return nil, status.Error(codes.FailedPrecondition, "no")
	})
	s := start(t, table, WithObserver(func(method string, code codes.Code, d time.Duration) {
		mu.Lock()
		seen = append(seen, obs{method, code})
		mu.Unlock()
	}))
	rt := runtimeapi.NewRuntimeServiceClient(s.client)
	ctx := context.Background()
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	_, _ = rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "x"})
	s.backend.reply = func(string, []byte) ([]byte, error) { return nil, status.Error(codes.NotFound, "gone") }
	_, _ = rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: "x"})
	want := []obs{
		{runtimeapi.RuntimeService_Version_FullMethodName, codes.OK},
		{runtimeapi.RuntimeService_StartContainer_FullMethodName, codes.FailedPrecondition},
		{runtimeapi.RuntimeService_ContainerStatus_FullMethodName, codes.NotFound},
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("observed %v, want %v", seen, want)
	}
}

// TestGracefulStopLetsCallsFinish: a unary call in flight when GracefulStop
// begins completes; the server then stops.
func TestGracefulStopLetsCallsFinish(t *testing.T) {
	dir := t.TempDir()
	beSock := filepath.Join(dir, "be.sock")
	beLis, err := net.Listen("unix", beSock)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	be := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(be, &slowServer{release: release})
	go func() { _ = be.Serve(beLis) }()
	defer be.Stop()
	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := New(conn, modeOpts()...)
	pxSock := filepath.Join(dir, "px.sock")
	lis, err := net.Listen("unix", pxSock)
	if err != nil {
		t.Fatal(err)
	}
	srv := r.NewServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	client, err := grpc.NewClient("unix://"+pxSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	callErr := make(chan error, 1)
	go func() {
		_, err := runtimeapi.NewRuntimeServiceClient(client).Version(context.Background(), &runtimeapi.VersionRequest{})
		callErr <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is at the backend
	stopped := make(chan struct{})
	go func() { r.Drain(); srv.GracefulStop(); close(stopped) }()
	time.Sleep(100 * time.Millisecond)
	close(release)
	if err := <-callErr; err != nil {
		t.Fatalf("call in flight: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

type slowServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	release chan struct{}
}

func (s *slowServer) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &runtimeapi.VersionResponse{RuntimeName: "slow"}, nil
}

// TestStreamManyMessages: a server stream of many large messages through
// the pass-through reaches the caller complete and in order.
func TestStreamManyMessages(t *testing.T) {
	s := start(t, nil)
	s.backend.streamN = 200
	method := "/runtime.v1.RuntimeService/FutureStream"
	s.backend.streaming = map[string]bool{method: true}
	s.backend.reply = func(string, []byte) ([]byte, error) {
		return codec{}.Marshal(&runtimeapi.VersionResponse{Version: string(bytes.Repeat([]byte{'x'}, 50_000))})
	}
	cs, err := s.client.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, method)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&runtimeapi.VersionRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = cs.CloseSend()
	n := 0
	for {
		var resp runtimeapi.VersionResponse
		if err := cs.RecvMsg(&resp); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
		if len(resp.Version) != 50_000 {
			t.Fatalf("message %d: %d bytes", n, len(resp.Version))
		}
		n++
	}
	if n != 200 {
		t.Fatalf("%d messages, want 200", n)
	}
}

// TestCallAfterAQuietSpell: a connection that stays quiet for longer than
// the relay's write deadline still carries the next call.
func TestCallAfterAQuietSpell(t *testing.T) {
	const quick = 300 * time.Millisecond
	s := start(t, nil, func(r *Relay) { r.ioTimeout = quick })
	s.backend.reply = func(string, []byte) ([]byte, error) {
		return codec{}.Marshal(&runtimeapi.VersionResponse{Version: string(bytes.Repeat([]byte{'x'}, 100_000))})
	}
	rt := runtimeapi.NewRuntimeServiceClient(s.client)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if err != nil {
			t.Fatalf("call %d after %s quiet: %v", i, 3*quick, err)
		}
		time.Sleep(3 * quick)
	}
}
