package relay

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

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
		// the limits it advertises, and the observer sees each call.
		opts = append(opts, FallbackLimits()...)
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
		return s.inner.Serve(lis)
	}
	s.mu.Lock()
	if s.stopping || s.drain.handingOver { // (Handover waits for the loops)
		s.mu.Unlock()
		lis.Close()
		return grpc.ErrServerStopped
	}
	s.listeners[lis] = true
	s.drain.loops.Add(1)
	s.mu.Unlock()
	defer s.drain.loops.Done()
	for {
		c, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			stopping := s.stopping || s.drain.handingOver
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
		if s.stopping || s.drain.draining && !s.drain.servesLate(s.r.grpcAll) {
			s.mu.Unlock()
			s.lateConn(lis, c)
			continue
		}
		s.startSessionLocked(c)
		s.mu.Unlock()
	}
}

// startSessionLocked serves c; one that comes during a drain is a late
// session (drain.go).
func (s *Server) startSessionLocked(c net.Conn) {
	sess := newSession(s, c)
	s.sessions[sess] = true
	if s.drain.draining {
		if s.drain.late == nil {
			s.drain.late = map[*session]bool{}
		}
		s.drain.late[sess] = true
	}
	s.wg.Add(1)
	go sess.serve()
}

// stop stops accepting and ends every session with end (GracefulStop's
// GOAWAY, Stop's close).
func (s *Server) stop(end func(*session)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopping {
		s.stopping = true
		close(s.done)
	}
	for l := range s.listeners {
		l.Close()
	}
	for sess := range s.sessions {
		end(sess)
	}
}

// GracefulStop stops accepting, tells every caller to open no new stream
// (GOAWAY) and returns when their streams have ended.
func (s *Server) GracefulStop() {
	s.stop((*session).goAway)
	s.wg.Wait()
	s.inner.GracefulStop()
	s.innerL.Close()
	s.releaseHandoffs()
}

// Stop closes every connection at once.
func (s *Server) Stop() {
	s.stop((*session).closeAsync)
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
	delete(s.drain.late, sess)
	s.mu.Unlock()
	s.wg.Done()
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
