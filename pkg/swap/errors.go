package swap

import "fmt"

// Kind is the kind of one of the engine's own refusals. The engine says
// what is wrong and what to do; the edges map the kind to their code once
// (package control: gRPC InvalidArgument, NotFound, FailedPrecondition).
// Errors of the runtime pass through as they are, with their own codes.
type Kind string

func (k Kind) Error() string { return string(k) }

// The kinds, for errors.Is.
const (
	ErrInvalid  Kind = "invalid request" // cannot be carried out as given
	ErrNotFound Kind = "not found"       // the target or swap does not exist
	ErrRefused  Kind = "refused"         // valid, but not now (a swap runs, the container stopped, no override...)
)

// refusal is an error of one of the kinds above; its text is the message
// alone.
type refusal struct {
	kind Kind
	msg  string
}

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { k, ok := target.(Kind); return ok && k == r.kind }

func invalidf(format string, a ...any) error {
	return &refusal{kind: ErrInvalid, msg: fmt.Sprintf(format, a...)}
}

func notFoundf(format string, a ...any) error {
	return &refusal{kind: ErrNotFound, msg: fmt.Sprintf(format, a...)}
}

func refusedf(format string, a ...any) error {
	return &refusal{kind: ErrRefused, msg: fmt.Sprintf(format, a...)}
}
