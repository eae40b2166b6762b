package resources

import (
	"fmt"
	"testing"
)

func TestParseCPUMax(t *testing.T) {
	for _, tc := range []struct {
		in     string
		quota  int64
		period uint64
		ok     bool
	}{
		{"max 100000", Unlimited, 100000, true},
		{"50000 100000", 50000, 100000, true},
		{"150000 50000", 150000, 50000, true},
		{"max", 0, 0, false},
		{"x 100000", 0, 0, false},
		{"50000 y", 0, 0, false},
	} {
		q, p, err := parseCPUMax(tc.in)
		if (err == nil) != tc.ok || (tc.ok && (q != tc.quota || p != tc.period)) {
			t.Errorf("parseCPUMax(%q) = %d, %d, %v; want %d, %d, ok=%v", tc.in, q, p, err, tc.quota, tc.period, tc.ok)
		}
	}
}

func TestFormatCPUMax(t *testing.T) {
	for _, tc := range []struct {
		quota  int64
		period uint64
		want   string
	}{
		{Unlimited, 100000, "max 100000"},
		{150000, 100000, "150000 100000"},
		{1000, 1000, "1000 1000"},
	} {
		if got := formatCPUMax(tc.quota, tc.period); got != tc.want {
			t.Errorf("formatCPUMax(%d, %d) = %q, want %q", tc.quota, tc.period, got, tc.want)
		}
	}
}

func TestMemoryLimitFormats(t *testing.T) {
	v1 := &Manager{page: 4096}
	v2 := &Manager{page: 4096, v2: true}
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"max", Unlimited},
		{"-1", Unlimited},
		{"9223372036854771712", Unlimited}, // v1 reads "no limit" back as this
		{"268435456", 268435456},
	} {
		got, err := v1.parseMemLimit(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseMemLimit(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	if got := v1.formatMemLimit(Unlimited); got != "-1" {
		t.Errorf("v1 formatMemLimit(Unlimited) = %q, want -1", got)
	}
	if got := v2.formatMemLimit(Unlimited); got != "max" {
		t.Errorf("v2 formatMemLimit(Unlimited) = %q, want max", got)
	}
	if got := v2.formatMemLimit(1 << 30); got != "1073741824" {
		t.Errorf("v2 formatMemLimit(1Gi) = %q", got)
	}
}

func TestSameContent(t *testing.T) {
	m := &Manager{page: 4096}
	for _, tc := range []struct {
		file, a, b string
		want       bool
	}{
		{fileMemLimit, "-1", "9223372036854771712", true},
		{fileMemLimit, "100000000", "99999744", true}, // the kernel keeps whole pages
		{fileMemLimit, "100000000", "99995648", false},
		{fileMemMax, "max", "-1", true},
		{fileMemswLimit, "268435456\n", "268435456", true},
		{fileCPUMax, "max 100000", "max 100000\n", true},
		{fileCPUMax, "50000 100000", "max 100000", false},
		{fileQuota, "-1", "-1", true},
		{fileQuota, "50000", "150000", false},
	} {
		if got := m.sameContent(tc.file, tc.a, tc.b); got != tc.want {
			t.Errorf("sameContent(%s, %q, %q) = %v, want %v", tc.file, tc.a, tc.b, got, tc.want)
		}
	}
}

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		quota             int64
		period, podPeriod uint64
		want              int64
	}{
		{50000, 100000, 100000, 50000},
		{Unlimited, 50000, 100000, Unlimited},
		{25000, 50000, 100000, 50000}, // same rate, pod's period
		{33333, 100000, 50000, 16667}, // rounded up
		{1 << 62, 1000, 1000000, Unlimited},
	} {
		if got := rate(tc.quota, tc.period, tc.podPeriod); got != tc.want {
			t.Errorf("rate(%d, %d, %d) = %d, want %d", tc.quota, tc.period, tc.podPeriod, got, tc.want)
		}
	}
}

func fmtLimits(l Limits) string {
	f := func(p any) string {
		switch v := p.(type) {
		case *int64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		case *uint64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		}
		return "nil"
	}
	return fmt.Sprintf("{quota=%s period=%s shares=%s mem=%s}", f(l.CPUQuota), f(l.CPUPeriod), f(l.CPUShares), f(l.MemoryLimit))
}
