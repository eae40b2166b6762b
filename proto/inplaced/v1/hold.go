package inplacedv1

import (
	"fmt"
	"strings"
	"time"
)

// Summary says what a swap's connection hold did: "queue on 8080 for
// 163ms, 31 parked, longest wait 160ms, released: listening", or "not held:
// why".
func (h *HoldRecord) Summary() string {
	if h.Mode == "off" || h.Mode == "" || len(h.Ports) == 0 {
		return "not held: " + h.Why
	}
	ports := make([]string, len(h.Ports))
	for i, p := range h.Ports {
		ports[i] = fmt.Sprint(p)
	}
	t := fmt.Sprintf("%s on %s", h.Mode, strings.Join(ports, ","))
	if h.Reason != "" {
		t += fmt.Sprintf(" for %s, %d parked", time.Duration(h.DurationNs).Round(time.Millisecond), h.Parked)
		if h.LongestWaitNs > 0 {
			t += fmt.Sprintf(", longest wait %s", time.Duration(h.LongestWaitNs).Round(time.Millisecond))
		}
		t += ", released: " + h.Reason
	}
	if h.Why != "" {
		t += " (" + h.Why + ")"
	}
	return t
}
