package swap

import "github.com/inplaced/inplaced/pkg/errkind"

// Kind is the kind of one of the engine's own refusals (package errkind).
// The engine says what is wrong and what to do; the edges map the kind to
// its code once (errkind.GRPC: InvalidArgument, NotFound,
// FailedPrecondition). Errors of the runtime pass through as they are, with
// their own codes.
type Kind = errkind.Kind

// The kinds, for errors.Is.
const (
	ErrInvalid  = errkind.Invalid  // cannot be carried out as given
	ErrNotFound = errkind.NotFound // the target or swap does not exist
	ErrRefused  = errkind.Refused  // valid, but not now (a swap runs, the container stopped, no override...)
)

func invalidf(format string, a ...any) error {
	return errkind.Errorf(ErrInvalid, format, a...)
}

func notFoundf(format string, a ...any) error {
	return errkind.Errorf(ErrNotFound, format, a...)
}

func refusedf(format string, a ...any) error {
	return errkind.Errorf(ErrRefused, format, a...)
}
