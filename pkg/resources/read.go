package resources

import (
	"errors"
	"fmt"
	"io/fs"
)

// Level says which of the two cgroups a value or a write belongs to.
type Level string

const (
	LevelPod       Level = "pod"
	LevelContainer Level = "container"
)

// Values are the settings of one cgroup, in CRI/OCI units.
type Values struct {
	CPUQuota    int64  // µs per period; Unlimited when there is no limit
	CPUPeriod   uint64 // µs
	CPUShares   uint64 // v1 cpu.shares; 0 on v2
	CPUWeight   uint64 // v2 cpu.weight; 0 on v1
	MemoryLimit int64  // bytes; Unlimited when there is no limit
	// MemorySwapLimit is v1 memory.memsw.limit_in_bytes (memory+swap); nil on
	// v2 and on kernels without swap accounting. containerd sets it equal to
	// the memory limit, and the kernel refuses a memory limit above it.
	MemorySwapLimit *int64
	MemoryUsage     uint64 // bytes (v1 memory.usage_in_bytes, v2 memory.current)
}

// Cgroup is one cgroup and its values.
type Cgroup struct {
	Path string // relative to the hierarchy root, e.g. "/kubepods/burstable/pod<uid>/<id>"
	// Unit is the systemd unit that owns the cgroup with the systemd driver
	// ("cri-containerd-<id>.scope", "kubepods-burstable-pod<uid>.slice"),
	// empty with cgroupfs.
	Unit string
	Values
}

// Current is what a container's cgroup and its pod cgroup are set to now.
type Current struct {
	Container Cgroup
	Pod       Cgroup
}

// Read returns the current values of t's container cgroup and of its parent,
// the pod cgroup. A container that is gone shows as an error wrapping
// fs.ErrNotExist.
func (m *Manager) Read(t Target) (Current, error) {
	ctr, pod, err := t.cgroups()
	if err != nil {
		return Current{}, err
	}
	ctrUnit, podUnit, err := t.units()
	if err != nil {
		return Current{}, err
	}
	var cur Current
	if cur.Container, err = m.readCgroup(ctr); err != nil {
		return Current{}, fmt.Errorf("resources: container cgroup: %w", err)
	}
	if cur.Pod, err = m.readCgroup(pod); err != nil {
		return Current{}, fmt.Errorf("resources: pod cgroup: %w", err)
	}
	cur.Container.Unit, cur.Pod.Unit = ctrUnit, podUnit
	return cur, nil
}

// readCgroup reads the files itself rather than through the containerd
// library's Stat: Stat has no CPU limits, and its v2 reader turns an
// unreadable memory.current into 0, which would let a lowering slip past the
// usage check.
func (m *Manager) readCgroup(cg string) (Cgroup, error) {
	c := Cgroup{Path: cg}
	var err error
	if m.v2 {
		err = m.readV2(cg, &c.Values)
	} else {
		err = m.readV1(cg, &c.Values)
	}
	if err == nil && c.CPUPeriod == 0 {
		err = fmt.Errorf("cgroup %s: cpu period 0", cg)
	}
	return c, err
}

func (m *Manager) readV2(cg string, v *Values) error {
	s, err := m.readString(cg, fileCPUMax)
	if err != nil {
		return err
	}
	if v.CPUQuota, v.CPUPeriod, err = parseCPUMax(s); err != nil {
		return fmt.Errorf("parse %s: %w", m.filePath(cg, fileCPUMax), err)
	}
	if v.CPUWeight, err = m.readUint(cg, fileWeight); err != nil {
		return err
	}
	if v.MemoryLimit, err = m.readMemLimit(cg, fileMemMax); err != nil {
		return err
	}
	v.MemoryUsage, err = m.readUint(cg, fileMemCurrent)
	return err
}

func (m *Manager) readV1(cg string, v *Values) error {
	var err error
	if v.CPUQuota, err = m.readQuota(cg); err != nil {
		return err
	}
	if v.CPUPeriod, err = m.readUint(cg, filePeriod); err != nil {
		return err
	}
	if v.CPUShares, err = m.readUint(cg, fileShares); err != nil {
		return err
	}
	if v.MemoryLimit, err = m.readMemLimit(cg, fileMemLimit); err != nil {
		return err
	}
	if v.MemoryUsage, err = m.readUint(cg, fileMemUsageV1); err != nil {
		return err
	}
	switch sw, err := m.readMemLimit(cg, fileMemswLimit); {
	case err == nil:
		v.MemorySwapLimit = &sw
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return nil
}
