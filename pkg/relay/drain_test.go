package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// taggedRuntime is a backend that says which one it is (RuntimeName), and
// holds a Version call asked for with Version "hold" until hold is closed.
type taggedRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	tag  string
	held chan struct{} // one value per held call, once it is held
	hold chan struct{}
}

func (b *taggedRuntime) Version(ctx context.Context, req *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	if req.Version == "hold" {
		if err := b.wait(ctx); err != nil {
			return nil, err
		}
	}
	return &runtimeapi.VersionResponse{RuntimeName: b.tag}, nil
}

// wait holds a call until hold is closed, or ctx ends.
func (b *taggedRuntime) wait(ctx context.Context) error {
	b.held <- struct{}{}
	select {
	case <-b.hold:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// StopContainer stands for every call that changes something: it holds
// a stop of container "hold" as Version holds, and answers the rest.
func (b *taggedRuntime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	if req.ContainerId == "hold" {
		if err := b.wait(ctx); err != nil {
			return nil, err
		}
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

// startTagged serves a taggedRuntime on a new socket in dir.
func startTagged(t *testing.T, dir, tag string) (*taggedRuntime, string) {
	t.Helper()
	sock := filepath.Join(dir, tag+".sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	b := &taggedRuntime{tag: tag, held: make(chan struct{}, 16), hold: make(chan struct{})}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, b)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return b, sock
}

// heldSocket is a listening socket held the way systemd holds a socket
// unit's: this test keeps a descriptor of it, each server gets its own,
// and none unlinks it.
type heldSocket struct {
	path string
	file *os.File
}

func newHeldSocket(t *testing.T, dir string) *heldSocket {
	t.Helper()
	path := filepath.Join(dir, "cri.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	t.Cleanup(func() { f.Close() })
	return &heldSocket{path: path, file: f}
}

// serve starts a relay to backendSock on a descriptor of the socket: a
// process of inplaced, as systemd would start it.
func (h *heldSocket) serve(t *testing.T, backendSock string) *Server {
	t.Helper()
	conn, err := Dial("unix://" + backendSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	lis, err := net.FileListener(h.file)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(conn, modeOpts()...).NewServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return srv
}

// kubeletClient dials the socket with the connection parameters kubelet's
// CRI client uses (k8s.io/cri-client: a connection attempt gets 5 s, the
// backoff starts at 100 ms and stops growing at 3 s; no wait-for-ready).
func kubeletClient(t *testing.T, sock string) (*grpc.ClientConn, runtimeapi.RuntimeServiceClient) {
	t.Helper()
	params := grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: 5 * time.Second}
	params.Backoff.BaseDelay, params.Backoff.MaxDelay = 100*time.Millisecond, 3*time.Second
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"), grpc.WithConnectParams(params))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc, runtimeapi.NewRuntimeServiceClient(cc)
}

type versionResult struct {
	resp *runtimeapi.VersionResponse
	err  error
	took time.Duration
}

func goVersion(rt runtimeapi.RuntimeServiceClient, version string) <-chan versionResult {
	res := make(chan versionResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		resp, err := rt.Version(ctx, &runtimeapi.VersionRequest{Version: version})
		res <- versionResult{resp, err, time.Since(t0)}
	}()
	return res
}

// TestDrainHandsCallersOver: a call in flight when the drain begins ends
// on the old process with its answer; a call made after it, by the same
// client, on a new connection, is answered by the old process too, as long
// as it has not handed over (a late session; grpc-go's server holds it for
// the next one instead); a call made after the handover waits in the
// socket's backlog and is answered by the next process serving the same
// socket, with no error.
func TestDrainHandsCallersOver(t *testing.T) {
	dir := t.TempDir()
	oldBE, oldSock := startTagged(t, dir, "old")
	_, newSock := startTagged(t, dir, "new")
	sock := newHeldSocket(t, dir)
	oldSrv := sock.serve(t, oldSock)
	cc, rt := kubeletClient(t, sock.path)

	inFlight := goVersion(rt, "hold")
	<-oldBE.held
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- oldSrv.Drain(ctx, HandOff)
	}()
	// The client has the GOAWAY: its next call opens a new connection.
	waitState(t, cc, func(s connectivity.State) bool { return s != connectivity.Ready })
	during := goVersion(rt, "")
	if !grpcMode() {
		if r := <-during; r.err != nil || r.resp.RuntimeName != "old" {
			t.Fatalf("a call made during the drain: %v %v, want old's answer", r.resp, r.err)
		}
	}
	close(oldBE.hold)
	if r := <-inFlight; r.err != nil || r.resp.RuntimeName != "old" {
		t.Fatalf("the call in flight: %v %v, want old's answer", r.resp, r.err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := oldSrv.Handover(ctx); err != nil {
		t.Fatalf("Handover: %v", err)
	}
	after := goVersion(rt, "")
	select {
	case r := <-after:
		t.Fatalf("a call made after the handover was answered by the old process: %v %v", r.resp, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	oldSrv.Stop() // the old process exits
	time.Sleep(300 * time.Millisecond)
	sock.serve(t, newSock) // and the next one starts on the same socket
	if grpcMode() {
		if r := <-during; r.err != nil || r.resp.RuntimeName != "new" {
			t.Fatalf("a call made during grpc-go's drain: %v %v, want new's answer", r.resp, r.err)
		}
	}
	r := <-after
	if r.err != nil || r.resp.RuntimeName != "new" {
		t.Fatalf("the call made after the handover: %v %v, want new's answer", r.resp, r.err)
	}
	t.Logf("the call made after the handover waited %s and was answered by the next process", r.took.Round(time.Millisecond))
}

// TestDrainCutsAtGrace: at the end of Drain's context, a call that may
// have changed something (StopContainer) and still runs is cut with
// Unavailable, and Drain says so; a read still running (Version) is
// refused instead, and the caller's grpc-go sends it again, on its next
// connection, to the next process on the same socket: no error. So is a
// read still running on a connection made during the drain when the
// handover's time is up; and the first read's second attempt does not go
// to that connection, whose calls this process cuts next.
func TestDrainCutsAtGrace(t *testing.T) {
	routerOnly(t, "grpc-go's server cuts every call at its Stop")
	dir := t.TempDir()
	be, beSock := startTagged(t, dir, "old")
	defer close(be.hold)
	next, nextSock := startTagged(t, dir, "next")
	close(next.hold) // the next process's backend answers what it is sent again
	sock := newHeldSocket(t, dir)
	srv := sock.serve(t, beSock)
	cc, rt := kubeletClient(t, sock.path)
	read := goVersion(rt, "hold")
	stop := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: "hold"})
		stop <- err
	}()
	<-be.held
	<-be.held
	drained := make(chan error, 1)
	t0 := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		drained <- srv.Drain(ctx, HandOff)
	}()
	// During the drain the client's calls take a new connection, served by
	// this process (a late session): one answered, one held.
	waitState(t, cc, func(s connectivity.State) bool { return s != connectivity.Ready })
	if r := <-goVersion(rt, ""); r.err != nil || r.resp.RuntimeName != "old" {
		t.Fatalf("a call made during the drain: %v %v, want old's answer", r.resp, r.err)
	}
	lateRead := goVersion(rt, "hold")
	<-be.held
	if err := <-drained; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain with calls that never end: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(t0); d > 4*time.Second {
		t.Fatalf("Drain took %s with a 2 s grace", d)
	}
	if err := <-stop; status.Code(err) != codes.Unavailable {
		t.Fatalf("the StopContainer cut at the grace: %v, want Unavailable", err)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer hcancel()
	if err := srv.Handover(hctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Handover with a call that never ends: %v, want DeadlineExceeded", err)
	}
	srv.Stop() // the old process exits
	select {
	case r := <-read:
		t.Fatalf("the read cut at the grace ended before a next process served the socket: %v %v", r.resp, r.err)
	case r := <-lateRead:
		t.Fatalf("the read cut at the handover ended before a next process served the socket: %v %v", r.resp, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	sock.serve(t, nextSock)
	for what, c := range map[string]<-chan versionResult{"the read cut at the grace": read, "the read cut at the handover": lateRead} {
		if r := <-c; r.err != nil || r.resp.RuntimeName != "next" {
			t.Errorf("%s: %v %v, want the next process's answer", what, r.resp, r.err)
		}
	}
}

// TestDrainEndsOnlyEndlessStreams: GetContainerEvents ends at once with
// Unavailable; a streaming list in flight (StreamContainers, which kubelet
// uses with CRIListStreaming) is let finish, as a unary call is.
func TestDrainEndsOnlyEndlessStreams(t *testing.T) {
	s := start(t, nil)
	release, never := make(chan struct{}), make(chan struct{})
	defer close(never)
	s.backend.streamN = 3
	s.backend.streaming = map[string]bool{runtimeapi.RuntimeService_StreamContainers_FullMethodName: true}
	s.backend.reply = func(method string, _ []byte) ([]byte, error) {
		if method == runtimeapi.RuntimeService_GetContainerEvents_FullMethodName {
			<-never // an event stream: never ends by itself
		}
		<-release
		return codec{}.Marshal(&runtimeapi.StreamContainersResponse{})
	}
	open := func(method string) grpc.ClientStream {
		cs, err := s.client.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, method)
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.SendMsg(&runtimeapi.GetEventsRequest{}); err != nil {
			t.Fatal(err)
		}
		_ = cs.CloseSend()
		return cs
	}
	events := open(runtimeapi.RuntimeService_GetContainerEvents_FullMethodName)
	list := open(runtimeapi.RuntimeService_StreamContainers_FullMethodName)
	waitCalls(t, s.backend, runtimeapi.RuntimeService_StreamContainers_FullMethodName)
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- s.server.Drain(ctx, HandOff)
	}()
	var ev runtimeapi.ContainerEventResponse
	if err := events.RecvMsg(&ev); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetContainerEvents at the drain: %v, want Unavailable", err)
	}
	close(release)
	n := 0
	for {
		var resp runtimeapi.StreamContainersResponse
		err := list.RecvMsg(&resp)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("StreamContainers in flight at the drain: %v after %d messages", err, n)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("StreamContainers: %d messages, want 3", n)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// TestDrainGoAwayInTwoSteps: the router's GOAWAYs as a caller reads them.
// The first says the largest stream ID and comes with a PING; a stream the
// caller opens before acknowledging it is served, not refused; the
// acknowledgement brings the GOAWAY with the last stream ID, and the
// connection closes once its streams have ended.
func TestDrainGoAwayInTwoSteps(t *testing.T) {
	routerOnly(t, "the router's own GOAWAYs; grpc-go's server sends its own, the same way")
	dir := t.TempDir()
	be, beSock := startTagged(t, dir, "be")
	sock := newHeldSocket(t, dir)
	srv := sock.serve(t, beSock)
	c, err := net.Dial("unix", sock.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	out := newFrames()
	_, _ = out.WriteString(http2.ClientPreface)
	_ = out.fr.WriteSettings()
	version := func(id uint32, v string) {
		body, _ := codec{}.Marshal(&runtimeapi.VersionRequest{Version: v})
		out.request(id, runtimeapi.RuntimeService_Version_FullMethodName, false).message(id, body, true)
	}
	version(1, "hold")
	flushTo(t, c, out)
	<-be.held
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- srv.Drain(ctx, HandOff)
	}()
	in := http2.NewFramer(io.Discard, c)
	var pinged, ended3, ended1 bool
	var goaways []uint32
	for !(ended1 && ended3) {
		f, err := in.ReadFrame()
		if err != nil {
			t.Fatalf("read: %v (GOAWAYs %v, stream 3 ended %v, stream 1 ended %v)", err, goaways, ended3, ended1)
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			goaways = append(goaways, f.LastStreamID)
			if len(goaways) == 2 {
				close(be.hold) // the last GOAWAY is out: let stream 1 end
			}
		case *http2.PingFrame:
			if !f.IsAck() && f.Data == drainPing && !pinged {
				pinged = true
				version(3, "") // opened before the caller has read GOAWAY, as it were
				_ = out.fr.WritePing(true, f.Data)
				flushTo(t, c, out)
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				ended1, ended3 = ended1 || f.StreamID == 1, ended3 || f.StreamID == 3
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset (%v) during the drain", f.StreamID, f.ErrCode)
		}
	}
	if len(goaways) != 2 || goaways[0] != 1<<31-1 || goaways[1] != 3 {
		t.Fatalf("GOAWAYs with last stream IDs %v, want [%d 3]", goaways, uint32(1<<31-1))
	}
	if _, err := in.ReadFrame(); err == nil {
		t.Fatal("the connection is still open after its last stream ended")
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

func flushTo(t *testing.T, c net.Conn, f *frames) {
	t.Helper()
	if _, err := c.Write(f.Bytes()); err != nil {
		t.Fatal(err)
	}
	f.Reset()
}

func waitState(t *testing.T, cc *grpc.ClientConn, ok func(connectivity.State) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s := cc.GetState(); !ok(s); s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("client connection still %v", s)
		}
	}
}

func waitCalls(t *testing.T, b *fakeBackend, method string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.count(method) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the backend", method)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDrainRefusesOnItsOwnSocket: on a socket the server's process bound
// itself (no next process will serve it), the drain closes it at once: a
// new connection is refused rather than held for nobody, and the call in
// flight still ends with its answer.
func TestDrainRefusesOnItsOwnSocket(t *testing.T) {
	dir := t.TempDir()
	be, beSock := startTagged(t, dir, "be")
	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sock := filepath.Join(dir, "own.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(conn, modeOpts()...).NewServer()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	_, rt := kubeletClient(t, sock)
	inFlight := goVersion(rt, "hold")
	<-be.held
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- srv.Drain(ctx, Refuse)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the server's own socket still takes connections during the drain")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(be.hold)
	if r := <-inFlight; r.err != nil || r.resp.RuntimeName != "be" {
		t.Fatalf("the call in flight: %v %v", r.resp, r.err)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	srv.Stop()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestRestartsUnderLoad: callers that call without pause, with kubelet's
// connection parameters, across restarts on the same socket (drain, hand
// over, stop, the next process serving 100 ms later), see no failed call.
// A call's first attempt can meet the first GOAWAY as it leaves (grpc-go
// then retries it once, on a new connection): that retry must be answered.
func TestRestartsUnderLoad(t *testing.T) {
	routerOnly(t, "grpc-go's server holds what comes during its drain and refuses it at the end (drain.go)")
	dir := t.TempDir()
	_, beSock := startTagged(t, dir, "be")
	sock := newHeldSocket(t, dir)
	srv := sock.serve(t, beSock)
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		_, rt := kubeletClient(t, sock.path)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
				cancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	for range 8 {
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := srv.Drain(ctx, HandOff); err != nil {
			t.Errorf("Drain: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the daemon waits for its swaps
		if err := srv.Handover(ctx); err != nil {
			t.Errorf("Handover: %v", err)
		}
		cancel()
		srv.Stop()
		time.Sleep(100 * time.Millisecond)
		srv = sock.serve(t, beSock)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d calls failed across 8 restarts; the first: %v", n, calls.Load(), firstErr.Load())
	}
	t.Logf("%d calls across 8 restarts, none failed", calls.Load())
}
