package relay

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The HTTP/2 router: the caller-facing side of the relay.
//
// grpc-go's server and client around every relayed call cost several times
// what the extra process itself costs (docs/architecture.md, "What a hop
// costs"). So the caller's connection is served here at the HTTP/2 frame
// level: each new stream's :path is read from its HEADERS, and
//
//   - a stream nothing intercepts has its frames forwarded to a backend
//     HTTP/2 connection (containerd's socket, or the image endpoint's), with
//     the headers re-encoded for that connection and stream IDs and flow
//     control kept per connection: the messages are neither parsed nor
//     copied into messages, and no goroutine is handed the call;
//   - a stream an interceptor, a gate that is open, a stream filter or debug
//     logging wants goes the same way to an in-process grpc.Server that runs
//     the relay's gRPC handler (Relay.handle), which decodes, intercepts and
//     calls the backend through grpc-go as before.
//
// Each caller connection gets its own backend connections, opened on its
// first stream for them, as the byte relays of the floor do. Everything a
// session touches is guarded by its one mutex; its readers (one per
// connection) take it per frame and flush what the frame made them write
// once their input buffer is empty, so that frames that arrive together
// leave together.
const (
	// frameSize is the largest frame either side is allowed to send us (the
	// HTTP/2 default). Every frame read fits any peer, so frames are
	// forwarded as they came.
	frameSize = 16384
	// maxHeaderList bounds a decoded header list, grpc-go's server default.
	maxHeaderList = 16 << 20
	// maxStreams bounds a caller connection's concurrent streams.
	maxStreams = 1000
)

// ioTimeout bounds a write to a peer that does not read, and the caller's
// connection preface (Relay.ioTimeout, which tests shorten).
const ioTimeout = 30 * time.Second

// Observer is told about every relayed call when it ends: its method, the
// gRPC status code it ended with (the backend's, or the relay's own) and how
// long it took. It runs with the relay's session lock held: it must not
// block (count, observe a histogram). Without one, nothing is timed.
type Observer func(method string, code codes.Code, elapsed time.Duration)

// WithObserver installs an observer for every relayed call.
func WithObserver(o Observer) Option { return func(r *Relay) { r.observe = o } }

// observeStream is the observer as a grpc-go interceptor (WithGRPCServer).
func (r *Relay) observeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	r.observe(info.FullMethod, status.Code(err), time.Since(start))
	return err
}

// route is what the router needs to know of a method when a stream of it
// opens, gathered from the relay's options once (Relay.makeRoutes).
type route struct {
	unary    bool
	filtered bool        // a stream filter: always the gRPC handler
	gate     func() bool // with interceptors: they apply while it says so (nil: always)
	hasIcs   bool        // interceptors
}

func (r *Relay) makeRoutes() map[string]route {
	routes := map[string]route{}
	for m := range r.unary {
		routes[m] = route{unary: true}
	}
	for m := range r.filters {
		rt := routes[m]
		rt.filtered = true
		routes[m] = rt
	}
	for m, ics := range r.table {
		if len(ics) > 0 {
			rt := routes[m]
			rt.hasIcs, rt.gate = true, r.gates[m]
			routes[m] = rt
		}
	}
	return routes
}

// intercepted says whether a new stream of a method routed so must go
// through the gRPC handler rather than straight to the backend.
func (r *Relay) intercepted(rt route) bool {
	if r.debug {
		return true // the debug log decodes the IDs of every call
	}
	return rt.filtered || rt.hasIcs && (rt.gate == nil || rt.gate())
}

// Server serves the relay on listeners: the caller-facing side of inplaced.
type Server struct {
	r      *Relay
	inner  *grpc.Server  // Relay.handle, for intercepted streams
	innerL *connListener // in-process connections to inner

	mu        sync.Mutex
	listeners map[net.Listener]bool
	sessions  map[*session]bool
	stopping  bool
	drain     drainState     // Drain's (drain.go)
	wg        sync.WaitGroup // sessions
	done      chan struct{}  // closed by Stop and GracefulStop
}

// NewServer returns a server for r. Serve it on a listener; stop it with
// Drain then Stop (drain.go), GracefulStop (after Relay.Drain) or Stop.
func (r *Relay) NewServer() *Server {
	opts := r.ServerOptions()
	if r.grpcAll {
		// The callers' connections are the inner server's own: it enforces
		// the stream limit we advertise, and the observer sees each call.
		opts = append(opts, grpc.MaxConcurrentStreams(maxStreams))
		if r.observe != nil {
			opts = append(opts, grpc.ChainStreamInterceptor(r.observeStream))
		}
	}
	s := &Server{r: r, inner: grpc.NewServer(opts...), innerL: newConnListener(),
		listeners: map[net.Listener]bool{}, sessions: map[*session]bool{}, done: make(chan struct{})}
	go func() { _ = s.inner.Serve(s.innerL) }() // returns when inner stops
	go func() {
		select {
		case <-r.drain:
			s.drainStreams()
		case <-s.done:
		}
	}()
	return s
}

// Serve accepts caller connections on lis until the server stops. It
// returns grpc.ErrServerStopped when it was stopped before it began, nil
// when stopped while serving, and the listener's error otherwise.
func (s *Server) Serve(lis net.Listener) error {
	lis = s.handoff(lis)
	if s.r.grpcAll {
		return s.inner.Serve(checkedListener{lis}) // the router's request checks first (grpccheck.go)
	}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		lis.Close()
		return grpc.ErrServerStopped
	}
	s.listeners[lis] = true
	s.mu.Unlock()
	for {
		c, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping
			delete(s.listeners, lis)
			s.mu.Unlock()
			if stopping {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return err
		}
		s.mu.Lock()
		if s.stopping || s.drain.draining {
			s.mu.Unlock()
			s.lateConn(lis, c)
			continue
		}
		sess := newSession(s, c)
		s.sessions[sess] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go sess.serve()
	}
}

func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopping {
		s.stopping = true
		close(s.done)
	}
	for l := range s.listeners {
		l.Close()
	}
}

// GracefulStop stops accepting, tells every caller to open no new stream
// (GOAWAY) and returns when their streams have ended.
func (s *Server) GracefulStop() {
	s.stop()
	s.mu.Lock()
	for sess := range s.sessions {
		sess.goAway()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.inner.GracefulStop()
	s.innerL.Close()
	s.releaseHandoffs()
}

// Stop closes every connection at once.
func (s *Server) Stop() {
	s.stop()
	s.mu.Lock()
	for sess := range s.sessions {
		sess.closeAsync()
	}
	s.mu.Unlock()
	s.inner.Stop()
	s.innerL.Close()
	s.releaseHandoffs()
	s.wg.Wait()
}

// drainStreams ends the endless streams that pass through (those of the
// gRPC handler end by themselves, Relay.handleStream): Unavailable, as
// before; the other streams run on, as unary calls do (drain.go).
func (s *Server) drainStreams() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		sess.mu.Lock()
		for _, st := range sess.streams {
			if endless[st.method] && st.up != nil && st.up.kind != upInner {
				sess.failStream(st, codes.Unavailable, "inplaced is shutting down")
			}
		}
		sess.flush()
		sess.mu.Unlock()
	}
}

func (s *Server) sessionDone(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.wg.Done()
}

// Upstream kinds: where a stream goes.
const (
	upRuntime = iota
	upImage
	upInner
	upKinds
	down = -1 // the caller's connection
)

// Sides of a stream.
const (
	sideDown = 0 // the caller
	sideUp   = 1 // the backend or the gRPC handler
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
	// its SETTINGS say otherwise, RFC 9113's initial value: holding streams
	// until the first SETTINGS stalled calls under load, not understood
	// yet) and
	// SETTINGS_MAX_HEADER_LIST_SIZE (0: none said). Streams beyond the
	// limit wait, in order, as they do in grpc-go's client.
	maxStreams    uint32
	maxHeaderList uint32
	waiting       []*stream

	// Abuse accounting (see the limits in doc.go).
	ctrl int // PING and SETTINGS received since we last sent HEADERS or DATA
}

// stream is one call: the caller's stream and the stream it was given on an
// upstream connection.
type stream struct {
	method  string
	unary   bool
	start   time.Time
	up      *peer
	ids     [2]uint32
	win     [2]int64  // send window that side granted for the stream
	q       [2][]item // frames waiting for that side's window, in order
	sentEnd [2]bool   // END_STREAM written to that side
	gotEnd  [2]bool   // END_STREAM received from that side
	recv    [2]int64  // receive window we granted that side, left
	unacked [2]int64
	msgs    [2]msgScanner // gRPC message lengths from that side
	resp    bool          // response headers sent to the caller
	waiting bool          // queued for its upstream's MAX_CONCURRENT_STREAMS: no upstream ID yet
	local   bool          // answered by the router itself: nothing goes upstream
	clen    int64         // the request's content-length still to come; -1: none
	rstDown bool          // the backend reset the stream with NO_ERROR: pass it on after q[sideDown]
	code    codes.Code
	removed bool
}

// item is a frame waiting for a window: data (credited back to the
// sending side when written) or a header block, with END_STREAM or not.
type item struct {
	data    []byte
	buf     *[]byte // data's buffer, from queuedData, while it waits
	headers []hpack.HeaderField
	end     bool
}

type session struct {
	srv *Server
	r   *Relay

	mu        sync.Mutex
	down      *peer
	ups       [upKinds]*peer
	retired   []*peer            // upstream connections no new stream uses, still carrying streams
	streams   map[uint32]*stream // by the caller's stream ID
	lastID    uint32             // the caller's highest stream ID
	resets    int                // caller resets and refusals of unanswered streams, less answered streams (rapidResetLimit)
	waste     int                // the caller's resets and control frames past paceFree, not yet paced
	goingAway bool
	started   bool // our SETTINGS went out: GOAWAY may follow
	closed    bool
	readers   sync.WaitGroup
}

func newSession(srv *Server, c net.Conn) *session {
	s := &session{srv: srv, r: srv.r, streams: map[uint32]*stream{}}
	s.down = newPeer(down, c, srv.r.ioTimeout)
	return s
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

// serve runs the caller's connection: preface, settings, then its frames.
func (s *session) serve() {
	defer s.srv.sessionDone(s)
	p := s.down
	_ = p.conn.SetReadDeadline(time.Now().Add(s.r.ioTimeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(p.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		p.conn.Close()
		return
	}
	_ = p.conn.SetReadDeadline(time.Time{})
	s.mu.Lock()
	_ = p.fr.WriteSettings(
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: maxStreams},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	)
	_ = p.fr.WriteWindowUpdate(0, connWindow-65535)
	p.dirty = true
	s.started = true
	s.flush()
	closed := s.closed
	s.mu.Unlock()
	if closed { // stopped while the preface came
		return
	}
	s.readers.Add(1)
	s.read(p)
	s.readers.Wait()
}

// read handles p's frames until p fails or the session closes.
func (s *session) read(p *peer) {
	defer s.readers.Done()
	for {
		f, err := p.fr.ReadFrame()
		s.mu.Lock()
		if s.closed || p.dead {
			s.mu.Unlock()
			return
		}
		if err == nil {
			err = s.handle(p, f)
		}
		if err != nil {
			s.fail(p, err)
			s.flush()
			s.mu.Unlock()
			return
		}
		var full *sockWriter
		if p.br.Buffered() == 0 {
			s.flush()
			full = s.overflowing(p)
		}
		pause := p == s.down && s.paced()
		if pause {
			s.flush() // what the wasted frames asked for goes out first
			if s.r.onPause != nil {
				s.r.onPause()
			}
		}
		s.mu.Unlock()
		if pause {
			time.Sleep(pacePause)
		}
		if full != nil {
			// A peer is not taking what we write: stop reading until it
			// does (or its write deadline ends it), so that what waits for
			// it stays bounded and the backpressure reaches our sender.
			full.wait(maxOverflow, s.r.ioTimeout)
		}
	}
}

// overflowing is a peer that p's frames are forwarded to (the backends for
// the caller, the caller for a backend) whose writes wait beyond
// maxOverflow, if any: one atomic load per peer and flush. A reader never
// waits for its own peer's overflow, as a byte relay's direction never waits
// for the other: a backend that stops reading while its answers to us
// block (grpc-go's reader throttles behind its writer) drains only if we
// keep reading it, so waiting on it would deadlock both until the write
// deadline (TestLargeMessagesBothWays, -count=30).
func (s *session) overflowing(p *peer) *sockWriter {
	if p != s.down {
		if s.down.w.queued.Load() > maxOverflow {
			return s.down.w
		}
		return nil
	}
	for _, u := range s.ups {
		if u != nil && u.w.queued.Load() > maxOverflow {
			return u.w
		}
	}
	for _, u := range s.retired {
		if u.w.queued.Load() > maxOverflow {
			return u.w
		}
	}
	return nil
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

// fail ends what depends on p after err: the whole session when p is the
// caller's connection, p's streams when it is an upstream one.
func (s *session) fail(p *peer, err error) {
	code, proto := errCode(err)
	if proto && !p.dead {
		last := s.lastID
		if p.kind != down {
			last = 0 // we never open streams towards an upstream peer's side
		}
		_ = p.fr.WriteGoAway(last, code, nil)
		_ = p.bw.Flush()
		if code == http2.ErrCodeEnhanceYourCalm && p.w.stalled.Load() {
			p.conn.Close() // an abuser that does not read: no waiting for it
		}
	}
	if p.kind == down {
		s.r.log.Debug("caller connection closed", zap.Error(err))
		s.closeLocked()
		return
	}
	s.r.log.Debug("backend connection closed", zap.Error(err))
	s.upFailed(p, fmt.Sprintf("backend connection closed: %v", err))
}

// upFailed ends p's streams with Unavailable, as grpc-go's client does when
// its connection breaks, and forgets p.
func (s *session) upFailed(p *peer, msg string) {
	p.dead = true
	p.w.close()
	for _, st := range p.streams {
		s.failStream(st, codes.Unavailable, msg)
	}
	for _, st := range p.waiting {
		s.failStream(st, codes.Unavailable, msg)
	}
	p.waiting = nil
	if s.ups[p.kind] == p {
		s.ups[p.kind] = nil
	}
}

func (s *session) closeAsync() {
	s.mu.Lock()
	s.closeLocked()
	s.mu.Unlock()
}

func (s *session) closeLocked() {
	if s.closed {
		return
	}
	s.closed = true
	s.down.dead = true
	s.down.w.close()
	for _, p := range s.ups {
		if p != nil {
			p.dead = true
			p.w.close()
		}
	}
	for _, st := range s.streams {
		if st.up != nil && !st.up.dead {
			st.up.dead = true
			st.up.w.close()
		}
		s.remove(st, codes.Canceled)
	}
}

// goAway is GracefulStop's: no new streams; the session ends with its
// last stream.
func (s *session) goAway() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.goAwayLocked()
	s.flush()
}

func (s *session) goAwayLocked() {
	if s.goingAway {
		return
	}
	s.goingAway = true
	if !s.started {
		s.closeLocked() // nothing was said on the connection yet
		return
	}
	if !s.closed {
		_ = s.down.fr.WriteGoAway(s.lastID, http2.ErrCodeNo, nil)
		s.down.dirty = true
		if len(s.streams) == 0 {
			_ = s.down.bw.Flush()
			s.closeLocked()
		}
	}
}

// flush writes out what the session's peers have buffered.
func (s *session) flush() {
	flush := func(p *peer) {
		if p == nil || !p.dirty || p.dead {
			return
		}
		p.dirty = false
		if err := p.bw.Flush(); err != nil {
			if p.kind == down {
				s.closeLocked()
			} else {
				s.upFailed(p, fmt.Sprintf("write to backend: %v", err))
			}
		}
	}
	flush(s.down)
	for _, p := range s.ups {
		flush(p)
	}
	// Upstream connections a GOAWAY retired still carry their last streams.
	live := s.retired[:0]
	for _, p := range s.retired {
		flush(p)
		if !p.dead {
			live = append(live, p)
		}
	}
	clear(s.retired[len(live):])
	s.retired = live
}

// handle is one frame from p.
func (s *session) handle(p *peer, f http2.Frame) error {
	switch f := f.(type) {
	case *http2.HeadersFrame:
		p.hdr.begin(f)
		return s.headerFragment(p, f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame: // the Framer saw that it continues p.hdr's block
		return s.headerFragment(p, f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return s.data(p, f)
	case *http2.RSTStreamFrame:
		return s.reset(p, f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := s.controlFrame(p, limitSettingsFlood); err != nil {
			return err
		}
		grew, err := s.settings(p, f)
		if err != nil {
			return err
		}
		// Acknowledged before what the change lets us send, as x/net's
		// write scheduler orders them (control frames first).
		_ = p.fr.WriteSettingsAck()
		p.dirty = true
		if grew {
			s.flushPeer(p)
		}
	case *http2.WindowUpdateFrame:
		return s.windowUpdate(p, f)
	case *http2.PingFrame:
		return s.ping(p, f)
	case *http2.GoAwayFrame:
		if p.kind == down {
			return nil // the caller opens no more streams; those open go on
		}
		p.goaway = true
		if s.ups[p.kind] == p {
			s.ups[p.kind] = nil
			s.retired = append(s.retired, p)
		}
		for id, st := range p.streams {
			if id > f.LastStreamID { // never processed: the caller may retry it
				s.resetBoth(st, http2.ErrCodeRefusedStream, codes.Unavailable)
			}
		}
		for _, st := range p.waiting { // never sent: the same
			s.resetBoth(st, http2.ErrCodeRefusedStream, codes.Unavailable)
		}
		p.waiting = nil
		s.retire(p)
	case *http2.PushPromiseFrame:
		return protoErr("PUSH_PROMISE") // disabled on upstream connections, illegal from a client
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID && p.kind == down { // RFC 9113 §5.3.1: a stream error
			if st := s.streams[f.StreamID]; st != nil {
				s.resetBoth(st, http2.ErrCodeProtocol, codes.Internal)
				return nil
			}
			_ = p.fr.WriteRSTStream(f.StreamID, http2.ErrCodeProtocol)
			p.dirty = true
			return s.controlFrame(p, limitClosedStreamFlood)
		}
	case *http2.UnknownFrame:
	}
	return nil
}

// headerFragment decodes a fragment of p's header block and, when it was
// the last, passes the block on.
func (s *session) headerFragment(p *peer, frag []byte, last bool) error {
	h := p.hdr
	id := h.stream
	if h.frames++; h.frames > maxHeaderFrames {
		return s.abuse(p, limitContinuationFlood)
	}
	if done, err := h.write(frag, last); !done {
		return err
	}
	if p.kind == down {
		return s.callerHeaders(id, h)
	}
	st := p.streams[id]
	if st == nil {
		return nil // reset or failed meanwhile
	}
	if st.gotEnd[sideUp] {
		return protoErr("HEADERS after END_STREAM on stream %d", id)
	}
	if h.end {
		st.gotEnd[sideUp] = true
		st.code = statusOf(h.fields)
	}
	st.resp = true
	s.send(st, sideUp, item{headers: h.fields, end: h.end})
	return nil
}

// callerHeaders opens a stream or carries the caller's trailers.
func (s *session) callerHeaders(id uint32, h *headerBlock) error {
	fields, end := h.fields, h.end
	if st := s.streams[id]; st != nil {
		if st.gotEnd[sideDown] {
			return connErr{http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS after END_STREAM on stream %d", id)}
		}
		if !end || h.pseudo != 0 || st.clen >= 0 && !takeBody(&st.clen, 0, true) {
			// Trailers end the stream and carry no pseudo-header field
			// (RFC 9113 §8.1, §8.3), and the body must have matched its
			// content-length (§8.1.1): a malformed request, a stream error.
			s.resetBoth(st, http2.ErrCodeProtocol, codes.Internal)
			return nil
		}
		st.gotEnd[sideDown] = end
		s.send(st, sideDown, item{headers: fields, end: end})
		return nil
	}
	if id%2 == 0 || id <= s.lastID {
		// A closed stream, or one skipped (closed by then): grpc-go's server
		// ends the connection too.
		return protoErr("HEADERS opening stream %d after %d", id, s.lastID)
	}
	s.lastID = id
	bad, clen := badRequest(h)
	if bad {
		// RFC 9113 §5.3.1, §8.1.1: a stream error; nothing is opened.
		_ = s.down.fr.WriteRSTStream(id, http2.ErrCodeProtocol)
		s.down.dirty = true
		return s.countReset()
	}
	if s.resetNext(id) {
		// Opened and reset in one breath (CVE-2023-44487's pattern): the
		// backend never hears of it; the caller's budget pays.
		return s.countReset()
	}
	if s.goingAway || len(s.streams) >= maxStreams {
		// The limit we advertised (RFC 9113 §5.1.2). A refusal costs the
		// caller nothing and us a header block and a frame: counted as a
		// reset (rapidResetLimit).
		_ = s.down.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		s.down.dirty = true
		if !s.goingAway {
			return s.countReset()
		}
		return nil
	}
	method := pseudoValue(fields, ":path")
	rt := s.r.routes[method]
	st := &stream{method: method, unary: rt.unary, code: codes.Unknown, clen: clen}
	st.ids[sideDown] = id
	st.win[sideDown] = s.down.initWindow
	st.recv = [2]int64{streamWindow, streamWindow}
	st.gotEnd[sideDown] = end
	if s.r.observe != nil {
		st.start = time.Now()
	}
	s.streams[id] = st
	if status, why := grpcRequest(fields); status != "" {
		s.answerLocally(st, status, why)
		return nil
	}
	kind := upRuntime
	switch {
	case s.r.intercepted(rt):
		kind = upInner
	case strings.HasPrefix(method, imageServicePrefix):
		kind = upImage
	}
	up, err := s.upstream(kind)
	if err != nil {
		s.failStream(st, codes.Unavailable, err.Error())
		return nil
	}
	st.up = up
	if uint32(len(up.streams)) >= up.maxStreams {
		// Over the backend's limit: the stream waits for one of up's to
		// end, its frames queued (flow control bounds them).
		st.waiting = true
		up.waiting = append(up.waiting, st)
	} else {
		s.open(st)
	}
	s.send(st, sideDown, item{headers: fields, end: end})
	return nil
}

// resetNext says whether the caller's next frame, already read into the
// buffer, is an RST_STREAM of stream id, and if so consumes it: a stream
// opened and reset before we wrote anything for it need not reach the
// backend. A look at 13 buffered bytes, no copy: kubelet's next frame is
// its DATA, which fails the type check.
func (s *session) resetNext(id uint32) bool {
	br := s.down.br
	if br.Buffered() < 13 {
		return false
	}
	b, err := br.Peek(13)
	if err != nil || b[0] != 0 || b[1] != 0 || b[2] != 4 || http2.FrameType(b[3]) != http2.FrameRSTStream ||
		binary.BigEndian.Uint32(b[5:9])&(1<<31-1) != id {
		return false
	}
	_, _ = br.Discard(13)
	return true
}

// open gives st its stream on its upstream connection.
func (s *session) open(st *stream) {
	up := st.up
	st.waiting = false
	st.ids[sideUp] = up.nextID
	up.nextID += 2
	if up.nextID >= 1<<31-1 {
		up.goaway = true // stream IDs used up: the next stream opens a new connection
		if s.ups[up.kind] == up {
			s.ups[up.kind] = nil
		}
		s.retired = append(s.retired, up)
	}
	st.win[sideUp] = up.initWindow
	up.streams[st.ids[sideUp]] = st
}

// startWaiting opens the streams waiting for p's stream limit, in order,
// as far as the limit allows, and sends what they queued.
func (s *session) startWaiting(p *peer) {
	for len(p.waiting) > 0 && uint32(len(p.streams)) < p.maxStreams && !p.dead && !p.goaway {
		st := p.waiting[0]
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		if st.removed {
			continue
		}
		s.open(st)
		s.flushQueue(st, sideUp)
	}
	if len(p.waiting) == 0 {
		p.waiting = nil
	}
}

// badRequest says whether the request whose header block h just ended is
// one that must reach no backend (a stream error, RFC 9113 §5.3.1, §8.1.1),
// and returns its content-length, -1 if it has none. The router's check,
// and checkedConn's in front of grpc-go's server.
func badRequest(h *headerBlock) (bool, int64) {
	malformed, clen := malformedRequest(h.fields)
	return h.selfDep || malformed, clen
}

// takeBody takes n bytes of a request's DATA off left, what its
// content-length says is still to come, and says whether the body still
// agrees with it: never more than declared, and all of it by the end of the
// stream (RFC 9113 §8.1.1).
func takeBody(left *int64, n int, end bool) bool {
	*left -= int64(n)
	return *left >= 0 && !(end && *left != 0)
}

// malformedRequest: a request's pseudo-header fields missing or empty, or a
// connection-specific field (RFC 9113 §8.2.2, §8.3.1).
// It also returns the request's content-length, -1 if it has none (gRPC
// sends none).
func malformedRequest(fields []hpack.HeaderField) (bool, int64) {
	var seen uint8
	clen := int64(-1)
	for _, f := range fields {
		if bit := pseudoBit(f.Name); bit != 0 {
			if f.Value == "" && bit != pseudoAuthority {
				return true, clen
			}
			seen |= bit
			continue
		}
		switch f.Name {
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			return true, clen
		case "te":
			if f.Value != "trailers" {
				return true, clen
			}
		case "content-length":
			n, err := strconv.ParseInt(f.Value, 10, 64)
			if err != nil || n < 0 {
				return true, clen
			}
			clen = n
		}
	}
	return seen&(pseudoMethod|pseudoScheme|pseudoPath) != pseudoMethod|pseudoScheme|pseudoPath, clen
}

// grpcRequest says why a request is not a gRPC call, as grpc-go's server
// does: the HTTP status and a message; "" for a gRPC call.
func grpcRequest(fields []hpack.HeaderField) (status, why string) {
	method, ct := "", ""
	for _, f := range fields {
		switch f.Name {
		case ":method":
			method = f.Value
		case "content-type":
			ct = f.Value
		}
	}
	if method != "POST" {
		return "405", "inplaced serves gRPC (CRI) only: the method must be POST, not " + strconv.Quote(method)
	}
	if rest, ok := strings.CutPrefix(ct, "application/grpc"); !ok || rest != "" && rest[0] != '+' && rest[0] != ';' {
		return "415", "inplaced serves gRPC (CRI) only: content-type must be application/grpc, not " + strconv.Quote(ct)
	}
	return "", ""
}

// answerLocally ends a request that is not a gRPC call with an answer of
// the router's own, as grpc-go's server does (the HTTP status, grpc-status
// Internal) plus the message as a body: no backend sees it. The body
// follows the caller's flow control, so the stream counts against
// maxStreams until the caller has taken it, as RFC 9113 §5.1.2 expects.
func (s *session) answerLocally(st *stream, httpStatus, why string) {
	st.local = true
	st.code = codes.Internal
	st.sentEnd[sideUp], st.gotEnd[sideUp] = true, true // nothing goes upstream
	st.resp = true
	s.send(st, sideUp, item{headers: []hpack.HeaderField{
		{Name: ":status", Value: httpStatus},
		{Name: "content-type", Value: "text/plain; charset=utf-8"},
		{Name: "grpc-status", Value: strconv.Itoa(int(codes.Internal))},
		{Name: "grpc-message", Value: encodeGrpcMessage(why)},
	}})
	s.send(st, sideUp, item{data: []byte(why + "\n"), end: true})
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

// data is a DATA frame from p: flow control, message limits, forwarding.
func (s *session) data(p *peer, f *http2.DataFrame) error {
	n := int64(f.Header().Length)
	if n > p.recvConn {
		return connErr{http2.ErrCodeFlowControl, "DATA beyond the connection window"}
	}
	p.recvConn -= n
	from := sideUp
	var st *stream
	if p.kind == down {
		from = sideDown
		st = s.streams[f.StreamID]
		if st == nil && f.StreamID > s.lastID {
			return protoErr("DATA on idle stream %d", f.StreamID)
		}
	} else {
		st = p.streams[f.StreamID]
	}
	if st == nil {
		s.creditConn(p, n) // a stream reset meanwhile: its bytes free the window at once
		if p.kind == down {
			// A closed stream (RFC 9113 §5.1): STREAM_CLOSED, as x/net's
			// server answers; harmless after a reset of ours, which the
			// caller ignores as we would.
			_ = p.fr.WriteRSTStream(f.StreamID, http2.ErrCodeStreamClosed)
			p.dirty = true
			return s.controlFrame(p, limitClosedStreamFlood)
		}
		return nil
	}
	if st.gotEnd[from] {
		return connErr{http2.ErrCodeStreamClosed, fmt.Sprintf("DATA after END_STREAM on stream %d", f.StreamID)}
	}
	if n > st.recv[from] {
		return connErr{http2.ErrCodeFlowControl, fmt.Sprintf("DATA beyond the window of stream %d", f.StreamID)}
	}
	st.recv[from] -= n
	d := f.Data()
	if pad := n - int64(len(d)); pad > 0 {
		s.credit(st, from, pad)
	}
	if f.StreamEnded() {
		st.gotEnd[from] = true
	}
	if st.clen >= 0 && from == sideDown {
		// RFC 9113 §8.1.1: DATA that disagrees with content-length makes
		// the request malformed, a stream error.
		if !takeBody(&st.clen, len(d), f.StreamEnded()) {
			s.creditConn(p, int64(len(d)))
			s.resetBoth(st, http2.ErrCodeProtocol, codes.Internal)
			return nil
		}
	}
	if size, over := st.msgs[from].feed(d); over {
		s.creditConn(p, int64(len(d)))
		s.failStream(st, codes.ResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", size, MaxMsgSize))
		return nil
	}
	s.send(st, from, item{data: d, end: f.StreamEnded()})
	return nil
}

// send forwards it, received from side from, to the other side, after what
// already waits there.
func (s *session) send(st *stream, from int, it item) {
	to := 1 - from
	if st.removed || st.sentEnd[to] {
		s.creditConn(s.peerOf(st, from), int64(len(it.data)))
		if st.local && it.end {
			s.maybeDone(st)
		}
		return
	}
	if len(st.q[to]) == 0 && !(st.waiting && to == sideUp) && s.deliver(st, to, &it) {
		s.maybeDone(st)
		return
	}
	if len(it.data) > 0 { // the framer reuses its buffer
		it.buf = queuedData.Get().(*[]byte)
		*it.buf = append((*it.buf)[:0], it.data...)
		it.data = *it.buf
	}
	it.headers = slices.Clone(it.headers) // and headerBlock its fields
	st.q[to] = append(st.q[to], it)
}

// queuedData holds the buffers of DATA waiting for a window. At 16
// callers kubelet-sized ListContainers answers outgrow the caller's
// connection window and wait here, a frame at a time (docs/architecture.md):
// allocated per frame, they were most of what the router allocated, and
// the collections that followed.
var queuedData = sync.Pool{New: func() any { b := make([]byte, 0, frameSize); return &b }}

// release returns a waiting item's buffer.
func (it *item) release() {
	if it.buf != nil {
		queuedData.Put(it.buf)
	}
	*it = item{}
}

func (s *session) peerOf(st *stream, side int) *peer {
	if side == sideDown {
		return s.down
	}
	return st.up
}

// deliver writes as much of it to side to as the windows allow and says
// whether all of it went.
func (s *session) deliver(st *stream, to int, it *item) bool {
	p := s.peerOf(st, to)
	if p == nil || p.dead {
		return true // nowhere to go: the stream is failing
	}
	id := st.ids[to]
	if it.headers != nil {
		if p.maxHeaderList != 0 {
			if size := listSize(it.headers); size > p.maxHeaderList {
				// As grpc-go's client and server: the peer said it would
				// not take it.
				s.failStream(st, codes.Internal, fmt.Sprintf("header list size to send violates the maximum size (%d bytes) set by the peer (%d bytes)", p.maxHeaderList, size))
				return true
			}
		}
		p.writeHeaders(id, it.headers, it.end)
		st.sentEnd[to] = it.end
		return true
	}
	for {
		n := min(int64(len(it.data)), st.win[to], p.sendConn, int64(p.maxFrame))
		if len(it.data) > 0 && n <= 0 {
			return false
		}
		end := it.end && n == int64(len(it.data))
		_ = p.fr.WriteData(id, end, it.data[:n])
		p.dirty = true
		p.ctrl = 0
		st.win[to] -= n
		p.sendConn -= n
		it.data = it.data[n:]
		if n > 0 {
			s.credit(st, 1-to, n)
		}
		if end {
			st.sentEnd[to] = true
		}
		if len(it.data) == 0 {
			return true
		}
	}
}

// flushQueue writes what waits for side to, as far as its windows allow.
func (s *session) flushQueue(st *stream, to int) {
	for len(st.q[to]) > 0 && !st.removed {
		if !s.deliver(st, to, &st.q[to][0]) || st.removed {
			return
		}
		st.q[to][0].release()
		st.q[to] = st.q[to][1:]
	}
	st.q[to] = nil
	if to == sideDown && st.rstDown && !st.removed {
		_ = s.down.fr.WriteRSTStream(st.ids[sideDown], http2.ErrCodeNo)
		s.down.dirty = true
		s.remove(st, st.code)
		return
	}
	s.maybeDone(st)
}

// flushPeer retries what waits for p's windows.
func (s *session) flushPeer(p *peer) {
	if p.kind == down {
		for _, st := range s.streams {
			if len(st.q[sideDown]) > 0 {
				s.flushQueue(st, sideDown)
			}
		}
		return
	}
	for _, st := range p.streams {
		if len(st.q[sideUp]) > 0 {
			s.flushQueue(st, sideUp)
		}
	}
}

// credit gives n bytes received from side from back to its sender, once a
// quarter of a window has been consumed (as grpc-go does).
func (s *session) credit(st *stream, from int, n int64) {
	s.creditConn(s.peerOf(st, from), n)
	if st.removed || st.gotEnd[from] {
		return
	}
	st.unacked[from] += n
	if st.unacked[from] >= streamWindow/4 {
		p := s.peerOf(st, from)
		if p != nil && !p.dead {
			_ = p.fr.WriteWindowUpdate(st.ids[from], uint32(st.unacked[from]))
			p.dirty = true
		}
		st.recv[from] += st.unacked[from]
		st.unacked[from] = 0
	}
}

func (s *session) creditConn(p *peer, n int64) {
	if p == nil || n <= 0 {
		return
	}
	p.unacked += n
	if p.unacked >= connWindow/4 {
		if !p.dead {
			_ = p.fr.WriteWindowUpdate(0, uint32(p.unacked))
			p.dirty = true
		}
		p.recvConn += p.unacked
		p.unacked = 0
	}
}

// maybeDone forgets a stream both sides have ended.
func (s *session) maybeDone(st *stream) {
	if !st.removed && st.sentEnd[sideDown] && st.sentEnd[sideUp] && len(st.q[0]) == 0 && len(st.q[1]) == 0 {
		if st.local && !st.gotEnd[sideDown] {
			return // kept until the caller ends its side, or resets it
		}
		s.remove(st, st.code)
	}
}

// remove forgets st; bytes still waiting in its queues free their
// connections' windows.
func (s *session) remove(st *stream, code codes.Code) {
	if st.removed {
		return
	}
	st.removed = true
	delete(s.streams, st.ids[sideDown])
	for to := range 2 {
		s.dropQueue(st, to)
	}
	if st.resp && s.resets > 0 {
		s.resets-- // an answered call earns back a reset (rapidResetLimit)
	}
	if st.up != nil && !st.waiting {
		delete(st.up.streams, st.ids[sideUp])
		if len(st.up.waiting) > 0 {
			s.startWaiting(st.up)
		}
		s.retire(st.up)
	}
	if s.r.observe != nil {
		s.r.observe(st.method, code, time.Since(st.start))
	}
	if s.goingAway && len(s.streams) == 0 && !s.closed {
		s.flush()
		s.closeLocked()
	}
}

// dropQueue discards what waits for side to: its bytes free the sending
// connection's window, its buffers go back to the pool.
func (s *session) dropQueue(st *stream, to int) {
	for i := range st.q[to] {
		s.creditConn(s.peerOf(st, 1-to), int64(len(st.q[to][i].data)))
		st.q[to][i].release()
	}
	st.q[to] = nil
}

// retire closes an upstream connection no new stream will use once its
// last stream is gone.
func (s *session) retire(p *peer) {
	if (p.goaway || p.dead) && len(p.streams) == 0 && s.ups[p.kind] != p {
		if !p.dead {
			_ = p.bw.Flush()
		}
		p.dead = true
		p.w.close()
	}
}

// reset is an RST_STREAM from p: passed on to the other side.
func (s *session) reset(p *peer, f *http2.RSTStreamFrame) error {
	if p.kind == down {
		st := s.streams[f.StreamID]
		if st == nil {
			if f.StreamID > s.lastID || f.StreamID%2 == 0 {
				return protoErr("RST_STREAM on idle stream %d", f.StreamID) // RFC 9113 §6.4
			}
			return nil
		}
		if st.up != nil && !st.up.dead && !st.waiting && !(st.sentEnd[sideUp] && st.gotEnd[sideUp]) {
			_ = st.up.fr.WriteRSTStream(st.ids[sideUp], f.ErrCode)
			st.up.dirty = true
		}
		answered := st.resp
		s.remove(st, codes.Canceled)
		if !answered {
			// Opened and reset before the backend answered: the pattern
			// of CVE-2023-44487, which costs the backend a call each.
			return s.countReset()
		}
		return nil
	}
	st := p.streams[f.StreamID]
	if st == nil {
		return nil
	}
	code := st.code
	if !st.gotEnd[sideUp] {
		code = rstCode(f.ErrCode)
	}
	if f.ErrCode == http2.ErrCodeNo && len(st.q[sideDown]) > 0 {
		// Trailers followed by RST_STREAM(NO_ERROR): the trailers go first.
		st.rstDown = true
		st.code = code
		delete(p.streams, f.StreamID)
		st.up = nil
		if len(p.waiting) > 0 {
			s.startWaiting(p)
		}
		s.retire(p)
		return nil
	}
	if !st.sentEnd[sideDown] || !st.gotEnd[sideDown] {
		_ = s.down.fr.WriteRSTStream(st.ids[sideDown], f.ErrCode)
		s.down.dirty = true
	}
	s.remove(st, code)
	return nil
}

func rstCode(c http2.ErrCode) codes.Code {
	switch c {
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		return codes.Canceled
	default:
		return codes.Internal
	}
}

// resetBoth resets st on both sides.
func (s *session) resetBoth(st *stream, code http2.ErrCode, c codes.Code) {
	_ = s.down.fr.WriteRSTStream(st.ids[sideDown], code)
	s.down.dirty = true
	if st.up != nil && !st.up.dead && !st.waiting {
		_ = st.up.fr.WriteRSTStream(st.ids[sideUp], http2.ErrCodeCancel)
		st.up.dirty = true
	}
	s.remove(st, c)
}

// failStream ends st for the caller with a gRPC status of the relay's own
// (trailers-only before any response headers, trailers after), discarding
// what still waits for the caller, and cancels it upstream.
func (s *session) failStream(st *stream, code codes.Code, msg string) {
	if st.removed {
		return
	}
	s.dropQueue(st, sideDown)
	if !st.sentEnd[sideDown] && !s.down.dead {
		fields := make([]hpack.HeaderField, 0, 4)
		if !st.resp {
			fields = append(fields, hpack.HeaderField{Name: ":status", Value: "200"},
				hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		}
		fields = append(fields, hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(code))},
			hpack.HeaderField{Name: "grpc-message", Value: encodeGrpcMessage(msg)})
		s.down.writeHeaders(st.ids[sideDown], fields, true)
		st.sentEnd[sideDown] = true
		if !st.gotEnd[sideDown] {
			// As grpc-go's server does: the caller's side is still open.
			_ = s.down.fr.WriteRSTStream(st.ids[sideDown], http2.ErrCodeNo)
		}
	}
	if st.up != nil && !st.up.dead && !st.waiting && !(st.sentEnd[sideUp] && st.gotEnd[sideUp]) {
		_ = st.up.fr.WriteRSTStream(st.ids[sideUp], http2.ErrCodeCancel)
		st.up.dirty = true
	}
	s.remove(st, code)
}

// settings applies a peer's SETTINGS and says whether its stream windows
// grew (what waits for them may go).
func (s *session) settings(p *peer, f *http2.SettingsFrame) (bool, error) {
	var err error
	delta := int64(0)
	_ = f.ForeachSetting(func(set http2.Setting) error {
		if e := set.Valid(); e != nil {
			err = e
			return e
		}
		switch set.ID {
		case http2.SettingInitialWindowSize:
			delta += int64(set.Val) - p.initWindow
			p.initWindow = int64(set.Val)
		case http2.SettingMaxFrameSize:
			p.maxFrame = int(set.Val)
		case http2.SettingHeaderTableSize:
			p.enc.limit(set.Val)
		case http2.SettingMaxConcurrentStreams:
			if p.kind != down { // a caller's limits the pushes we never make
				p.maxStreams = set.Val
			}
		case http2.SettingMaxHeaderListSize:
			p.maxHeaderList = set.Val
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if p.kind != down {
		if len(p.waiting) > 0 {
			s.startWaiting(p)
		}
	}
	if delta == 0 {
		return false, nil
	}
	side, streams := sideUp, p.streams
	if p.kind == down {
		side, streams = sideDown, s.streams
	}
	for _, st := range streams {
		st.win[side] += delta
		if st.win[side] > 1<<31-1 {
			return false, connErr{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window"}
		}
	}
	return delta > 0, nil
}

func (s *session) windowUpdate(p *peer, f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		p.sendConn += inc
		if p.sendConn > 1<<31-1 {
			return connErr{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		s.flushPeer(p)
		return nil
	}
	side, st := sideUp, p.streams[f.StreamID]
	if p.kind == down {
		side, st = sideDown, s.streams[f.StreamID]
		if st == nil && f.StreamID > s.lastID {
			return protoErr("WINDOW_UPDATE on idle stream %d", f.StreamID)
		}
	}
	if st == nil {
		return nil
	}
	st.win[side] += inc
	if st.win[side] > 1<<31-1 {
		if p.kind != down {
			return connErr{http2.ErrCodeFlowControl, fmt.Sprintf("window of stream %d above 2^31-1", f.StreamID)}
		}
		s.resetBoth(st, http2.ErrCodeFlowControl, codes.Internal) // a stream error (RFC 9113 §6.9.1)
		return nil
	}
	if len(st.q[side]) > 0 {
		s.flushQueue(st, side)
	}
	return nil
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

// listSize is a header list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts
// it (RFC 9113 §6.5.2).
func listSize(fields []hpack.HeaderField) uint32 {
	var n uint32
	for _, f := range fields {
		n += f.Size()
	}
	return n
}

// statusOf reads grpc-status from trailers; Unknown if absent.
func statusOf(fields []hpack.HeaderField) codes.Code {
	for _, f := range fields {
		if f.Name == "grpc-status" {
			if n, err := strconv.Atoi(f.Value); err == nil {
				return codes.Code(n)
			}
		}
	}
	return codes.Unknown
}

// msgScanner follows the gRPC length prefixes in one direction of a stream
// to enforce MaxMsgSize without assembling messages.
type msgScanner struct {
	hdr  [5]byte
	n    int   // header bytes seen
	left int64 // body bytes still to come
}

// feed consumes b and reports a message longer than MaxMsgSize.
func (m *msgScanner) feed(b []byte) (size int64, over bool) {
	for len(b) > 0 {
		if m.left > 0 {
			k := min(m.left, int64(len(b)))
			m.left -= k
			b = b[k:]
			continue
		}
		k := copy(m.hdr[m.n:], b)
		m.n += k
		b = b[k:]
		if m.n == len(m.hdr) {
			m.n = 0
			size := int64(binary.BigEndian.Uint32(m.hdr[1:]))
			if size > MaxMsgSize {
				return size, true
			}
			m.left = size
		}
	}
	return 0, false
}

// encodeGrpcMessage percent-encodes a grpc-message value as grpc-go does.
func encodeGrpcMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c < ' ' || c > '~' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c >= ' ' && c <= '~' && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// connListener hands in-process connections to the gRPC handler's server.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.UnixAddr{Name: "inplaced-relay", Net: "unix"} }

// dial opens a connection to the server behind l: a socket pair, one end
// for each.
func (l *connListener) dial() (net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	mine, err1 := fileConn(fds[0])
	theirs, err2 := fileConn(fds[1])
	if err := errors.Join(err1, err2); err != nil {
		if mine != nil {
			mine.Close()
		}
		if theirs != nil {
			theirs.Close()
		}
		return nil, err
	}
	select {
	case l.ch <- theirs:
		return mine, nil
	case <-l.done:
		mine.Close()
		theirs.Close()
		return nil, errors.New("relay is stopping")
	}
}

func fileConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "relay-socketpair")
	defer f.Close()
	return net.FileConn(f)
}
