package relay

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// item is a frame waiting for a window: data (credited back to the
// sending side when written) or a header block, with END_STREAM or not.
type item struct {
	data    []byte
	buf     *[]byte // data's buffer, from queuedData, while it waits
	headers []hpack.HeaderField
	end     bool
}

// send forwards it, received from side from, to the other side, after what
// already waits there.
func (s *session) send(st *stream, from int, it item) {
	to := 1 - from
	if st.state == stateClosed || st.sentEnd(to) {
		s.creditConn(s.peerOf(st, from), int64(len(it.data)))
		if st.state == stateLocal && it.end {
			s.maybeDone(st)
		}
		return
	}
	if len(st.q[to]) == 0 && !(st.state == stateWaiting && to == sideUp) && s.deliver(st, to, &it) {
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

// queuedData holds the buffers of DATA waiting for a window: answers that
// outgrow the caller's connection window wait here a frame at a time, and
// allocated per frame they were most of what the router allocated
// (docs/performance.md, ListContainers at 16 callers).
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
		if it.end {
			st.endSent(to)
		}
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
			st.endSent(to)
		}
		if len(it.data) == 0 {
			return true
		}
	}
}

// flushQueue writes what waits for side to, as far as its windows allow.
func (s *session) flushQueue(st *stream, to int) {
	for len(st.q[to]) > 0 && st.state != stateClosed {
		if !s.deliver(st, to, &st.q[to][0]) || st.state == stateClosed {
			return
		}
		st.q[to][0].release()
		st.q[to] = st.q[to][1:]
	}
	st.q[to] = nil
	if to == sideDown && st.state == stateUpReset {
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
	if st.state == stateClosed || st.gotEnd(from) {
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

// dropQueue discards what waits for side to: its bytes free the sending
// connection's window, its buffers go back to the pool.
func (s *session) dropQueue(st *stream, to int) {
	for i := range st.q[to] {
		s.creditConn(s.peerOf(st, 1-to), int64(len(st.q[to][i].data)))
		st.q[to][i].release()
	}
	st.q[to] = nil
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
