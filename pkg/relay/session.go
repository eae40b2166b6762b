package relay

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

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
	pace      pacer              // the caller's wasted frames (pace.go)
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
		// Once p's input buffer is empty, what its frames made us write
		// goes out (frames that arrive together leave together), and the
		// reader looks at the peers it feeds for back-pressure.
		var w readerWait
		if p.br.Buffered() == 0 {
			s.flush()
			w.full = s.overflowing(p)
		}
		if p == s.down && s.pace.due() {
			w.pause = true
			s.paused()
		}
		s.mu.Unlock()
		if w.pause || w.full != nil {
			w.wait(s.r.ioTimeout)
		}
	}
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
