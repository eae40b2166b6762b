package control

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/inplaced/inplaced/pkg/swap"
)

// The engine's refusals get their codes here, once; a runtime's status
// passes as it is, and anything else stays Unknown.
func TestGRPCError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{fmt.Errorf("bad: %w", swap.ErrInvalid), codes.InvalidArgument, "bad: invalid request"},
		{fmt.Errorf("gone: %w", swap.ErrNotFound), codes.NotFound, "gone: not found"},
		{fmt.Errorf("busy: %w", swap.ErrRefused), codes.FailedPrecondition, "busy: refused"},
		{status.Error(codes.NotFound, "container x not found"), codes.NotFound, "container x not found"},
		{errors.New("disk full"), codes.Unknown, "disk full"},
	} {
		got := status.Convert(grpcError(tc.err))
		if got.Code() != tc.code || got.Message() != tc.msg {
			t.Errorf("%v: %s %q, want %s %q", tc.err, got.Code(), got.Message(), tc.code, tc.msg)
		}
	}
	if grpcError(nil) != nil {
		t.Error("nil is not an error")
	}
}
