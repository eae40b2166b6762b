package errkind

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

var codeOf = map[Kind]codes.Code{
	Invalid:     codes.InvalidArgument,
	NotFound:    codes.NotFound,
	Refused:     codes.FailedPrecondition,
	Aborted:     codes.Aborted,
	Unavailable: codes.Unavailable,
	Timeout:     codes.DeadlineExceeded,
	Internal:    codes.Internal,
}

// GRPC is err as the gRPC status a caller gets: the code of its kind, or
// the status it already has (a runtime's NotFound stays NotFound), with
// its detail attached. The edges call it once on what they return.
func GRPC(err error) error {
	if err == nil {
		return nil
	}
	kind, detail := Of(err), DetailOf(err)
	if kind == "" && detail == nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
	}
	code := codes.Unknown
	if c, ok := codeOf[kind]; ok {
		code = c
	} else if st, ok := status.FromError(err); ok {
		code = st.Code()
	}
	st := status.New(code, message(err))
	if detail != nil {
		if d, derr := st.WithDetails(protoadapt.MessageV1Of(detail)); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// message is err's text without the "rpc error: code = … desc = " of a
// status error wrapped inside it.
func message(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}
