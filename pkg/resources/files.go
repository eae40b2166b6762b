package resources

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
)

// The cgroup files this package reads and writes. The controller (the v1
// mount point under the root) is the part of the name before the first dot.
const (
	// cgroup v1
	fileQuota      = "cpu.cfs_quota_us"
	filePeriod     = "cpu.cfs_period_us"
	fileShares     = "cpu.shares"
	fileMemLimit   = "memory.limit_in_bytes"
	fileMemswLimit = "memory.memsw.limit_in_bytes" // only with swap accounting
	fileMemUsageV1 = "memory.usage_in_bytes"
	// cgroup v2
	fileCPUMax     = "cpu.max"
	fileWeight     = "cpu.weight"
	fileMemMax     = "memory.max"
	fileMemCurrent = "memory.current"
)

// filePath is where file of cgroup cg lives: <root>/<cg>/<file> on v2,
// <root>/<controller>/<cg>/<file> on v1 ("cpu" may be a symlink to
// "cpu,cpuacct"; the kernel and systemd keep both names working).
func (m *Manager) filePath(cg, file string) string {
	if m.v2 {
		return filepath.Join(m.root, cg, file)
	}
	controller, _, _ := strings.Cut(file, ".")
	return filepath.Join(m.root, controller, cg, file)
}

func (m *Manager) readString(cg, file string) (string, error) {
	b, err := m.fs.ReadFile(m.filePath(cg, file))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", m.filePath(cg, file), err)
	}
	return strings.TrimSpace(string(b)), nil
}

// readValue reads a cgroup file of one value and parses it; a value that
// does not parse is an error that names the file.
func readValue[T any](m *Manager, cg, file string, parse func(string) (T, error)) (T, error) {
	var zero T
	s, err := m.readString(cg, file)
	if err != nil {
		return zero, err
	}
	v, err := parse(s)
	if err != nil {
		return zero, fmt.Errorf("parse %s: %w", m.filePath(cg, file), err)
	}
	return v, nil
}

func (m *Manager) readUint(cg, file string) (uint64, error) {
	return readValue(m, cg, file, func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) })
}

func (m *Manager) readQuota(cg string) (int64, error) {
	q, err := readValue(m, cg, fileQuota, func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) })
	if err != nil {
		return 0, err
	}
	return max(q, Unlimited), nil
}

func (m *Manager) readMemLimit(cg, file string) (int64, error) {
	return readValue(m, cg, file, m.parseMemLimit)
}

// parseMemLimit reads a memory limit the way both versions spell it: v2 "max",
// v1 "-1" as written, or the largest page count the kernel stores for "no
// limit" (9223372036854771712 with 4 KiB pages) as read back.
func (m *Manager) parseMemLimit(s string) (int64, error) {
	if s == "max" || s == "-1" {
		return Unlimited, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if v >= uint64(math.MaxInt64/m.page*m.page) {
		return Unlimited, nil
	}
	return int64(v), nil
}

// formatMemLimit is what to write for a memory limit.
func (m *Manager) formatMemLimit(v int64) string {
	if v == Unlimited && m.v2 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

// pageRound is the value the kernel keeps for a memory limit: it counts pages
// and drops the remainder, so 100000000 reads back as 99999744.
func (m *Manager) pageRound(v int64) int64 {
	if v == Unlimited {
		return v
	}
	return v / m.page * m.page
}

// parseCPUMax reads v2 cpu.max: "<quota|max> <period>".
func parseCPUMax(s string) (quota int64, period uint64, err error) {
	q, p, ok := strings.Cut(s, " ")
	if !ok {
		return 0, 0, fmt.Errorf("cpu.max %q: want \"<quota|max> <period>\"", s)
	}
	if period, err = strconv.ParseUint(p, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("cpu.max period: %w", err)
	}
	if q == "max" {
		return Unlimited, period, nil
	}
	if quota, err = strconv.ParseInt(q, 10, 64); err != nil {
		return 0, 0, fmt.Errorf("cpu.max quota: %w", err)
	}
	return quota, period, nil
}

// formatCPUMax formats cpu.max as the containerd stack does: it is
// newCPUMax, our copy of cgroup2.NewCPUMax.
func formatCPUMax(quota int64, period uint64) string {
	var q *int64
	if quota != Unlimited {
		q = &quota
	}
	return newCPUMax(q, &period)
}

// newCPUMax is github.com/containerd/cgroups/v3/cgroup2.NewCPUMax: "<quota>
// <period>", with "max" for a nil quota and the kernel's default period
// 100000 for a nil period.
//
// It is copied rather than called because importing package cgroup2 links
// its Manager, and with it github.com/cilium/ebpf (13 packages), into
// inplaced: without that import the binary is 1.5 MB smaller and its
// resident memory right after start ("inplaced version") 0.2 to 0.8 MB
// lower, depending on the commit and on cgo: a node pays for every MB. A test
// (TestNewCPUMaxMatchesLibrary) keeps it equal to the library's.
func newCPUMax(quota *int64, period *uint64) string {
	q, p := "max", "100000"
	if quota != nil {
		q = strconv.FormatInt(*quota, 10)
	}
	if period != nil {
		p = strconv.FormatUint(*period, 10)
	}
	return q + " " + p
}

// sameContent reports whether two contents of file mean the same setting, so
// a read-back can be compared with what was written ("-1" and
// "9223372036854771712", or 100000000 and 99999744, are the same memory limit).
func (m *Manager) sameContent(file, a, b string) bool {
	a, b = strings.TrimSpace(a), strings.TrimSpace(b)
	if a == b {
		return true
	}
	switch file {
	case fileMemLimit, fileMemswLimit, fileMemMax:
		x, errX := m.parseMemLimit(a)
		y, errY := m.parseMemLimit(b)
		return errX == nil && errY == nil && m.pageRound(x) == m.pageRound(y)
	case fileCPUMax:
		q1, p1, errX := parseCPUMax(a)
		q2, p2, errY := parseCPUMax(b)
		return errX == nil && errY == nil && q1 == q2 && p1 == p2
	}
	return false
}
