package install

import (
	"encoding/json"
	"fmt"
	"time"
)

// AnnotationInstalled is the Node annotation an install writes and an
// uninstall removes: Installed as JSON.
const AnnotationInstalled = "inplaced.io/installed"

// The Node events' reasons.
const (
	ReasonInstalled     = "InplacedInstalled"
	ReasonUpgraded      = "InplacedUpgraded"
	ReasonUpdated       = "InplacedUpdated"
	ReasonUninstalled   = "InplacedUninstalled"
	ReasonInstallFailed = "InplacedInstallFailed"
)

// Installed is the value of AnnotationInstalled: what is on the node, since
// when, and what kubelet used before.
type Installed struct {
	Version                 string    `json:"version"`
	Time                    time.Time `json:"time"`
	PreviousRuntimeEndpoint string    `json:"previousRuntimeEndpoint"`
	PreviousImageEndpoint   string    `json:"previousImageEndpoint,omitempty"`
	Layout                  Layout    `json:"layout"`
}

// ParseInstalled reads an AnnotationInstalled value.
func ParseInstalled(s string) (*Installed, error) {
	var in Installed
	if err := json.Unmarshal([]byte(s), &in); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationInstalled, err)
	}
	return &in, nil
}

// Value is the annotation's value.
func (in Installed) Value() string {
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // a struct of strings and a time always marshals
	}
	return string(b)
}

func (in *Installed) equal(o *Installed) bool {
	if in == nil || o == nil {
		return in == o
	}
	return in.Version == o.Version && in.Time.Equal(o.Time) && in.PreviousRuntimeEndpoint == o.PreviousRuntimeEndpoint &&
		in.PreviousImageEndpoint == o.PreviousImageEndpoint && in.Layout == o.Layout
}

func (r *Record) installed() *Installed {
	return &Installed{Version: r.Version, Time: r.Time, PreviousRuntimeEndpoint: r.PreviousRuntimeEndpoint,
		PreviousImageEndpoint: r.PreviousImageEndpoint, Layout: r.Layout}
}
