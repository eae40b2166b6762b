package main

import "testing"

// TestGCPercent: inplaced's default unless the user set GOGC (which the Go
// runtime applies itself, "off" included).
func TestGCPercent(t *testing.T) {
	if pct, ok := gcPercentFor(""); !ok || pct != defaultGCPercent {
		t.Errorf("no GOGC: %d, %v; want %d", pct, ok, defaultGCPercent)
	}
	for _, v := range []string{"100", "off", "200"} {
		if _, ok := gcPercentFor(v); ok {
			t.Errorf("GOGC=%s: inplaced sets its own", v)
		}
	}
}
