package errkind

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestGRPC(t *testing.T) {
	runtimeNotFound := status.Error(codes.NotFound, "container abc not found")
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"invalid", Errorf(Invalid, "cpu limit %dm is out of range", -1), codes.InvalidArgument, "cpu limit -1m is out of range"},
		{"not found", Errorf(NotFound, "container %s is gone", "abc"), codes.NotFound, "container abc is gone"},
		{"refused", Errorf(Refused, "busy"), codes.FailedPrecondition, "busy"},
		{"aborted", Errorf(Aborted, "undone"), codes.Aborted, "undone"},
		{"unavailable", Errorf(Unavailable, "retry"), codes.Unavailable, "retry"},
		{"timeout", Errorf(Timeout, "still running"), codes.DeadlineExceeded, "still running"},
		{"internal", Errorf(Internal, "not undone"), codes.Internal, "not undone"},
		{"wrapped kind", fmt.Errorf("swap x: %w", Errorf(Refused, "busy")), codes.FailedPrecondition, "swap x: busy"},
		{"a bare kind wrapped", fmt.Errorf("bad: %w", Invalid), codes.InvalidArgument, "bad: invalid request"},
		{"runtime status as it is", runtimeNotFound, codes.NotFound, "container abc not found"},
		{"kind over a runtime status", Errorf(Aborted, "resize failed: %w", runtimeNotFound), codes.Aborted,
			"resize failed: rpc error: code = NotFound desc = container abc not found"},
		{"no kind, no status", errors.New("plain"), codes.Unknown, "plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(GRPC(tc.err))
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("GRPC(%v) = %s %q, want %s %q", tc.err, st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	if GRPC(nil) != nil {
		t.Error("GRPC(nil) is not nil")
	}
	if got := GRPC(runtimeNotFound); got != runtimeNotFound {
		t.Errorf("a status error is not returned as it is: %v", got)
	}
}

// A detail rides on the error in process and becomes a status detail at
// the edge, whatever code the error has.
func TestDetail(t *testing.T) {
	rec := wrapperspb.String("in effect: cpu 500m")
	for _, err := range []error{
		WithDetail(Errorf(Aborted, "resize failed and was undone"), rec),
		WithDetail(status.Error(codes.NotFound, "gone"), rec),
	} {
		if d, ok := DetailOf(err).(*wrapperspb.StringValue); !ok || d.GetValue() != rec.GetValue() {
			t.Errorf("DetailOf(%v) = %v", err, DetailOf(err))
		}
		st := status.Convert(GRPC(err))
		if len(st.Details()) != 1 {
			t.Fatalf("GRPC(%v): details %v", err, st.Details())
		}
		if d, ok := st.Details()[0].(*wrapperspb.StringValue); !ok || d.GetValue() != rec.GetValue() {
			t.Errorf("GRPC(%v): detail %v", err, st.Details()[0])
		}
	}
	if c := status.Code(GRPC(WithDetail(status.Error(codes.NotFound, "gone"), rec))); c != codes.NotFound {
		t.Errorf("a detail changed the runtime's code to %s", c)
	}
	if WithDetail(nil, rec) != nil || Of(errors.New("x")) != "" {
		t.Error("nil or kindless errors")
	}
}
