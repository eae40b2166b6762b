package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Drain: a restart the callers do not notice.
//
// When systemd holds the CRI socket (socket activation), it outlives the
// process: a connection made while no inplaced runs waits in the socket's
// listen backlog, and the next process accepts it. What is left to do is
// to hand the callers over without failing a call:
//
//  1. Every caller connection is told to open no new stream, in two steps
//     as grpc-go's server does it: GOAWAY with the largest stream ID and a
//     PING, then, once the PING comes back (every stream the caller opened
//     before it read the first GOAWAY has arrived), GOAWAY with the last
//     stream ID. No stream is refused.
//  2. Connections that arrive meanwhile are served (late sessions): a call
//     whose first attempt met the first GOAWAY as it left has spent the one
//     transparent retry grpc-go allows a call the server did not process,
//     and its retry comes on such a connection; it must be answered, not
//     refused. Nor can a connection be left unanswered: grpc-go gives a
//     connection attempt MinConnectTimeout, kubelet's 5 s
//     (k8s.io/cri-client), and a call without wait-for-ready fails with the
//     attempt.
//  3. GetContainerEvents streams end at once (Unavailable; kubelet opens
//     the stream again). Every other call in flight, the streaming lists
//     included, runs on until it ends or ctx does; then it is cut (a read
//     not yet answered is refused instead, and its caller sends it again
//     to the next process: session.cut).
//  4. Handover (after the daemon has settled its swaps) closes our copy of
//     the listening socket — what comes now waits in the backlog of
//     systemd's socket for the next process — and ends the late sessions
//     as step 1 ended the others. A call that meets their first GOAWAY
//     retries on a new connection, into that backlog: its first retry,
//     since its first attempt went to a connection of before the drain
//     began (step 2) only if it met that one's first GOAWAY, tens of
//     milliseconds earlier.
//
// Without systemd the socket is this process's own and goes with it:
// nothing would answer what waited, so the drain closes it at once (Refuse)
// and new connections are refused, as before there was a next process.
//
// With every connection grpc-go's server's own (WithGRPCServer), its
// GracefulStop does step 1 and cannot serve a connection that comes after:
// those are held here (parkedConn), their streams unanswered, and sent to
// the next process with GOAWAY last stream 0 at Stop — which fails a call
// whose transparent retry was spent (step 2), the router's one advantage.

// endless are the streaming methods whose calls never end by themselves: a
// drain ends them at once rather than wait the whole grace for them.
var endless = map[string]bool{runtimeapi.RuntimeService_GetContainerEvents_FullMethodName: true}

// drainOf is the channel closed when a call of method must end for the
// drain: Relay.Drain's for the endless streams, none (nil) for the rest.
func (r *Relay) drainOf(method string) <-chan struct{} {
	if endless[method] {
		return r.drain
	}
	return nil
}

// drainTick is how often Drain looks whether the callers' connections are
// done, and tells one that came meanwhile (accepted just before the drain
// began) to go away.
const drainTick = 5 * time.Millisecond

// parkWriteTimeout bounds a write to a held connection: a caller that does
// not read cannot hold up the release of the others.
const parkWriteTimeout = time.Second

// drainPing is the payload of the PING sent with a drain's first GOAWAY.
var drainPing = [8]byte{'i', 'n', 'p', 'l', 'a', 'c', 'e', 'd'}

// drainState is the server's part in a drain, guarded by Server.mu.
type drainState struct {
	draining    bool
	mode        DrainMode
	handingOver bool // the listeners are closed (leaveSocket)
	handedOver  bool // Handover began
	handoffs    []*handoff
	told        map[*session]bool // sessions sent the first GOAWAY
	late        map[*session]bool // accepted during a HandOff drain: served until Handover
	loops       sync.WaitGroup    // Serve's accept loops on the router
}

// servesLate says whether a connection accepted now is served, as a late
// session: during a HandOff drain on the router, up to the end of Handover.
func (d *drainState) servesLate(grpcAll bool) bool {
	return d.draining && d.mode == HandOff && !grpcAll
}

// DrainMode is what a drain does with the connections that arrive during
// it.
type DrainMode int

const (
	// HandOff holds them until Stop, which sends them to the next process
	// on the same socket: for a socket that outlives this process
	// (systemd's).
	HandOff DrainMode = iota
	// Refuse closes the listener at once: for a socket this process bound
	// itself, which goes with it.
	Refuse
)

// Drain stops the server taking new calls and lets the calls in flight end
// until ctx does; it then cuts what still runs and returns ctx's error.
// mode says what becomes of the connections that arrive meanwhile (see the
// steps above).
func (s *Server) Drain(ctx context.Context, mode DrainMode) error {
	s.mu.Lock()
	s.drain.draining, s.drain.mode = true, mode
	for _, h := range s.drain.handoffs {
		switch {
		case mode == Refuse:
			h.refuse()
		case s.r.grpcAll:
			h.park()
		}
	}
	s.mu.Unlock()
	s.r.Drain()
	if s.r.grpcAll {
		return s.drainInner(ctx)
	}
	err := s.goAwayUntil(ctx, false)
	if err == nil {
		return nil
	}
	// The grace is spent: the handover begins before the cut, so that the
	// calls the cut refuses (session.cut) are sent again into the socket's
	// backlog, to the next process — not to this one's late sessions,
	// told to go away first, nor to its listener, closed.
	if mode == HandOff {
		s.leaveSocket()
		s.tellLate(lateTellTimeout)
	}
	s.cut(false)
	return err
}

// lateTellTimeout bounds the wait for the late sessions' callers to have
// read their GOAWAY before a cut at the grace.
const lateTellTimeout = time.Second

// Handover ends a HandOff drain on the router, once the daemon is done
// with its callers (step 4): it closes this process's copy of the socket,
// then tells the late sessions to go away and lets their calls end until
// ctx does; it then cuts what still runs and returns ctx's error.
func (s *Server) Handover(ctx context.Context) error {
	s.mu.Lock()
	if !s.drain.servesLate(s.r.grpcAll) || s.drain.handedOver {
		s.mu.Unlock()
		return nil
	}
	s.drain.handedOver = true
	s.mu.Unlock()
	s.leaveSocket()
	if err := s.goAwayUntil(ctx, true); err != nil {
		s.cut(true)
		return err
	}
	return nil
}

// leaveSocket closes this process's copy of the socket, once: what comes
// now waits in the backlog of systemd's socket for the next process.
func (s *Server) leaveSocket() {
	s.mu.Lock()
	if s.drain.handingOver {
		s.mu.Unlock()
		return
	}
	s.drain.handingOver = true
	hs := s.drain.handoffs
	s.mu.Unlock()
	// Every connection accepted before the listener closed becomes a late
	// session before the sessions are counted: the accept goroutines and
	// Serve's loops end first.
	for _, h := range hs {
		h.release()
		<-h.ended
	}
	s.drain.loops.Wait()
	s.mu.Lock()
	n := len(s.drain.late)
	s.mu.Unlock()
	if n > 0 {
		s.r.log.Info("socket left to the next process; connections made during the drain told to go away", zap.Int("connections", n))
	}
}

// tellLate tells the late sessions to go away and waits, at most timeout,
// until each caller has read it (the drain's PING came back): a call its
// caller sends again after that takes a new connection.
func (s *Server) tellLate(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for s.goAwayAll(true) > 0 && s.lateUntold() > 0 && time.Now().Before(deadline) {
		time.Sleep(drainTick)
	}
}

// lateUntold counts the late sessions whose caller has not acknowledged
// the drain's GOAWAY yet.
func (s *Server) lateUntold() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sess := range s.sessions {
		if s.drain.late[sess] && !sess.toldAway() {
			n++
		}
	}
	return n
}

// goAwayUntil tells the sessions, the late ones or the others, to go away
// until they have, or ctx ends: then it returns ctx's error.
func (s *Server) goAwayUntil(ctx context.Context, late bool) error {
	t := time.NewTicker(drainTick)
	defer t.Stop()
	for s.goAwayAll(late) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// cut ends the sessions, the late ones or the others, that are still open
// (session.cut).
func (s *Server) cut(late bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		if s.drain.late[sess] == late {
			sess.cut()
		}
	}
}

// drainInner is Drain with every caller connection grpc-go's server's own
// (WithGRPCServer): its GracefulStop sends the two GOAWAYs and waits.
func (s *Server) drainInner(ctx context.Context) error {
	// A connection grpc-go accepted just before the drain must reach its
	// transports first: one its GracefulStop finds still in its accept path
	// is closed unanswered, which fails the caller's connection attempt.
	time.Sleep(drainTick)
	done := make(chan struct{})
	go func() { s.inner.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.inner.Stop()
		<-done
		return ctx.Err()
	}
}

// goAwayAll tells the caller connections, the late ones or the others,
// not told yet to open no new stream, and says how many are still open.
// The endless streams of late sessions end as Relay.Drain ended the
// others' (drainStreams).
func (s *Server) goAwayAll(late bool) int {
	if late {
		s.drainStreams()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drain.told == nil {
		s.drain.told = map[*session]bool{}
	}
	open := 0
	for sess := range s.sessions {
		if s.drain.late[sess] != late {
			continue
		}
		open++
		if !s.drain.told[sess] && sess.drainSoon() {
			s.drain.told[sess] = true
		}
	}
	return open
}

// cut ends the session when a drain's time is up. A stream the caller may
// safely send again is refused first (RST_STREAM REFUSED_STREAM, RFC 9113
// §8.7): grpc-go's client, kubelet's, then retries the call itself, once,
// on its next connection — the next process, from the socket's backlog —
// instead of failing it. Such a stream is one that never went upstream,
// or a read not yet answered: a read changes nothing in the runtime, so
// whether the backend ran it is of no consequence. Everything else (a
// pull, a create, a stop: what may have had its effect) is cut with the
// connection, as a broken connection cuts it.
func (s *session) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started && !s.closed {
		refused := false
		for id, st := range s.streams {
			if st.state == stateNew || st.state == stateWaiting || !st.answered && rereadable[st.method] {
				_ = s.down.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
				refused = true
			}
		}
		if refused {
			_ = s.down.bw.Flush()
		}
	}
	s.closeLocked()
}

// rereadable are the CRI methods that only read: running one twice is
// running it once, so a caller may be told it did not run (cut).
var rereadable = map[string]bool{
	runtimeapi.RuntimeService_Version_FullMethodName:                 true,
	runtimeapi.RuntimeService_Status_FullMethodName:                  true,
	runtimeapi.RuntimeService_RuntimeConfig_FullMethodName:           true,
	runtimeapi.RuntimeService_ListPodSandbox_FullMethodName:          true,
	runtimeapi.RuntimeService_PodSandboxStatus_FullMethodName:        true,
	runtimeapi.RuntimeService_ListContainers_FullMethodName:          true,
	runtimeapi.RuntimeService_ContainerStatus_FullMethodName:         true,
	runtimeapi.RuntimeService_ContainerStats_FullMethodName:          true,
	runtimeapi.RuntimeService_ListContainerStats_FullMethodName:      true,
	runtimeapi.RuntimeService_PodSandboxStats_FullMethodName:         true,
	runtimeapi.RuntimeService_ListPodSandboxStats_FullMethodName:     true,
	runtimeapi.RuntimeService_ListMetricDescriptors_FullMethodName:   true,
	runtimeapi.RuntimeService_ListPodSandboxMetrics_FullMethodName:   true,
	runtimeapi.RuntimeService_StreamPodSandboxes_FullMethodName:      true,
	runtimeapi.RuntimeService_StreamContainers_FullMethodName:        true,
	runtimeapi.RuntimeService_StreamContainerStats_FullMethodName:    true,
	runtimeapi.RuntimeService_StreamPodSandboxStats_FullMethodName:   true,
	runtimeapi.RuntimeService_StreamPodSandboxMetrics_FullMethodName: true,
	runtimeapi.ImageService_ListImages_FullMethodName:                true,
	runtimeapi.ImageService_StreamImages_FullMethodName:              true,
	runtimeapi.ImageService_ImageStatus_FullMethodName:               true,
	runtimeapi.ImageService_ImageFsInfo_FullMethodName:               true,
}

// handoff wraps a listener Serve is given.
func (s *Server) handoff(lis net.Listener) net.Listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := newHandoff(lis, s.r.ioTimeout, s.r.log, s.lateSession)
	if s.drain.draining {
		h.refuse() // Serve after Drain began: nothing to hand over
	}
	s.drain.handoffs = append(s.drain.handoffs, h)
	return h
}

// releaseHandoffs closes the listeners and tells the held connections to
// go. It comes after grpc-go's server has stopped: a listener closed under
// its Serve makes Serve return the error.
func (s *Server) releaseHandoffs() {
	s.mu.Lock()
	hs := s.drain.handoffs
	s.mu.Unlock()
	for _, h := range hs {
		h.release()
	}
}

// drainSoon sends the drain's first GOAWAY and its PING, and says whether
// it did: not before our SETTINGS (the caller's preface is still to come:
// the next tick will), nor on a connection that is ending.
func (s *session) drainSoon() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.closed || s.goingAway {
		return s.closed || s.goingAway
	}
	_ = s.down.fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, nil)
	_ = s.down.fr.WritePing(false, drainPing)
	s.down.dirty = true
	s.flush()
	return true
}

// toldAway says whether the caller has acknowledged the drain's GOAWAY
// (the last GOAWAY went out), or the session is over.
func (s *session) toldAway() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.goingAway || s.closed
}

// ping is a PING from p: acknowledged; the caller's acknowledgement of the
// drain's PING is the moment for the last GOAWAY.
func (s *session) ping(p *peer, f *http2.PingFrame) error {
	if f.IsAck() {
		if p == s.down && f.Data == drainPing {
			s.goAwayLocked()
		}
		return nil
	}
	if err := s.controlFrame(p, limitPingFlood); err != nil {
		return err
	}
	_ = p.fr.WritePing(true, f.Data)
	p.dirty = true
	return nil
}

// handoff is the listener a Server accepts on. It hands each connection on
// until the drain begins (park), then holds the new ones itself, until
// release. Its own goroutine accepts, so that grpc-go's server, whose
// GracefulStop closes its listener at once, stops being handed connections
// while they are still taken and held.
type handoff struct {
	l       net.Listener
	conns   chan net.Conn
	errs    chan error
	quit    chan struct{} // closed by Close and release: Accept returns
	quitted sync.Once
	ended   chan struct{}       // closed when the accept goroutine returns
	late    func(net.Conn) bool // serves a connection in hand as Accept stops, if the drain does
	timeout time.Duration       // the caller's preface
	log     *zap.Logger

	mu       sync.Mutex
	parking  bool
	refusing bool // the listener was closed for the drain: Accept waits for Close
	released bool
	parked   map[*parkedConn]bool
}

func newHandoff(l net.Listener, timeout time.Duration, log *zap.Logger, late func(net.Conn) bool) *handoff {
	h := &handoff{l: l, conns: make(chan net.Conn), errs: make(chan error), quit: make(chan struct{}),
		ended: make(chan struct{}), late: late, timeout: timeout, log: log, parked: map[*parkedConn]bool{}}
	go h.accept()
	return h
}

func (h *handoff) accept() {
	defer close(h.ended)
	for {
		c, err := h.l.Accept()
		if err != nil {
			if h.refused() {
				return
			}
			select {
			case h.errs <- err:
			case <-h.quit:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		if h.hold(c) {
			continue
		}
		select {
		case h.conns <- c:
		case <-h.quit:
			if !h.late(c) && !h.hold(c) {
				c.Close()
			}
		}
	}
}

// Accept returns the next connection while the server serves.
func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case err := <-h.errs:
		return nil, err
	case <-h.quit:
		return nil, net.ErrClosed
	}
}

// Close ends Accept. The listener itself stays open while a drain holds
// connections on it: release closes it.
func (h *handoff) Close() error {
	h.quitted.Do(func() { close(h.quit) })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parking && !h.released {
		return nil
	}
	return h.l.Close()
}

func (h *handoff) Addr() net.Addr { return h.l.Addr() }

// refuse closes the listener now; Accept returns only once Close is
// called, as the server stops.
func (h *handoff) refuse() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refusing = true
	_ = h.l.Close()
}

func (h *handoff) refused() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refusing
}

// park makes the connections accepted from now on held here.
func (h *handoff) park() {
	h.mu.Lock()
	h.parking = true
	h.mu.Unlock()
}

// hold keeps c, if the drain has begun.
func (h *handoff) hold(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.parking {
		return false
	}
	p := &parkedConn{c: c, bw: bufio.NewWriterSize(c, 4096), gone: h.released}
	p.fr = http2.NewFramer(p.bw, bufio.NewReader(c))
	p.fr.SetMaxReadFrameSize(frameSize)
	h.parked[p] = true
	go func() {
		p.serve(h.timeout)
		h.mu.Lock()
		delete(h.parked, p)
		h.mu.Unlock()
	}()
	return true
}

// release closes the listener — our copy of systemd's socket, which stays
// open in systemd — then tells every held connection to go away.
func (h *handoff) release() {
	h.quitted.Do(func() { close(h.quit) })
	h.mu.Lock()
	if h.released {
		h.mu.Unlock()
		return
	}
	h.released = true
	_ = h.l.Close()
	held := make([]*parkedConn, 0, len(h.parked))
	for p := range h.parked {
		held = append(held, p)
	}
	h.mu.Unlock()
	if len(held) > 0 {
		h.log.Info("connections made during the drain told to reconnect: to the next process on the same socket", zap.Int("connections", len(held)))
	}
	for _, p := range held {
		p.release()
	}
}

// parkedConn is a caller's connection accepted during a drain: greeted with
// our SETTINGS, its PINGs and SETTINGS acknowledged, its streams left
// unanswered until release sends GOAWAY with last stream 0.
type parkedConn struct {
	c  net.Conn
	fr *http2.Framer // reads by serve, writes under mu

	mu      sync.Mutex
	bw      *bufio.Writer
	greeted bool // our SETTINGS went out
	gone    bool // released: GOAWAY sent, or to be sent once greeted
}

func (p *parkedConn) serve(timeout time.Duration) {
	defer p.c.Close()
	_ = p.c.SetReadDeadline(time.Now().Add(timeout))
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(p.c, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return
	}
	_ = p.c.SetReadDeadline(time.Time{})
	p.mu.Lock()
	_ = p.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: maxStreams})
	p.greeted = true
	if p.gone {
		p.goAwayLocked()
		p.mu.Unlock()
		return
	}
	p.flushLocked()
	p.mu.Unlock()
	for ctrl := 0; ctrl <= maxControlFrames; {
		f, err := p.fr.ReadFrame()
		if err != nil {
			return
		}
		ctrl += p.answer(f)
	}
}

// answer acknowledges a SETTINGS or PING frame and says whether it was one
// (they are bounded as the router bounds them: maxControlFrames).
func (p *parkedConn) answer(f http2.Frame) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			_ = p.fr.WriteSettingsAck()
			p.flushLocked()
			return 1
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			_ = p.fr.WritePing(true, f.Data)
			p.flushLocked()
			return 1
		}
	}
	return 0
}

func (p *parkedConn) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	p.gone = true
	if p.greeted {
		p.goAwayLocked()
	}
}

// goAwayLocked tells the caller that none of its streams was processed
// (last stream 0), and closes.
func (p *parkedConn) goAwayLocked() {
	_ = p.fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	p.flushLocked()
	_ = p.c.Close()
}

func (p *parkedConn) flushLocked() {
	_ = p.c.SetWriteDeadline(time.Now().Add(parkWriteTimeout))
	_ = p.bw.Flush()
}

// lateConn is a connection accepted as the server stops or drains, and not
// served: held for the next process while grpc-go's server's drain holds
// connections, else closed.
func (s *Server) lateConn(lis net.Listener, c net.Conn) {
	if h, ok := lis.(*handoff); ok && h.hold(c) {
		return
	}
	c.Close()
}

// lateSession serves c as a late session, if the drain serves them, and
// says whether it did.
func (s *Server) lateSession(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || !s.drain.servesLate(s.r.grpcAll) {
		return false
	}
	s.startSessionLocked(c)
	return true
}
