// Package errkind names the kinds of inplaced's own errors, so that the
// packages that decide (swap, resize, kube) say what went wrong in words and
// the edges that answer a caller (the control API, the CRI interceptors)
// turn a kind into its gRPC code in one place: GRPC.
//
// An error of the runtime passes through with its own status; an error
// with no kind and no status is Unknown, as grpc-go makes it.
package errkind

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// Kind is what kind of error it is, for errors.Is.
type Kind string

func (k Kind) Error() string { return string(k) }

// The kinds, each with the gRPC code GRPC gives it.
const (
	Invalid     Kind = "invalid request"  // cannot be carried out as given: InvalidArgument
	NotFound    Kind = "not found"        // the target does not exist (any more): NotFound
	Refused     Kind = "refused"          // valid, but not now or not here: FailedPrecondition
	Aborted     Kind = "failed, undone"   // tried, failed, and what was there before is back: Aborted
	Unavailable Kind = "unavailable"      // try again in a moment: Unavailable
	Timeout     Kind = "timed out"        // still running when the caller's time ran out: DeadlineExceeded
	Internal    Kind = "internal failure" // failed and could not be undone or checked: Internal
)

// Error is an error of a kind, optionally carrying a record the caller
// gets as a status detail (what is in effect after a failed resize).
type Error struct {
	Kind   Kind // empty: the wrapped error's own code
	Err    error
	Detail proto.Message
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool {
	k, ok := target.(Kind)
	return ok && e.Kind != "" && k == e.Kind
}

// Errorf formats an error of kind k; %w wraps as in fmt.Errorf.
func Errorf(k Kind, format string, a ...any) error {
	return &Error{Kind: k, Err: fmt.Errorf(format, a...)}
}

// WithDetail returns err carrying d; err keeps its kind or status.
func WithDetail(err error, d proto.Message) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, Detail: d}
}

// Of returns the kind of err, or "" when it has none.
func Of(err error) Kind {
	for _, k := range []Kind{Invalid, NotFound, Refused, Aborted, Unavailable, Timeout, Internal} {
		if errors.Is(err, k) {
			return k
		}
	}
	return ""
}

// DetailOf returns the detail err carries, or nil.
func DetailOf(err error) proto.Message {
	for e := (*Error)(nil); errors.As(err, &e); err = e.Err {
		if e.Detail != nil {
			return e.Detail
		}
	}
	return nil
}
