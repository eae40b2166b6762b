package inplacedv1

import (
	"fmt"
	"time"
)

// StrategySummary says how a swap replaced its container: "overlap: 8080
// handed over in 1ms (asked for by ...)" or "stop-first (why)"; "" for a
// record from before strategies.
func (r *SwapRecord) StrategySummary() string {
	if r.GetStrategy() == "" {
		return ""
	}
	t := r.Strategy
	if tk := r.Takeover; tk != nil && !tk.FellBack {
		switch {
		case len(tk.Ports) == 0:
			t += ": the old container listened on no TCP port"
		case len(tk.HandedOver) > 0:
			t += fmt.Sprintf(": %s handed over in %s", joinUint32(tk.HandedOver), time.Duration(tk.HandoverNs).Round(10*time.Microsecond))
		}
	}
	if r.StrategyWhy != "" {
		t += " (" + r.StrategyWhy + ")"
	}
	return t
}
