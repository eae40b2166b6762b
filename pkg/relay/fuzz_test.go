package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The caller side of the router is fed frames a peer may send, well formed
// or not: the relay must never panic or hang, and must close a connection
// that broke the protocol with a GOAWAY saying so.

// frames builds a byte stream of HTTP/2 frames.
type frames struct {
	bytes.Buffer
	fr  *http2.Framer
	enc *hpack.Encoder
	eb  bytes.Buffer
}

func newFrames() *frames {
	f := &frames{}
	f.fr = http2.NewFramer(&f.Buffer, nil)
	f.fr.AllowIllegalWrites = true
	f.enc = hpack.NewEncoder(&f.eb)
	return f
}

func (f *frames) block(fields ...string) []byte {
	f.eb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = f.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(f.eb.Bytes())
}

// request opens stream id for method.
func (f *frames) request(id uint32, method string, end bool) *frames {
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: end, BlockFragment: f.block(
		":method", "POST", ":scheme", "http", ":path", method, ":authority", "x", "content-type", "application/grpc", "te", "trailers")})
	return f
}

// message sends one gRPC message of body on stream id.
func (f *frames) message(id uint32, body []byte, end bool) *frames {
	b := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(b[1:], uint32(len(body)))
	copy(b[5:], body)
	_ = f.fr.WriteData(id, end, b)
	return f
}

func (f *frames) raw(typ http2.FrameType, flags http2.Flags, id uint32, payload []byte) *frames {
	_ = f.fr.WriteRawFrame(typ, flags, id, payload)
	return f
}

// exchange writes the client preface and in to the relay at sock, closes
// its write side and reads until the relay closes the connection. It
// returns the GOAWAY code the relay sent, if any, and fails on a hang.
func exchange(t testing.TB, sock string, in []byte) (goaway *http2.ErrCode) {
	t.Helper()
	return exchangeFrames(t, sock, in, nil)
}

// exchangeFrames is exchange, showing each frame the relay sent to seen.
func exchangeFrames(t testing.TB, sock string, in []byte, seen func(http2.Frame)) (goaway *http2.ErrCode) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second)) // the 16 MiB header takes seconds under -race
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(append([]byte(http2.ClientPreface), in...))
		if err == nil {
			err = c.(*net.UnixConn).CloseWrite()
		}
		done <- err
	}()
	fr := http2.NewFramer(io.Discard, c)
	fr.SetMaxReadFrameSize(1 << 24)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "connection reset") {
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the relay neither answered nor closed the connection within 60 s")
			}
			break
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			code := g.ErrCode
			goaway = &code
		}
		if seen != nil {
			seen(f)
		}
	}
	<-done // a write cut short by the relay's close is fine
	return goaway
}

func fuzzSeeds() map[string][]byte {
	ok := func() *frames { return newFrames().raw(http2.FrameSettings, 0, 0, nil) }
	v := runtimeapi.RuntimeService_Version_FullMethodName
	huge := strings.Repeat("x", maxHeaderList+1)
	oversize := newFrames()
	blk := oversize.block("x-big", huge)
	_ = oversize.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[:frameSize]})
	for rest := blk[frameSize:]; len(rest) > 0; {
		n := min(len(rest), frameSize)
		_ = oversize.fr.WriteContinuation(1, n == len(rest), rest[:n])
		rest = rest[n:]
	}
	// The same size in many fields: the list, not one string, is too large.
	many := newFrames()
	var fields []string
	for i := 0; len(fields)/2*1000 <= maxHeaderList; i++ {
		fields = append(fields, "x-many", strings.Repeat("y", 1000-32-6))
	}
	mblk := many.block(fields...)
	_ = many.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: mblk[:frameSize]})
	for rest := mblk[frameSize:]; len(rest) > 0; {
		n := min(len(rest), frameSize)
		_ = many.fr.WriteContinuation(1, n == len(rest), rest[:n])
		rest = rest[n:]
	}
	return map[string][]byte{
		"oversize header list, many fields": append(ok().Bytes(), many.Bytes()...),
		"valid call":                        ok().request(1, v, false).message(1, nil, true).Bytes(),
		"two calls and a ping":              ok().request(1, v, false).message(1, nil, true).request(3, v, true).raw(http2.FramePing, 0, 0, make([]byte, 8)).Bytes(),
		"truncated frame header":            ok().Bytes()[:5],
		"truncated payload":                 ok().request(1, v, false).Bytes()[:20],
		"DATA on stream 0":                  ok().raw(http2.FrameData, 0, 0, []byte("abc")).Bytes(),
		"DATA on idle stream":               ok().message(5, []byte("x"), true).Bytes(),
		"garbage HPACK":                     ok().raw(http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1, []byte{0xff, 0xff, 0xff, 0xff, 0x7f}).Bytes(),
		"CONTINUATION alone":                ok().raw(http2.FrameContinuation, http2.FlagContinuationEndHeaders, 1, nil).Bytes(),
		"frame too large":                   ok().raw(http2.FrameData, 0, 1, make([]byte, frameSize+1)).Bytes(),
		"even stream ID":                    ok().request(2, v, true).Bytes(),
		"stream IDs going down":             ok().request(5, v, true).request(3, v, true).Bytes(),
		"headers after END_STREAM":          ok().request(1, v, true).request(1, v, true).Bytes(),
		"oversize header list":              append(ok().Bytes(), oversize.Bytes()...),
		"connection window overflow":        ok().raw(http2.FrameWindowUpdate, 0, 0, []byte{0x7f, 0xff, 0xff, 0xff}).Bytes(),
		"stream window overflow":            ok().request(1, v, false).raw(http2.FrameWindowUpdate, 0, 1, []byte{0x7f, 0xff, 0xff, 0xff}).Bytes(),
		"zero window increment":             ok().raw(http2.FrameWindowUpdate, 0, 0, []byte{0, 0, 0, 0}).Bytes(),
		"bad initial window setting":        newFrames().raw(http2.FrameSettings, 0, 0, []byte{0, 4, 0x80, 0, 0, 0}).Bytes(),
		"settings of odd length":            newFrames().raw(http2.FrameSettings, 0, 0, []byte{0, 4, 0}).Bytes(),
		"push promise from a client":        ok().raw(http2.FramePushPromise, http2.FlagPushPromiseEndHeaders, 1, []byte{0, 0, 0, 2}).Bytes(),
		"oversize message prefix":           ok().request(1, v, false).raw(http2.FrameData, 0, 1, []byte{0, 0x7f, 0xff, 0xff, 0xff}).Bytes(),
		"reset then data":                   ok().request(1, v, false).raw(http2.FrameRSTStream, 0, 1, []byte{0, 0, 0, 8}).message(1, nil, true).Bytes(),
		"window shrink to zero":             newFrames().raw(http2.FrameSettings, 0, 0, []byte{0, 4, 0, 0, 0, 0}).request(1, v, false).message(1, nil, true).Bytes(),
		"unknown frame type":                ok().raw(0xee, 0, 1, []byte("whatever")).request(1, v, true).Bytes(),
		"RST_STREAM on idle stream":         ok().raw(http2.FrameRSTStream, 0, 7, []byte{0, 0, 0, 8}).Bytes(),
		"stream depends on itself":          ok().raw(http2.FramePriority, 0, 1, []byte{0, 0, 0, 1, 16}).Bytes(),
		"DATA on a closed stream":           ok().request(1, v, true).raw(http2.FrameRSTStream, 0, 1, []byte{0, 0, 0, 8}).message(1, nil, true).Bytes(),
		"content-length mismatch":           ok().raw(http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1, newFrames().block(":method", "POST", ":scheme", "http", ":path", v, "content-type", "application/grpc", "content-length", "3")).message(1, []byte("x"), true).Bytes(),
		"connection header in a request":    ok().raw(http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, 1, newFrames().block(":method", "POST", ":scheme", "http", ":path", v, "connection", "close")).Bytes(),
		"second HEADERS without END_STREAM": ok().request(1, v, false).message(1, nil, false).trailers(1, false, "x-test", "ok").Bytes(),
		"pseudo-header in trailers":         ok().request(1, v, false).message(1, nil, false).trailers(1, true, ":path", "/x").Bytes(),
		"not a gRPC request":                ok().raw(http2.FrameHeaders, http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, 1, newFrames().block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x")).Bytes(),
		"rapid reset":                       rapidReset(ok(), rapidResetLimit+1).Bytes(),
		"ping flood":                        repeat(ok(), maxControlFrames+1, func(f *frames) { f.raw(http2.FramePing, 0, 0, make([]byte, 8)) }).Bytes(),
		"settings flood":                    repeat(ok(), maxControlFrames+1, func(f *frames) { f.raw(http2.FrameSettings, 0, 0, nil) }).Bytes(),
		"continuation flood":                continuationFlood(ok(), v).Bytes(),
		"streams over the limit":            overLimit(newFrames().raw(http2.FrameSettings, 0, 0, []byte{0, 4, 0, 0, 0, 0}), v).Bytes(),
	}
}

// trailers sends a header block of fields on stream id.
func (f *frames) trailers(id uint32, end bool, fields ...string) *frames {
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: end, BlockFragment: f.block(fields...)})
	return f
}

func repeat(f *frames, n int, do func(*frames)) *frames {
	for range n {
		do(f)
	}
	return f
}

// rapidReset opens and resets n streams (CVE-2023-44487).
func rapidReset(f *frames, n int) *frames {
	id := uint32(1)
	return repeat(f, n, func(f *frames) {
		f.request(id, runtimeapi.RuntimeService_Version_FullMethodName, false).raw(http2.FrameRSTStream, 0, id, []byte{0, 0, 0, 8})
		id += 2
	})
}

// continuationFlood is a header block of more than maxHeaderFrames empty
// CONTINUATIONs.
func continuationFlood(f *frames, method string) *frames {
	blk := f.block(":method", "POST", ":scheme", "http", ":path", method, ":authority", "x", "content-type", "application/grpc")
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk})
	return repeat(f, maxHeaderFrames, func(f *frames) { _ = f.fr.WriteContinuation(1, false, nil) })
}

// overLimit opens one call more than maxStreams; with the caller's
// initial window at 0 (its SETTINGS, before) none of the answers can end.
func overLimit(f *frames, method string) *frames {
	id := uint32(1)
	return repeat(f, maxStreams+1, func(f *frames) {
		f.request(id, method, false).message(id, nil, true)
		id += 2
	})
}

// TestProtocolErrors runs the seed corpus: each broken input ends with a
// GOAWAY carrying the error the relay found, and the connection closed.
func TestProtocolErrors(t *testing.T) {
	routerOnly(t, "the router's own frame handling and error codes; grpc-go's server has its own")
	s := start(t, nil)
	sock := s.client.Target()[len("unix://"):]
	want := map[string]http2.ErrCode{
		"DATA on stream 0":                  http2.ErrCodeProtocol,
		"DATA on idle stream":               http2.ErrCodeProtocol,
		"garbage HPACK":                     http2.ErrCodeCompression,
		"CONTINUATION alone":                http2.ErrCodeProtocol,
		"frame too large":                   http2.ErrCodeFrameSize,
		"even stream ID":                    http2.ErrCodeProtocol,
		"stream IDs going down":             http2.ErrCodeProtocol,
		"headers after END_STREAM":          http2.ErrCodeStreamClosed,
		"oversize header list":              http2.ErrCodeCompression, // one string above the limit: hpack refuses it
		"oversize header list, many fields": http2.ErrCodeProtocol,
		"connection window overflow":        http2.ErrCodeFlowControl,
		"zero window increment":             http2.ErrCodeProtocol,
		"bad initial window setting":        http2.ErrCodeFlowControl,
		"settings of odd length":            http2.ErrCodeFrameSize,
		"push promise from a client":        http2.ErrCodeProtocol,
		"RST_STREAM on idle stream":         http2.ErrCodeProtocol,
		"rapid reset":                       http2.ErrCodeEnhanceYourCalm,
		"ping flood":                        http2.ErrCodeEnhanceYourCalm,
		"settings flood":                    http2.ErrCodeEnhanceYourCalm,
		"continuation flood":                http2.ErrCodeEnhanceYourCalm,
	}
	for name, in := range fuzzSeeds() {
		t0 := time.Now()
		got := exchange(t, sock, in)
		t.Logf("%s: %d bytes, %v", name, len(in), time.Since(t0).Round(time.Millisecond))
		w, broken := want[name]
		switch {
		case broken && got == nil:
			t.Errorf("%s: connection closed without GOAWAY, want %v", name, w)
		case broken && *got != w && !(name == "headers after END_STREAM" && *got == http2.ErrCodeProtocol):
			// (the second HEADERS finds stream 1 still open, or already gone)
			t.Errorf("%s: GOAWAY %v, want %v", name, *got, w)
		case !broken && got != nil && *got != http2.ErrCodeNo:
			t.Errorf("%s: GOAWAY %v, want none", name, *got)
		}
	}
	// The relay still serves.
	if err := s.client.Invoke(t.Context(), runtimeapi.RuntimeService_Version_FullMethodName, &runtimeapi.VersionRequest{}, &runtimeapi.VersionResponse{}); err != nil {
		t.Fatal(err)
	}
}

// TestWindowAbuse: a caller that sends more than its stream's window while
// the backend is not reading gets FLOW_CONTROL_ERROR; what the relay held
// for the backend meanwhile was bounded by that window.
func TestWindowAbuse(t *testing.T) {
	routerOnly(t, "the router's own frame handling and error codes; grpc-go's server has its own")
	dir := t.TempDir()
	beSock := filepath.Join(dir, "stuck.sock")
	beLis, err := net.Listen("unix", beSock)
	if err != nil {
		t.Fatal(err)
	}
	defer beLis.Close()
	go func() { // a backend that accepts and never reads nor answers
		for {
			c, err := beLis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	conn, err := Dial("unix://" + beSock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	px := filepath.Join(dir, "px.sock")
	lis, err := net.Listen("unix", px)
	if err != nil {
		t.Fatal(err)
	}
	srv := New(conn, modeOpts()...).NewServer()
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	f := newFrames().raw(http2.FrameSettings, 0, 0, nil).request(1, runtimeapi.RuntimeService_Version_FullMethodName, false)
	// One message of 60 MiB (under MaxMsgSize), of which more than the
	// 16 MiB stream window is sent.
	hdr := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[1:], 60<<20)
	chunk := make([]byte, frameSize)
	copy(chunk, hdr)
	for sent := 0; sent <= streamWindow; sent += frameSize {
		_ = f.fr.WriteData(1, false, chunk)
	}
	got := exchange(t, px, f.Bytes())
	if got == nil || *got != http2.ErrCodeFlowControl {
		t.Fatalf("GOAWAY %v, want FLOW_CONTROL_ERROR", got)
	}
}

// FuzzRouter feeds arbitrary bytes after the client preface, seeded with
// the corpus above. `go test -fuzz FuzzRouter ./pkg/relay/` explores.
func FuzzRouter(f *testing.F) {
	for _, in := range fuzzSeeds() {
		f.Add(in)
	}
	for _, c := range malformedRequests() {
		f.Add(c.in)
	}
	s := start(f, nil)
	sock := s.client.Target()[len("unix://"):]
	f.Fuzz(func(t *testing.T, in []byte) {
		exchange(t, sock, in)
	})
}

// TestGoAwayAfterAQuietSpell: a protocol error that comes long after the
// relay last wrote (a slow peer, a huge header block) still gets its
// GOAWAY: the write of it has a deadline of its own, not the one left by
// the last flush. (CI under load: a 16 MiB header took 31 s to arrive and
// the GOAWAY was lost to the 30 s deadline of the SETTINGS flush.)
func TestGoAwayAfterAQuietSpell(t *testing.T) {
	routerOnly(t, "the router's own frame handling and error codes; grpc-go's server has its own")
	const quick = 300 * time.Millisecond
	s := start(t, nil, func(r *Relay) { r.ioTimeout = quick })
	sock := s.client.Target()[len("unix://"):]
	c := prefaced(t, sock, 10*time.Second)
	time.Sleep(3 * quick) // the relay's SETTINGS flush and its deadline are long past
	if _, err := c.Write(newFrames().raw(http2.FrameData, 0, 0, []byte("x")).Bytes()); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(io.Discard, c)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("connection closed without GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("GOAWAY %v, want PROTOCOL_ERROR", g.ErrCode)
			}
			return
		}
	}
}

// prefaced is a raw connection to the relay at sock that has sent the
// client preface, with deadline for everything after it; closed when the
// test ends.
func prefaced(t *testing.T, sock string, deadline time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(deadline))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	return c
}
