package relay

import (
	"strconv"
	"strings"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// badRequest says whether the request whose header block h just ended is
// one that must reach no backend (a stream error, RFC 9113 §5.3.1, §8.1.1),
// and returns its content-length, -1 if it has none.
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
	st.toLocal()
	st.code = codes.Internal
	s.send(st, sideUp, item{headers: []hpack.HeaderField{
		{Name: ":status", Value: httpStatus},
		{Name: "content-type", Value: "text/plain; charset=utf-8"},
		{Name: "grpc-status", Value: strconv.Itoa(int(codes.Internal))},
		{Name: "grpc-message", Value: encodeGrpcMessage(why)},
	}})
	s.send(st, sideUp, item{data: []byte(why + "\n"), end: true})
}
