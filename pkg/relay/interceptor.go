package relay

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/inplaced/inplaced/pkg/errkind"
)

// Invoker forwards an encoded request to the backend and returns the encoded
// response.
type Invoker func(ctx context.Context, req []byte) ([]byte, error)

// Interceptor handles one unary method. It may inspect or rewrite the request,
// call next (zero, one or more times) and inspect or rewrite the response.
// Errors of package errkind reach the caller with their kind's gRPC code,
// status errors (the backend's) as they are.
type Interceptor func(ctx context.Context, req []byte, next Invoker) ([]byte, error)

// Table maps full method names ("/runtime.v1.RuntimeService/CreateContainer")
// to interceptors. Several interceptors for one method run in the order they
// were added, the first one outermost.
type Table map[string][]Interceptor

// Add appends an interceptor for method.
func (t Table) Add(method string, ic Interceptor) {
	t[method] = append(t[method], ic)
}

// chain composes a method's interceptors around the final invoker.
func chain(ics []Interceptor, final Invoker) Invoker {
	next := final
	for i := len(ics) - 1; i >= 0; i-- {
		ic, inner := ics[i], next
		next = func(ctx context.Context, req []byte) ([]byte, error) {
			return ic(ctx, req, inner)
		}
	}
	return next
}

type message[T any] interface {
	*T
	proto.Message
}

// Unary adapts a typed handler to an Interceptor: the request is decoded into
// Req, the handler's next encodes what it is given and decodes the backend's
// answer into Resp.
func Unary[Req, Resp any, PReq message[Req], PResp message[Resp]](
	h func(ctx context.Context, req PReq, next func(context.Context, PReq) (PResp, error)) (PResp, error),
) Interceptor {
	return func(ctx context.Context, raw []byte, next Invoker) ([]byte, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(raw, req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "decode %T: %v", req, err)
		}
		resp, err := h(ctx, req, func(ctx context.Context, r PReq) (PResp, error) {
			in, err := proto.Marshal(r)
			if err != nil {
				return nil, status.Errorf(codes.Internal, "encode %T: %v", r, err)
			}
			out, err := next(ctx, in)
			if err != nil {
				return nil, err
			}
			resp := PResp(new(Resp))
			if err := proto.Unmarshal(out, resp); err != nil {
				return nil, status.Errorf(codes.Internal, "decode backend %T: %v", resp, err)
			}
			return resp, nil
		})
		if err != nil {
			// The CRI edge: an interceptor's own errors (package errkind)
			// get their gRPC code here, the backend's keep theirs.
			return nil, errkind.GRPC(err)
		}
		out, err := proto.Marshal(resp)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode %T: %v", resp, err)
		}
		return out, nil
	}
}
