package relay

import (
	"bufio"
	"encoding/binary"
	"net"

	"golang.org/x/net/http2"
)

// The router's request checks in front of grpc-go's server (WithGRPCServer).
//
// grpc-go's server opens a stream whatever its request looks like: a HEADERS
// frame that makes the stream depend on itself, a `te` other than
// "trailers", a missing or empty :method, :path or :scheme, a body that
// disagrees with its content-length all reach the handler, and so the
// backend (h2spec 5.3.1, 8.1.2.2, 8.1.2.3, 8.1.2.6 fail through it where
// they pass against containerd 1.6 directly). RFC 9113 makes each a stream
// error (PROTOCOL_ERROR) that an intermediary must not forward.
//
// checkedConn reads the caller's frames before grpc-go does and judges each
// request with the router's own checks (headerBlock, badRequest, takeBody).
// It never writes to the caller: a request found malformed gets a header
// field no peer may send (refusedField) appended to its header block, or,
// for a body that disagrees with its content-length, a HEADERS frame of that
// field alone before the DATA frame that showed it. grpc-go's framer
// (x/net's ReadMetaHeaders) decodes the block as HPACK requires, so both
// decoders' tables stay the same, rejects the field, and grpc-go resets the
// stream with PROTOCOL_ERROR itself, before its handler starts (or cancels
// the handler, for a body). DATA frames pass unchanged, so both ends count
// the same bytes against their windows.
//
// What it cannot follow (a frame larger than grpc-go accepts, an HPACK or
// framing error, an invalid field of the caller's own) it passes on
// unchecked from there: grpc-go's framer sees the same bytes and ends the
// connection or the stream as it would without the checks.

// refusedField is an HPACK literal field without indexing and with a new
// name (RFC 7541 §6.2.2) whose name is not a token: a field HTTP/2 forbids,
// which x/net's framer answers with a stream error of type PROTOCOL_ERROR.
var refusedField = func() []byte {
	const name = "inplaced: malformed request"
	return append(append([]byte{0x00, byte(len(name))}, name...), 0x00)
}()

// checkedListener hands grpc-go connections whose requests are checked.
type checkedListener struct{ net.Listener }

func (l checkedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newCheckedConn(c), nil
}

// checkedConn is a caller's connection as grpc-go's server reads it. Only
// Read is its own; it is called by grpc-go's one reader goroutine.
type checkedConn struct {
	net.Conn
	in  *bufio.Reader
	out []byte // checked bytes grpc-go has yet to read, from buf
	buf []byte
	raw int  // bytes of in that pass next, unchanged
	off bool // checks stopped: everything passes as it comes

	preface bool
	hdr     *headerBlock
	hdrNew  bool             // the block being read opens a stream
	lastID  uint32           // the caller's highest stream ID
	clen    map[uint32]int64 // content-length still to come, of the open requests that have one
}

// maxCheckedLens bounds the requests with a content-length followed at once
// (grpc-go itself allows maxStreams open; a gRPC client sends none).
const maxCheckedLens = maxStreams

func newCheckedConn(c net.Conn) *checkedConn {
	return &checkedConn{Conn: c, in: bufio.NewReaderSize(c, 9+frameSize), hdr: newHeaderBlock(), clen: map[uint32]int64{}}
}

func (c *checkedConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.raw > 0 || c.off {
			if !c.off && len(p) > c.raw {
				p = p[:c.raw]
			}
			n, err := c.in.Read(p)
			c.raw -= n
			return n, err
		}
		c.out = c.buf[:0]
		c.next()
		c.buf = c.out[:0]
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

// next reads the next frame's header (and the payload it must look at) and
// sets what passes: c.out, then c.raw bytes of c.in.
func (c *checkedConn) next() {
	if !c.preface {
		c.preface = true
		c.raw = len(http2.ClientPreface) // grpc-go checks it
		return
	}
	h, err := c.in.Peek(9)
	if err != nil {
		c.off = true // a short read: what there is passes, then the error
		return
	}
	length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	typ, flags := http2.FrameType(h[3]), http2.Flags(h[4])
	id := binary.BigEndian.Uint32(h[5:9]) & (1<<31 - 1)
	c.raw = 9 + length
	if c.hdr.stream != 0 && typ != http2.FrameContinuation {
		c.off = true // a block cut short: grpc-go's framer ends the connection
		return
	}
	switch typ {
	case http2.FrameHeaders, http2.FrameContinuation, http2.FramePriority:
		if length > frameSize {
			c.off = true // grpc-go ends the connection (FRAME_SIZE_ERROR)
			return
		}
		f, err := c.in.Peek(9 + length)
		if err != nil {
			c.off = true
			return
		}
		c.headers(typ, flags, id, f[9:])
	case http2.FrameData:
		if left, ok := c.clen[id]; ok && length > 0 {
			c.data(id, flags, length, left)
		}
		if flags.Has(http2.FlagDataEndStream) {
			delete(c.clen, id)
		}
	case http2.FrameRSTStream:
		delete(c.clen, id)
	}
}

// headers looks at a HEADERS, CONTINUATION or PRIORITY frame of stream id,
// its payload p still in c.in.
func (c *checkedConn) headers(typ http2.FrameType, flags http2.Flags, id uint32, p []byte) {
	switch typ {
	case http2.FramePriority:
		if len(p) == 5 && binary.BigEndian.Uint32(p)&(1<<31-1) == id && id != 0 {
			// RFC 9113 §5.3.1: a stream error. A block of refusedField
			// alone on the stream makes grpc-go reset it.
			c.take()
			c.appendRefused(id, 0)
		}
		return
	case http2.FrameHeaders:
		frag, selfDep, ok := headersFragment(flags, id, p)
		if !ok || id == 0 || c.hdr.stream != 0 {
			c.off = true // grpc-go's framer finds the same error
			return
		}
		c.hdrNew = id > c.lastID && id%2 == 1
		if c.hdrNew {
			c.lastID = id
		}
		c.hdr.start(id, flags.Has(http2.FlagHeadersEndStream), selfDep)
		c.block(flags.Has(http2.FlagHeadersEndHeaders), frag)
	case http2.FrameContinuation:
		if c.hdr.stream == 0 || id != c.hdr.stream {
			c.off = true
			return
		}
		c.block(flags.Has(http2.FlagContinuationEndHeaders), p)
	}
}

// block decodes a fragment of the block being read; at its end it judges the
// request (or trailers) with the router's checks.
func (c *checkedConn) block(last bool, frag []byte) {
	h := c.hdr
	id := h.stream
	if done, err := h.write(frag, last); err != nil {
		c.off = true // HPACK, size or field errors: grpc-go's framer has them too
		return
	} else if !done {
		return
	}
	bad := false
	switch {
	case c.hdrNew:
		var clen int64
		bad, clen = badRequest(h)
		if !bad && clen >= 0 && !h.end && len(c.clen) < maxCheckedLens {
			c.clen[id] = clen
		}
	case h.end:
		if left, ok := c.clen[id]; ok {
			bad = !takeBody(&left, 0, true)
		}
	}
	if h.end || bad {
		delete(c.clen, id)
	}
	if bad {
		// The block ends one frame later, in a CONTINUATION that carries
		// refusedField.
		c.take()
		c.out[4] &^= byte(http2.FlagHeadersEndHeaders) // the same bit in CONTINUATION
		c.out = appendFrame(c.out, http2.FrameContinuation, http2.FlagContinuationEndHeaders, id, refusedField)
	}
}

// data counts a DATA frame of a request with a content-length.
func (c *checkedConn) data(id uint32, flags http2.Flags, length int, left int64) {
	n := length
	if flags.Has(http2.FlagDataPadded) {
		b, err := c.in.Peek(10)
		if err != nil || int(b[9]) >= length {
			c.off = true // grpc-go's framer: a connection error
			return
		}
		n -= 1 + int(b[9])
	}
	if takeBody(&left, n, flags.Has(http2.FlagDataEndStream)) {
		c.clen[id] = left
		return
	}
	// RFC 9113 §8.1.1: malformed. The stream is reset before its DATA
	// arrives, which grpc-go then only counts against the window.
	delete(c.clen, id)
	c.appendRefused(id, 0)
}

// take moves the frame of c.raw bytes from c.in into c.out, to be changed.
func (c *checkedConn) take() {
	f, _ := c.in.Peek(c.raw) // peeked already
	c.out = append(c.out, f...)
	_, _ = c.in.Discard(c.raw)
	c.raw = 0
}

// appendRefused appends a HEADERS frame of stream id whose block is
// refusedField alone.
func (c *checkedConn) appendRefused(id uint32, flags http2.Flags) {
	c.out = appendFrame(c.out, http2.FrameHeaders, flags|http2.FlagHeadersEndHeaders, id, refusedField)
}

func appendFrame(b []byte, typ http2.FrameType, flags http2.Flags, id uint32, payload []byte) []byte {
	n := len(payload)
	b = append(b, byte(n>>16), byte(n>>8), byte(n), byte(typ), byte(flags))
	b = binary.BigEndian.AppendUint32(b, id)
	return append(b, payload...)
}

// headersFragment is the header block fragment of a HEADERS frame's payload
// p and whether the frame makes its stream id depend on itself; !ok for a
// payload its flags do not fit (x/net's parseHeadersFrame).
func headersFragment(flags http2.Flags, id uint32, p []byte) (frag []byte, selfDep, ok bool) {
	pad := 0
	if flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return nil, false, false
		}
		pad, p = int(p[0]), p[1:]
	}
	var dep uint32
	if flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return nil, false, false
		}
		dep, p = binary.BigEndian.Uint32(p)&(1<<31-1), p[5:]
	}
	if pad > len(p) {
		return nil, false, false
	}
	return p[:len(p)-pad], flags.Has(http2.FlagHeadersPriority) && dep == id, true
}
