package relay

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

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
		return s.settingsFrame(p, f)
	case *http2.WindowUpdateFrame:
		return s.windowUpdate(p, f)
	case *http2.PingFrame:
		return s.ping(p, f)
	case *http2.GoAwayFrame:
		s.goAwayFrom(p, f)
	case *http2.PushPromiseFrame:
		return protoErr("PUSH_PROMISE") // disabled on upstream connections, illegal from a client
	case *http2.PriorityFrame:
		return s.priority(p, f)
	}
	return nil // frames of unknown types are ignored (RFC 9113 §4.1)
}

// settingsFrame is a SETTINGS frame from p: applied, then acknowledged.
func (s *session) settingsFrame(p *peer, f *http2.SettingsFrame) error {
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
	return nil
}

// goAwayFrom is a GOAWAY from p. An upstream connection takes no new
// streams; those it never processed are refused to the caller, who may
// retry them.
func (s *session) goAwayFrom(p *peer, f *http2.GoAwayFrame) {
	if p.kind == down {
		return // the caller opens no more streams; those open go on
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
}

// priority is a PRIORITY frame from p: ignored (RFC 9113 deprecates
// priorities), unless the caller makes a stream depend on itself.
func (s *session) priority(p *peer, f *http2.PriorityFrame) error {
	if f.StreamDep != f.StreamID || p.kind != down {
		return nil
	}
	// RFC 9113 §5.3.1: a stream error.
	if st := s.streams[f.StreamID]; st != nil {
		s.resetBoth(st, http2.ErrCodeProtocol, codes.Internal)
		return nil
	}
	_ = p.fr.WriteRSTStream(f.StreamID, http2.ErrCodeProtocol)
	p.dirty = true
	return s.controlFrame(p, limitClosedStreamFlood)
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
	if st.gotEnd(sideUp) {
		return protoErr("HEADERS after END_STREAM on stream %d", id)
	}
	if h.end {
		st.endRecv(sideUp)
		st.code = statusOf(h.fields)
	}
	st.answered = true
	s.send(st, sideUp, item{headers: h.fields, end: h.end})
	return nil
}

// callerHeaders opens a stream or carries the caller's trailers.
func (s *session) callerHeaders(id uint32, h *headerBlock) error {
	if st := s.streams[id]; st != nil {
		return s.callerTrailers(st, h)
	}
	if id%2 == 0 || id <= s.lastID {
		// A closed stream, or one skipped (closed by then): grpc-go's server
		// ends the connection too.
		return protoErr("HEADERS opening stream %d after %d", id, s.lastID)
	}
	s.lastID = id
	bad, clen := badRequest(h)
	if refused, err := s.refuse(id, bad); refused {
		return err
	}
	s.openStream(id, h, clen)
	return nil
}

// callerTrailers carries the caller's trailers on st.
func (s *session) callerTrailers(st *stream, h *headerBlock) error {
	if st.gotEnd(sideDown) {
		return connErr{http2.ErrCodeStreamClosed, fmt.Sprintf("HEADERS after END_STREAM on stream %d", st.ids[sideDown])}
	}
	if !h.end || h.pseudo != 0 || st.clen >= 0 && !takeBody(&st.clen, 0, true) {
		// Trailers end the stream and carry no pseudo-header field
		// (RFC 9113 §8.1, §8.3), and the body must have matched its
		// content-length (§8.1.1): a malformed request, a stream error.
		s.resetBoth(st, http2.ErrCodeProtocol, codes.Internal)
		return nil
	}
	st.endRecv(sideDown)
	s.send(st, sideDown, item{headers: h.fields, end: true})
	return nil
}

// refuse says whether the caller's new stream id is refused rather than
// opened: a malformed request (bad), one the caller resets at once, or one
// over the limits; and what the refusal costs the connection.
func (s *session) refuse(id uint32, bad bool) (bool, error) {
	if bad {
		// RFC 9113 §5.3.1, §8.1.1: a stream error; nothing is opened.
		_ = s.down.fr.WriteRSTStream(id, http2.ErrCodeProtocol)
		s.down.dirty = true
		return true, s.countReset()
	}
	if s.resetNext(id) {
		// Opened and reset in one breath (CVE-2023-44487's pattern): the
		// backend never hears of it; the caller's budget pays.
		return true, s.countReset()
	}
	if s.goingAway || len(s.streams) >= maxStreams {
		// The limit we advertised (RFC 9113 §5.1.2). A refusal costs the
		// caller nothing and us a header block and a frame: counted as a
		// reset (rapidResetLimit).
		_ = s.down.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		s.down.dirty = true
		if !s.goingAway {
			return true, s.countReset()
		}
		return true, nil
	}
	return false, nil
}

// openStream opens the caller's stream id, whose request is header block
// h, and routes it: answered by the router when it is not a gRPC call,
// else to the upstream connection its method goes to.
func (s *session) openStream(id uint32, h *headerBlock, clen int64) {
	fields, end := h.fields, h.end
	method := pseudoValue(fields, ":path")
	rt := s.r.routes[method]
	st := &stream{method: method, unary: rt.unary, code: codes.Unknown, clen: clen}
	st.ids[sideDown] = id
	st.win[sideDown] = s.down.initWindow
	st.recv = [2]int64{streamWindow, streamWindow}
	if end {
		st.endRecv(sideDown)
	}
	if s.r.observe != nil {
		st.start = time.Now()
	}
	s.streams[id] = st
	if status, why := grpcRequest(fields); status != "" {
		s.answerLocally(st, status, why)
		return
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
		return
	}
	if uint32(len(up.streams)) >= up.maxStreams {
		// Over the backend's limit: the stream waits for one of up's to
		// end, its frames queued (flow control bounds them).
		st.queue(up)
	} else {
		st.up = up
		s.open(st)
	}
	s.send(st, sideDown, item{headers: fields, end: end})
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
	if st.gotEnd(from) {
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
		st.endRecv(from)
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

// reset is an RST_STREAM from p: passed on to the other side.
func (s *session) reset(p *peer, f *http2.RSTStreamFrame) error {
	if p.kind == down {
		return s.callerReset(f)
	}
	if st := p.streams[f.StreamID]; st != nil {
		s.upstreamReset(p, st, f.ErrCode)
	}
	return nil
}

// callerReset is the caller's RST_STREAM: the stream is cancelled upstream
// and forgotten.
func (s *session) callerReset(f *http2.RSTStreamFrame) error {
	st := s.streams[f.StreamID]
	if st == nil {
		if f.StreamID > s.lastID || f.StreamID%2 == 0 {
			return protoErr("RST_STREAM on idle stream %d", f.StreamID) // RFC 9113 §6.4
		}
		return nil
	}
	if st.cancelable() {
		_ = st.up.fr.WriteRSTStream(st.ids[sideUp], f.ErrCode)
		st.up.dirty = true
	}
	answered := st.answered
	s.remove(st, codes.Canceled)
	if !answered {
		// Opened and reset before the backend answered: the pattern
		// of CVE-2023-44487, which costs the backend a call each.
		return s.countReset()
	}
	return nil
}

// upstreamReset is an RST_STREAM of st from its upstream connection p,
// with code.
func (s *session) upstreamReset(p *peer, st *stream, code http2.ErrCode) {
	status := st.code
	if !st.gotEnd(sideUp) {
		status = rstCode(code)
	}
	if code == http2.ErrCodeNo && len(st.q[sideDown]) > 0 {
		// Trailers followed by RST_STREAM(NO_ERROR): the trailers go first.
		st.upReset()
		st.code = status
		if len(p.waiting) > 0 {
			s.startWaiting(p)
		}
		s.retire(p)
		return
	}
	if st.half[sideDown] != halfClosed {
		_ = s.down.fr.WriteRSTStream(st.ids[sideDown], code)
		s.down.dirty = true
	}
	s.remove(st, status)
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
