// Package enum reads a string vocabulary (holdmode's modes, strategy's
// strategies): the values listed for a message and a value parsed as the
// flags, the config file and the annotations spell it. A leaf of the
// standard library, so that the CLIs link it without the daemon.
package enum

import (
	"fmt"
	"slices"
	"strings"
)

// Set is every value of a vocabulary, in the order messages list them
// (at least two).
type Set[T ~string] []T

// Choices lists the values for a message: "queue, drop or off".
func (s Set[T]) Choices() string {
	names := make([]string, len(s))
	for i, v := range s {
		names[i] = string(v)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Parse reads one of the values; case and surrounding blanks do not
// matter. The error names the value and the choices, for the caller to say
// where the value came from.
func (s Set[T]) Parse(text string) (T, error) {
	v := T(strings.ToLower(strings.TrimSpace(text)))
	if slices.Contains(s, v) {
		return v, nil
	}
	return "", fmt.Errorf("%q: use %s", text, s.Choices())
}
