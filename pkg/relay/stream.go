package relay

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// Sides of a stream.
const (
	sideDown = 0 // the caller
	sideUp   = 1 // the backend or the gRPC handler
)

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
