package relay

import (
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerBlock decodes one peer's header blocks (a HEADERS frame and its
// CONTINUATIONs) fragment by fragment as they are read, into a field slice
// it reuses.
//
// x/net's Framer can do this (ReadMetaHeaders), but it allocates a frame,
// a field slice and a closure per block, which with ten frames a call was
// much of the router's CPU (docs/performance.md). The checks are the Framer's: the same limits, the
// same field validation, the same connection errors.
type headerBlock struct {
	dec     *hpack.Decoder
	stream  uint32              // the stream whose block is being read; 0 between blocks
	frames  int                 // frames of the block so far (maxHeaderFrames)
	selfDep bool                // the HEADERS frame made the stream depend on itself
	end     bool                // the HEADERS frame carried END_STREAM
	fields  []hpack.HeaderField // valid until the next block starts
	size    uint32              // the decoded list's size so far (RFC 7541 §4.1)
	pseudo  uint8               // pseudo-header fields seen, by pseudoBit
	sawReg  bool                // a regular field was seen
	err     error               // the first invalid field
}

func newHeaderBlock() *headerBlock {
	h := &headerBlock{fields: make([]hpack.HeaderField, 0, 16)}
	h.dec = hpack.NewDecoder(4096, h.emit)
	h.dec.SetMaxStringLength(maxHeaderList)
	return h
}

// begin starts a block from a HEADERS frame.
func (h *headerBlock) begin(f *http2.HeadersFrame) {
	h.start(f.StreamID, f.StreamEnded(), f.HasPriority() && f.Priority.StreamDep == f.StreamID)
}

// start starts a block of stream id from a HEADERS frame with END_STREAM
// (end) or not, that made the stream depend on itself (selfDep) or not.
func (h *headerBlock) start(id uint32, end, selfDep bool) {
	h.stream, h.end, h.selfDep = id, end, selfDep
	h.fields, h.size, h.pseudo, h.sawReg, h.err, h.frames = h.fields[:0], 0, 0, false, nil, 0
	h.dec.SetEmitEnabled(true)
}

// write decodes one fragment of the block and says whether it was the last
// one. A connection error ends the connection: the decoder's table may no
// longer match the peer's.
func (h *headerBlock) write(frag []byte, last bool) (bool, error) {
	// As the Framer: a fragment far larger than what the list may still
	// hold is not decoded at all.
	if int64(len(frag)) > 2*(maxHeaderList-int64(h.size)) {
		return false, protoErr("header list too large")
	}
	if h.err != nil { // stopped tracking the size at the invalid field
		return false, protoErr("invalid header field: %v", h.err)
	}
	if _, err := h.dec.Write(frag); err != nil {
		return false, connErr{http2.ErrCodeCompression, err.Error()}
	}
	if !last {
		return false, nil
	}
	h.stream = 0
	if err := h.dec.Close(); err != nil {
		return false, connErr{http2.ErrCodeCompression, err.Error()}
	}
	if h.size > maxHeaderList {
		return false, protoErr("header list too large")
	}
	if h.err != nil {
		return false, protoErr("invalid header field: %v", h.err)
	}
	if h.pseudo&pseudoRequest != 0 && h.pseudo&pseudoResponse != 0 {
		return false, protoErr("request and response pseudo-header fields mixed")
	}
	return true, nil
}

// Pseudo-header fields, one bit each.
const (
	pseudoMethod uint8 = 1 << iota
	pseudoPath
	pseudoScheme
	pseudoAuthority
	pseudoProtocol
	pseudoStatus

	pseudoRequest  = pseudoMethod | pseudoPath | pseudoScheme | pseudoAuthority | pseudoProtocol
	pseudoResponse = pseudoStatus
)

func pseudoBit(name string) uint8 {
	switch name {
	case ":method":
		return pseudoMethod
	case ":path":
		return pseudoPath
	case ":scheme":
		return pseudoScheme
	case ":authority":
		return pseudoAuthority
	case ":protocol":
		return pseudoProtocol
	case ":status":
		return pseudoStatus
	}
	return 0
}

// emit takes one decoded field: checked as the Framer checks it, counted
// against the list's limit, kept.
func (h *headerBlock) emit(f hpack.HeaderField) {
	if !httpguts.ValidHeaderFieldValue(f.Value) {
		h.fail(fmt.Errorf("invalid value of %q", f.Name)) // not the value: it may be a secret
		return
	}
	if strings.HasPrefix(f.Name, ":") {
		bit := pseudoBit(f.Name)
		switch {
		case h.sawReg:
			h.fail(fmt.Errorf("pseudo-header field %q after a regular one", f.Name))
		case bit == 0:
			h.fail(fmt.Errorf("unknown pseudo-header field %q", f.Name))
		case h.pseudo&bit != 0:
			h.fail(fmt.Errorf("duplicate pseudo-header field %q", f.Name))
		}
		h.pseudo |= bit
	} else {
		h.sawReg = true
		if !validWireName(f.Name) {
			h.fail(fmt.Errorf("invalid field name %q", f.Name))
		}
	}
	if h.err != nil {
		return
	}
	if h.size += f.Size(); h.size > maxHeaderList {
		h.dec.SetEmitEnabled(false) // decoded on, to its end, but not kept
		return
	}
	h.fields = append(h.fields, f)
}

func (h *headerBlock) fail(err error) {
	h.err = err
	h.dec.SetEmitEnabled(false)
}

// validWireName: a token in lower case, as HTTP/2 requires.
func validWireName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !httpguts.IsTokenRune(rune(c)) || 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}

// pseudoValue is the value of the pseudo-header field name in fields.
func pseudoValue(fields []hpack.HeaderField, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
		if !strings.HasPrefix(f.Name, ":") {
			break // pseudo-header fields come first
		}
	}
	return ""
}
