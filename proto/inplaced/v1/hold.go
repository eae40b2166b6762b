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
	if len(h.PortResults) > 0 {
		per := make([]string, len(h.PortResults))
		for i, p := range h.PortResults {
			per[i] = p.Summary()
		}
		t += "; " + strings.Join(per, "; ")
	}
	if len(h.NeverListened) > 0 {
		t += fmt.Sprintf("; the new container never listened on %s", joinUint32(h.NeverListened))
	}
	if h.Why != "" {
		t += " (" + h.Why + ")"
	}
	return t
}

// Summary says how one port's hold ended: "8080: 31 parked, longest wait
// 160ms, 7 batches of at most 5 (backlog 5), released: listening".
func (p *HoldPort) Summary() string {
	t := fmt.Sprintf("%d: %d parked", p.Port, p.Parked)
	if p.LongestWaitNs > 0 {
		t += fmt.Sprintf(", longest wait %s", time.Duration(p.LongestWaitNs).Round(time.Millisecond))
	}
	switch {
	case p.Backlog > 0 && p.Batches > 0:
		t += fmt.Sprintf(", %d batches of at most %d (backlog %d)", p.Batches, p.MaxBatch, p.Backlog)
	case p.Batches > 0:
		t += ", one batch"
	}
	return t + ", released: " + p.Reason
}

func joinUint32(v []uint32) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}
