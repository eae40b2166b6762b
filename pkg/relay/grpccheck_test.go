package relay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// malformedRequests are h2spec's malformed requests (5.3.1, 8.1.2.2,
// 8.1.2.3, 8.1.2.6) as gRPC calls on stream 1, each a stream error of type
// PROTOCOL_ERROR that no backend may hear of (for the header cases).
func malformedRequests() map[string]struct {
	in      []byte
	headers bool // found in the header block: the backend sees no call
	connOK  bool // the router ends the connection instead (RFC 9113 §5.4.1 allows it)
} {
	v := runtimeapi.RuntimeService_Version_FullMethodName
	ok := func() *frames { return newFrames().raw(http2.FrameSettings, 0, 0, nil) }
	req := func(extra ...string) []string {
		return append([]string{":method", "POST", ":scheme", "http", ":path", v, ":authority", "x", "content-type", "application/grpc"}, extra...)
	}
	without := func(name string) []string {
		var out []string
		f := req()
		for i := 0; i < len(f); i += 2 {
			if f[i] != name {
				out = append(out, f[i], f[i+1])
			}
		}
		return out
	}
	headers := func(fields ...string) *frames {
		f := ok()
		return f.raw(http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1, f.block(fields...))
	}
	selfDep := ok()
	_ = selfDep.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: selfDep.block(req()...),
		Priority: http2.PriorityParam{StreamDep: 1, Weight: 15}})
	type c = struct {
		in      []byte
		headers bool
		connOK  bool
	}
	return map[string]c{
		"HEADERS depends on itself":           {selfDep.message(1, nil, true).Bytes(), true, false},
		"PRIORITY depends on itself":          {ok().request(1, v, false).raw(http2.FramePriority, 0, 1, []byte{0, 0, 0, 1, 16}).Bytes(), false, false},
		"te other than trailers":              {headers(req("te", "trailers, deflate")...).message(1, nil, true).Bytes(), true, false},
		"no :method":                          {headers(without(":method")...).message(1, nil, true).Bytes(), true, false},
		"no :path":                            {headers(without(":path")...).message(1, nil, true).Bytes(), true, false},
		"no :scheme":                          {headers(without(":scheme")...).message(1, nil, true).Bytes(), true, false},
		"empty :path":                         {headers(":method", "POST", ":scheme", "http", ":path", "", "content-type", "application/grpc").message(1, nil, true).Bytes(), true, false},
		"duplicate :path":                     {headers(append([]string{":path", v}, req()...)...).message(1, nil, true).Bytes(), true, true},
		"body over content-length":            {headers(req("content-length", "1")...).message(1, []byte("test"), true).Bytes(), false, false},
		"body over content-length, two DATA":  {headers(req("content-length", "6")...).message(1, nil, false).message(1, []byte("x"), true).Bytes(), false, false},
		"body under content-length":           {headers(req("content-length", "9")...).message(1, []byte("x"), true).Bytes(), false, false},
		"body under content-length, trailers": {headers(req("content-length", "9")...).message(1, []byte("x"), false).trailers(1, true, "x-t", "1").Bytes(), false, false},
	}
}

// TestMalformedRequests: in both modes (the router, and grpc-go's server
// behind checkedConn), each malformed request gets RST_STREAM with
// PROTOCOL_ERROR and the connection serves on; a request whose body matches
// its content-length is answered.
func TestMalformedRequests(t *testing.T) {
	s := start(t, nil)
	sock := s.client.Target()[len("unix://"):]
	v := runtimeapi.RuntimeService_Version_FullMethodName
	for name, c := range malformedRequests() {
		before := s.backend.count(v)
		// Stream 3, a valid call after it, proves the connection serves on.
		in := append(bytes.Clone(c.in), newFrames().request(3, v, false).message(3, nil, true).Bytes()...)
		rst, goaway, answered := talk(t, sock, in, 3)
		if c.connOK && !grpcMode() {
			// x/net's field checks, which the router's header blocks share,
			// make a duplicate pseudo-header field a connection error.
			if goaway == nil || *goaway != http2.ErrCodeProtocol {
				t.Errorf("%s: GOAWAY %v, want PROTOCOL_ERROR", name, goaway)
			}
			continue
		}
		if len(rst) == 0 || rst[0] != (rstAt{1, http2.ErrCodeProtocol}) {
			t.Errorf("%s: RST_STREAMs %v, want stream 1 PROTOCOL_ERROR first", name, rst)
		}
		if goaway != nil {
			t.Errorf("%s: GOAWAY %v", name, *goaway)
		}
		if !answered {
			t.Errorf("%s: the next call on the connection was not answered", name)
		}
		if got := s.backend.count(v) - before; c.headers && got != 1 {
			t.Errorf("%s: the backend saw %d calls, want 1 (the valid one)", name, got)
		}
	}
	f := newFrames().raw(http2.FrameSettings, 0, 0, nil)
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: f.block(
		":method", "POST", ":scheme", "http", ":path", v, ":authority", "x", "content-type", "application/grpc", "te", "trailers", "content-length", "6"),
		Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}})
	f.raw(http2.FramePriority, 0, 1, []byte{0, 0, 0, 0, 16})
	f.message(1, []byte("x"), true)
	rst, goaway, answered := talk(t, sock, f.Bytes(), 1)
	if len(rst) > 0 || goaway != nil || !answered {
		t.Errorf("a valid request with a content-length and priorities: RST_STREAMs %v, GOAWAY %v, answered %v", rst, goaway, answered)
	}
}

type rstAt struct {
	id   uint32
	code http2.ErrCode
}

// talk writes the client preface and in to the relay at sock and reads what
// it answers until stream answer has ended (answered), the relay closes the
// connection, or 10 s have passed. Unlike exchange it keeps its side of the
// connection open meanwhile: grpc-go's server drops what it has not written
// when the caller's side closes.
func talk(t *testing.T, sock string, in []byte, answer uint32) (rst []rstAt, goaway *http2.ErrCode, answered bool) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() { _, _ = c.Write(append([]byte(http2.ClientPreface), in...)) }()
	fr := http2.NewFramer(io.Discard, c)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("no end of stream %d within 10 s", answer)
			} else if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "connection reset") {
				t.Errorf("reading the relay's frames: %v", err)
			}
			return rst, goaway, answered
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			rst = append(rst, rstAt{f.StreamID, f.ErrCode})
			if f.StreamID == answer {
				return rst, goaway, false
			}
		case *http2.GoAwayFrame:
			code := f.ErrCode
			goaway = &code
			return rst, goaway, answered
		case *http2.HeadersFrame:
			if f.StreamID == answer && f.StreamEnded() {
				return rst, goaway, true
			}
		case *http2.DataFrame:
			if f.StreamID == answer && f.StreamEnded() {
				return rst, goaway, true
			}
		}
	}
}

// TestCheckedConnPassesBytes: checkedConn hands grpc-go every byte of a
// well-formed connection unchanged, however its reads are cut.
func TestCheckedConnPassesBytes(t *testing.T) {
	seeds := fuzzSeeds()
	in := append([]byte(http2.ClientPreface), seeds["two calls and a ping"]...)
	in = append(in, newFrames().raw(http2.FramePriority, 0, 3, []byte{0, 0, 0, 1, 16}).Bytes()...)
	for _, size := range []int{1, 7, 9, 100, 1 << 16} {
		a, b := net.Pipe()
		go func() { _, _ = a.Write(in); a.Close() }()
		c := newCheckedConn(b)
		var got []byte
		buf := make([]byte, size)
		for {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		if !bytes.Equal(got, in) {
			t.Errorf("reads of %d: %d bytes out of %d in, or changed", size, len(got), len(in))
		}
	}
}

// FuzzCheckedConn feeds checkedConn arbitrary frames: it never panics or
// hangs, and what it passes on is what came in unless it refused a request
// (refusedField is then in it).
func FuzzCheckedConn(f *testing.F) {
	for _, in := range fuzzSeeds() {
		f.Add(in)
	}
	for _, c := range malformedRequests() {
		f.Add(c.in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		in = append([]byte(http2.ClientPreface), in...)
		a, b := net.Pipe()
		go func() { _, _ = a.Write(in); a.Close() }()
		out, err := io.ReadAll(newCheckedConn(b))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out, refusedField) && !bytes.Equal(out, in) {
			t.Fatalf("%d bytes out of %d in, changed, and no request refused", len(out), len(in))
		}
	})
}
