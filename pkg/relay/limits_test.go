package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestStreamErrors: the seeds that break one stream, not the connection,
// get RST_STREAM with the code RFC 9113 gives (h2spec 5.1.2, 8.1,
// 8.1.2.1), and a request that is not gRPC an answer of the router's own.
// All frames of a seed arrive in one write, so the router decides on the
// caller's frames before any backend answers.
func TestStreamErrors(t *testing.T) {
	routerOnly(t, "the router's own frame handling and error codes; grpc-go's server has its own")
	s := start(t, nil)
	sock := s.client.Target()[len("unix://"):]
	seeds := fuzzSeeds()
	for _, c := range []struct {
		seed   string
		stream uint32
		code   http2.ErrCode
	}{
		{"second HEADERS without END_STREAM", 1, http2.ErrCodeProtocol},
		{"pseudo-header in trailers", 1, http2.ErrCodeProtocol},
		{"streams over the limit", 2*maxStreams + 1, http2.ErrCodeRefusedStream},
		{"stream window overflow", 1, http2.ErrCodeFlowControl},
		{"stream depends on itself", 1, http2.ErrCodeProtocol},
		{"DATA on a closed stream", 1, http2.ErrCodeStreamClosed},
		{"connection header in a request", 1, http2.ErrCodeProtocol},
		{"content-length mismatch", 1, http2.ErrCodeProtocol},
	} {
		var rst []string
		goaway := exchangeFrames(t, sock, seeds[c.seed], func(f http2.Frame) {
			if r, ok := f.(*http2.RSTStreamFrame); ok {
				rst = append(rst, fmt.Sprintf("%d:%v", r.StreamID, r.ErrCode))
			}
		})
		// The first RST_STREAM says why; frames the caller sent after it
		// on the closed stream may get STREAM_CLOSED.
		want := fmt.Sprintf("%d:%v", c.stream, c.code)
		ok := len(rst) > 0 && rst[0] == want && (goaway == nil || *goaway == http2.ErrCodeNo)
		for _, r := range rst[min(1, len(rst)):] {
			ok = ok && r == fmt.Sprintf("%d:%v", c.stream, http2.ErrCodeStreamClosed)
		}
		if !ok {
			t.Errorf("%s: RST_STREAMs %v, GOAWAY %v; want %s first, then STREAM_CLOSED only", c.seed, rst, goaway, want)
		}
	}
	var status string
	exchangeFrames(t, sock, seeds["not a gRPC request"], func(f http2.Frame) {
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
			if fields, err := newHeaderBlockFields(h); err == nil {
				status = pseudoValue(fields, ":status")
			}
		}
	})
	if status != "405" {
		t.Errorf("a GET: answered with :status %q, want 405", status)
	}
	if n := s.backend.count("/"); n != 0 {
		t.Errorf("the backend saw %d calls of a request that is not gRPC", n)
	}
}

// TestAbuseCounted: each limit that ends a connection is reported to the
// abuse observer, once, with its name; the relay serves on.
func TestAbuseCounted(t *testing.T) {
	routerOnly(t, "the router's own frame handling and error codes; grpc-go's server has its own")
	var mu sync.Mutex
	seen := map[string]int{}
	s := start(t, nil, WithAbuseObserver(func(limit string) { mu.Lock(); seen[limit]++; mu.Unlock() }))
	sock := s.client.Target()[len("unix://"):]
	seeds := fuzzSeeds()
	for seed, limit := range map[string]string{
		"rapid reset": limitRapidReset, "ping flood": limitPingFlood, "settings flood": limitSettingsFlood,
		"continuation flood": limitContinuationFlood,
	} {
		got := exchange(t, sock, seeds[seed])
		if got == nil || *got != http2.ErrCodeEnhanceYourCalm {
			t.Errorf("%s: GOAWAY %v, want ENHANCE_YOUR_CALM", seed, got)
		}
		mu.Lock()
		if seen[limit] != 1 {
			t.Errorf("%s: observed %v, want %s once", seed, seen, limit)
		}
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.client.Invoke(ctx, runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
		t.Fatal(err)
	}
}

// newHeaderBlockFields decodes a HEADERS frame that ends its block (tests).
func newHeaderBlockFields(f *http2.HeadersFrame) ([]hpack.HeaderField, error) {
	h := newHeaderBlock()
	h.begin(f)
	if _, err := h.write(f.HeaderBlockFragment(), true); err != nil {
		return nil, err
	}
	return h.fields, nil
}

// rawBackend is an HTTP/2 gRPC backend written with x/net's Framer, so
// that a test sees exactly the streams the relay opens: it advertises
// maxStreams but does not enforce it, and answers each call after delay
// with an empty message and grpc-status 0.
type rawBackend struct {
	maxStreams    uint32
	maxHeaderList uint32 // 0: not advertised
	delay         time.Duration

	mu      sync.Mutex
	open    int
	maxOpen int
	calls   int
}

func (b *rawBackend) serve(t *testing.T, sock string) {
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go b.conn(c)
		}
	}()
}

func (b *rawBackend) conn(c net.Conn) {
	defer c.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil {
		return
	}
	var wmu sync.Mutex
	fr := http2.NewFramer(c, c)
	wmu.Lock()
	settings := []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: b.maxStreams}}
	if b.maxHeaderList != 0 {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: b.maxHeaderList})
	}
	_ = fr.WriteSettings(settings...)
	wmu.Unlock()
	var enc bytes.Buffer
	he := hpack.NewEncoder(&enc)
	answer := func(id uint32) {
		time.Sleep(b.delay)
		b.mu.Lock()
		b.open--
		b.mu.Unlock()
		wmu.Lock()
		defer wmu.Unlock()
		enc.Reset()
		_ = he.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		_ = he.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, BlockFragment: bytes.Clone(enc.Bytes())})
		_ = fr.WriteData(id, false, []byte{0, 0, 0, 0, 0})
		enc.Reset()
		_ = he.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true, BlockFragment: bytes.Clone(enc.Bytes())})
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				wmu.Lock()
				_ = fr.WriteSettingsAck()
				wmu.Unlock()
			}
		case *http2.HeadersFrame:
			b.mu.Lock()
			b.open++
			b.calls++
			b.maxOpen = max(b.maxOpen, b.open)
			b.mu.Unlock()
			if f.StreamEnded() {
				go answer(f.StreamID)
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				go answer(f.StreamID)
			}
		}
	}
}

// TestBackendStreamLimit: a backend advertising MAX_CONCURRENT_STREAMS=2
// never sees a third concurrent stream; the callers' calls wait for a
// slot, as they would in grpc-go's client, and all succeed.
func TestBackendStreamLimit(t *testing.T) {
	dir := t.TempDir()
	be := &rawBackend{maxStreams: 2, delay: 20 * time.Millisecond}
	beSock := filepath.Join(dir, "be.sock")
	be.serve(t, beSock)
	for _, mode := range []string{"router", "grpc"} {
		t.Run(mode, func(t *testing.T) {
			be.mu.Lock()
			be.maxOpen, be.calls = 0, 0
			be.mu.Unlock()
			var opts []Option
			if mode == "grpc" {
				opts = append(opts, WithGRPCServer())
			}
			_, client := relayTo(t, beSock, opts...)
			// One call first: the relay has read the backend's SETTINGS (a
			// stream sent before them is not held back: RFC 9113's initial
			// limit is none).
			if err := client.Invoke(context.Background(), runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
				t.Fatal(err)
			}
			be.mu.Lock()
			be.maxOpen, be.calls = 0, 0
			be.mu.Unlock()
			var wg sync.WaitGroup
			errc := make(chan error, 20)
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					errc <- client.Invoke(ctx, runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{})
				}()
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				if err != nil {
					t.Error(err)
				}
			}
			be.mu.Lock()
			defer be.mu.Unlock()
			if be.maxOpen > 2 || be.calls != 20 {
				t.Fatalf("the backend saw %d calls, at most %d at once; want 20, at most 2", be.calls, be.maxOpen)
			}
		})
	}
}

// TestBackendHeaderListLimit: a header list beyond the backend's
// MAX_HEADER_LIST_SIZE is not sent: the call fails with Internal, as in
// grpc-go's client, and a call within it goes through.
func TestBackendHeaderListLimit(t *testing.T) {
	dir := t.TempDir()
	be := &rawBackend{maxStreams: 100, maxHeaderList: 4096}
	beSock := filepath.Join(dir, "be.sock")
	be.serve(t, beSock)
	_, client := relayTo(t, beSock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v := runtimeapi.RuntimeService_Version_FullMethodName
	if err := client.Invoke(ctx, v, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
		t.Fatal(err) // also makes the relay read the backend's SETTINGS
	}
	big := metadata.NewOutgoingContext(ctx, metadata.Pairs("x-big", strings.Repeat("b", 8000)))
	err := client.Invoke(big, v, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("a header list over the backend's limit: %v, want Internal", err)
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.calls != 1 {
		t.Fatalf("the backend saw %d calls, want 1 (the one within its limit)", be.calls)
	}
}

// TestStalledBackendDoesNotDelayOthers: a backend that stops reading its
// socket (header blocks are not flow-controlled, so the relay's writes to
// it fill the socket) delays neither the image backend's calls on the same
// caller connection nor its PINGs: no socket write waits under the
// session's lock.
func TestStalledBackendDoesNotDelayOthers(t *testing.T) {
	dir := t.TempDir()
	stuck := filepath.Join(dir, "stuck.sock")
	lis, err := net.Listen("unix", stuck)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var held []net.Conn
	var hmu sync.Mutex
	go func() { // accepts, never reads, never answers
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			hmu.Lock()
			held = append(held, c)
			hmu.Unlock()
		}
	}()
	defer func() {
		hmu.Lock()
		for _, c := range held {
			c.Close()
		}
		hmu.Unlock()
	}()
	img := start(t, nil)                      // its backend serves the image calls
	imgConn, err := Dial(img.client.Target()) // the relay of `img` in front of its backend: fine as an image endpoint
	if err != nil {
		t.Fatal(err)
	}
	defer imgConn.Close()
	_, client := relayTo(t, stuck, WithImageConn(imgConn))
	// Calls to the stuck backend with 8 KB of unique metadata each: 2 MB
	// of header blocks, more than its socket takes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 256 {
		go func() {
			md := metadata.Pairs("x-pad", fmt.Sprintf("%d-%s", i, strings.Repeat("p", 8000)))
			_ = client.Invoke(metadata.NewOutgoingContext(ctx, md), runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{})
		}()
	}
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	// A call blocked behind the stalled backend would never end; one that
	// is not takes milliseconds, and up to about a second under -race on
	// a loaded host (1.05 s seen): the bound is far from both. Under
	// emulation only the end is checked, with room for any slowness.
	timeout, bound := 15*time.Second, 5*time.Second
	if underQEMU {
		timeout, bound = time.Minute, time.Minute
	}
	cctx, ccancel := context.WithTimeout(context.Background(), timeout)
	defer ccancel()
	// (the fake backend answers any method with a VersionResponse)
	if err := client.Invoke(cctx, runtimeapi.ImageService_ImageFsInfo_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > bound {
		t.Fatalf("an image call behind a stalled runtime backend took %v", d)
	}
}

// relayTo serves a relay (in the tests' mode, then opts) in front of the
// backend socket beSock and returns its socket and a client of it, all
// stopped when the test ends.
func relayTo(t testing.TB, beSock string, opts ...Option) (string, *grpc.ClientConn) {
	t.Helper()
	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	px := filepath.Join(t.TempDir(), "px.sock")
	lis, err := net.Listen("unix", px)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(conn, append(modeOpts(), opts...)...).NewServer()
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	client, err := grpc.NewClient("unix://"+px, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return px, client
}

// TestAbusePaced: a caller that floods us with resets or PINGs is paced —
// its reader pauses pacePause after every paceEvery wasted frames past
// paceFree, 9 times before the limit ends it — and a caller that makes and
// cancels calls as kubelet does never is.
func TestAbusePaced(t *testing.T) {
	routerOnly(t, "the router's own pacing; grpc-go's server has its own limits")
	var pauses atomic.Int32
	s := start(t, nil, func(r *Relay) { r.onPause = func() { pauses.Add(1) } })
	sock := s.client.Target()[len("unix://"):]
	seeds := fuzzSeeds()
	want := int32((rapidResetLimit - paceFree) / paceEvery)
	for _, seed := range []string{"rapid reset", "ping flood"} {
		pauses.Store(0)
		t0 := time.Now()
		if got := exchange(t, sock, seeds[seed]); got == nil || *got != http2.ErrCodeEnhanceYourCalm {
			t.Errorf("%s: GOAWAY %v, want ENHANCE_YOUR_CALM", seed, got)
		}
		if n, d := pauses.Load(), time.Since(t0); n != want || d < time.Duration(want)*pacePause {
			t.Errorf("%s: %d pauses in %v, want %d, at least %v", seed, n, d, want, time.Duration(want)*pacePause)
		}
	}
	// Rounds of calls, a third of them cancelled before their answer, and
	// a PING each, as a busy kubelet might: the calls answered earn the
	// resets back. (A fresh HPACK encoder per round only adds entries to the
	// relay's table, as the first did.)
	pauses.Store(0)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	// The answers' DATA would use up the connection's window: a large one.
	hello := newFrames().raw(http2.FrameSettings, 0, 0, nil).raw(http2.FrameWindowUpdate, 0, 0, []byte{0x40, 0, 0, 0})
	if _, err := c.Write(append([]byte(http2.ClientPreface), hello.Bytes()...)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(io.Discard, c)
	v := runtimeapi.RuntimeService_Version_FullMethodName
	id := uint32(1)
	const rounds, perRound = rapidResetLimit / 10, 30 // 1000 resets, 2000 answered calls
	for r := 0; r < rounds; r++ {
		in := newFrames()
		for i := 0; i < perRound; i++ {
			if i%3 == 0 {
				in.request(id, v, false).raw(http2.FrameRSTStream, 0, id, []byte{0, 0, 0, 8})
			} else {
				in.request(id, v, false).message(id, nil, true)
			}
			id += 2
		}
		in.raw(http2.FramePing, 0, 0, make([]byte, 8))
		if _, err := c.Write(in.Bytes()); err != nil {
			t.Fatal(err)
		}
		for answered := 0; answered < perRound*2/3; {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
			switch f := f.(type) {
			case *http2.HeadersFrame:
				if f.StreamEnded() {
					answered++
				}
			case *http2.GoAwayFrame:
				t.Fatalf("round %d: GOAWAY %v", r, f.ErrCode)
			}
		}
	}
	if n := pauses.Load(); n != 0 {
		t.Errorf("a caller that cancels a third of its calls: %d pauses, want none", n)
	}
}

// TestStalledStreamDoesNotDelayOthers: a caller that stops reading one
// stream (it grants that stream no window: the answer's DATA waits) still
// gets another stream's answer on the same connection at once, in both
// modes.
func TestStalledStreamDoesNotDelayOthers(t *testing.T) {
	s := start(t, nil)
	events := runtimeapi.RuntimeService_GetContainerEvents_FullMethodName
	s.backend.mu.Lock()
	s.backend.streaming, s.backend.streamN = map[string]bool{events: true}, 5000 // ~300 KB: far over a stream's 64 KiB window
	s.backend.mu.Unlock()
	sock := s.client.Target()[len("unix://"):]
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	v := runtimeapi.RuntimeService_Version_FullMethodName
	// The connection's window is large; stream 1's stays at 64 KiB, never
	// granted again.
	in := newFrames().raw(http2.FrameSettings, 0, 0, nil).raw(http2.FrameWindowUpdate, 0, 0, []byte{0x40, 0, 0, 0}).
		request(1, events, false).message(1, nil, true)
	if _, err := c.Write(append([]byte(http2.ClientPreface), in.Bytes()...)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(io.Discard, c)
	got := 0
	for got < 65535 { // stream 1's window used up: it is stalled
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading stream 1's answer: %v", err)
		}
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
			got += len(d.Data())
		}
	}
	t0 := time.Now()
	if _, err := c.Write(newFrames().request(3, v, false).message(3, nil, true).Bytes()); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for stream 3's answer: %v", err)
		}
		if f.Header().StreamID == 1 && f.Header().Type == http2.FrameData {
			t.Fatalf("DATA on stream 1 beyond its window")
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 3 && h.StreamEnded() {
			break
		}
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("a call beside a stalled stream took %v", d)
	}
}
