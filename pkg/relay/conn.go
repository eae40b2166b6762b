package relay

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
)

// Upstream kinds: where a stream goes.
const (
	upRuntime = iota
	upImage
	upInner
	upKinds
	down = -1 // the caller's connection
)

// peer is one HTTP/2 connection of a session: the caller's, or one it
// opened to a backend or to the gRPC handler.
type peer struct {
	kind int
	conn net.Conn
	w    *sockWriter
	br   *bufio.Reader
	bw   *bufio.Writer
	fr   *http2.Framer
	hdr  *headerBlock   // header blocks read from the peer
	enc  *headerEncoder // header blocks written to it

	sendConn   int64  // connection window the peer granted us
	initWindow int64  // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	maxFrame   int    // the peer's SETTINGS_MAX_FRAME_SIZE
	recvConn   int64  // connection window we granted the peer, left
	unacked    int64  // bytes of it consumed and not yet granted again
	nextID     uint32 // upstream: the next stream ID we open
	streams    map[uint32]*stream
	goaway     bool // upstream: it sent GOAWAY; no new streams on it
	dead       bool
	dirty      bool

	// Upstream: the peer's SETTINGS_MAX_CONCURRENT_STREAMS (unlimited until
	// its SETTINGS say otherwise, RFC 9113's initial value; holding streams
	// until the first SETTINGS stalled calls under load: docs/architecture.md)
	// and SETTINGS_MAX_HEADER_LIST_SIZE (0: none said). Streams beyond the
	// limit wait, in order, as they do in grpc-go's client.
	maxStreams    uint32
	maxHeaderList uint32
	waiting       []*stream

	// Abuse accounting (see the limits in doc.go).
	ctrl int // PING and SETTINGS received since we last sent HEADERS or DATA
}

// newPeer wraps c; each write to it is bounded by writeTimeout.
func newPeer(kind int, c net.Conn, writeTimeout time.Duration) *peer {
	rw := newRawIO(c)
	// Writes never wait under the session's lock (sockWriter); what the
	// socket does not take at once is written by a goroutine with a
	// deadline per write: a deadline set at the last flush is long past
	// after a quiet spell, and a large frame written then failed at once
	// (found at kubelet's pace, TestCallAfterAQuietSpell).
	w := newSockWriter(c, writeTimeout)
	p := &peer{kind: kind, conn: c, w: w, br: bufio.NewReaderSize(rw, 32<<10), bw: bufio.NewWriterSize(w, 32<<10),
		sendConn: 65535, initWindow: 65535, maxFrame: frameSize, recvConn: connWindow, nextID: 1, streams: map[uint32]*stream{},
		maxStreams: 1<<32 - 1}
	p.fr = http2.NewFramer(p.bw, p.br)
	p.fr.SetMaxReadFrameSize(frameSize)
	p.fr.SetReuseFrames() // DATA frames: handled, or copied, before the next read
	p.hdr = newHeaderBlock()
	p.enc = newHeaderEncoder()
	return p
}

// writeHeaders encodes fields for p and writes them as HEADERS and
// CONTINUATION frames of at most p's frame size.
func (p *peer) writeHeaders(id uint32, fields []hpack.HeaderField, end bool) {
	p.ctrl = 0
	p.enc.block()
	for _, f := range fields {
		p.enc.field(f)
	}
	block := p.enc.buf
	first := true
	for first || len(block) > 0 {
		n := min(len(block), p.maxFrame)
		frag := block[:n]
		block = block[n:]
		if first {
			_ = p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndStream: end, EndHeaders: len(block) == 0})
			first = false
		} else {
			_ = p.fr.WriteContinuation(id, len(block) == 0, frag)
		}
	}
	p.dirty = true
}

// upstream returns the session's connection of kind, opening it if needed.
func (s *session) upstream(kind int) (*peer, error) {
	if p := s.ups[kind]; p != nil && !p.dead && !p.goaway {
		return p, nil
	}
	var c net.Conn
	var err error
	switch kind {
	case upInner:
		c, err = s.srv.innerL.dial()
	case upImage:
		c, err = dialBackend(s.r.image)
	default:
		c, err = dialBackend(s.r.runtime)
	}
	if err != nil {
		return nil, err
	}
	p := newPeer(kind, c, s.r.ioTimeout)
	if _, err := p.bw.WriteString(http2.ClientPreface); err != nil {
		c.Close()
		return nil, err
	}
	_ = p.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	)
	_ = p.fr.WriteWindowUpdate(0, connWindow-65535)
	p.dirty = true
	s.ups[kind] = p
	s.readers.Add(1)
	go s.read(p)
	return p, nil
}

// dialBackend connects to the unix socket behind a backend client.
func dialBackend(cc *grpc.ClientConn) (net.Conn, error) {
	path := strings.TrimPrefix(cc.Target(), "unix://")
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("connection error: desc = \"transport: Error while dialing: %v\"", err)
	}
	return c, nil
}

// connErr is a connection error of ours: the peer broke the protocol.
type connErr struct {
	code http2.ErrCode
	why  string
}

func (e connErr) Error() string { return fmt.Sprintf("http2 %v: %s", e.code, e.why) }

func protoErr(format string, args ...any) error {
	return connErr{http2.ErrCodeProtocol, fmt.Sprintf(format, args...)}
}

// errCode is the GOAWAY code for err, and whether the peer broke the
// protocol (rather than going away).
func errCode(err error) (http2.ErrCode, bool) {
	var ce connErr
	var hce http2.ConnectionError
	var hse http2.StreamError
	switch {
	case errors.As(err, &ce):
		return ce.code, true
	case errors.As(err, &hce):
		return http2.ErrCode(hce), true
	case errors.As(err, &hse):
		return hse.Code, true
	case errors.Is(err, http2.ErrFrameTooLarge):
		return http2.ErrCodeFrameSize, true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrDeadlineExceeded):
		return http2.ErrCodeNo, false
	}
	var ne *net.OpError
	if errors.As(err, &ne) {
		return http2.ErrCodeNo, false
	}
	return http2.ErrCodeProtocol, true
}
