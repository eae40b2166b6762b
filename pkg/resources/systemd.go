package resources

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Systemd keeps systemd's record of a unit's limits in step with its cgroup
// files, for the systemd cgroup driver.
//
// With that driver every pod and container cgroup is a systemd unit (a
// kubepods-...-pod<uid>.slice, a cri-containerd-<id>.scope) whose limits
// systemd keeps as properties (CPUQuotaPerSecUSec, MemoryMax, CPUWeight, ...)
// and writes into the files itself. systemd does not read the files back: a
// value written only to a file is replaced by the unit's recorded one the next
// time systemd applies the unit's properties, which it does for all of them
// whenever any property of the unit is set — kubelet setting the pod slice's
// CPUWeight reverts a pod cpu.max raised by file alone (seen on systemd 252,
// Debian 12). runc and kubelet therefore set the properties first and then
// write the files; Apply does the same for every write on a systemd unit.
type Systemd interface {
	// SetUnitProperties sets runtime (non-persistent) properties of a unit.
	SetUnitProperties(ctx context.Context, unit string, props []UnitProperty) error
}

// UnitProperty is one systemd unit property; every one used here is a uint64
// ("t" in D-Bus), math.MaxUint64 meaning infinity.
type UnitProperty struct {
	Name  string
	Value uint64
}

func (p UnitProperty) String() string {
	if p.Value == math.MaxUint64 {
		return p.Name + "=infinity"
	}
	return p.Name + "=" + strconv.FormatUint(p.Value, 10)
}

// WithSystemd sets how unit properties are set for systemd-driver cgroups;
// nil disables it (files only). The default is D-Bus on a host whose root is
// DefaultRoot and nil elsewhere (fake trees).
func WithSystemd(s Systemd) Option { return func(m *Manager) { m.systemd = s; m.systemdSet = true } }

// unitProps returns the properties that record content in file of cgroup cg,
// as runc's systemd driver sets them. A v1 CPU quota or period needs the other
// of the two: it is read from the cgroup. nil means the file has no property
// (memory.memsw.limit_in_bytes).
func (m *Manager) unitProps(cg, file, content string) ([]UnitProperty, error) {
	switch file {
	case fileCPUMax:
		q, p, err := parseCPUMax(content)
		if err != nil {
			return nil, err
		}
		return cpuQuotaProps(q, p), nil
	case fileQuota, filePeriod:
		var quota int64
		var period uint64
		var err error
		if file == fileQuota {
			if quota, err = strconv.ParseInt(content, 10, 64); err == nil {
				period, err = m.readUint(cg, filePeriod)
			}
		} else {
			if period, err = strconv.ParseUint(content, 10, 64); err == nil {
				quota, err = m.readQuota(cg)
			}
		}
		if err != nil {
			return nil, err
		}
		return cpuQuotaProps(max(quota, Unlimited), period), nil
	case fileWeight, fileShares:
		v, err := strconv.ParseUint(content, 10, 64)
		if err != nil {
			return nil, err
		}
		name := "CPUWeight"
		if file == fileShares {
			name = "CPUShares"
		}
		return []UnitProperty{{name, v}}, nil
	case fileMemMax, fileMemLimit:
		v, err := m.parseMemLimit(content)
		if err != nil {
			return nil, err
		}
		name := "MemoryMax"
		if file == fileMemLimit {
			name = "MemoryLimit"
		}
		return []UnitProperty{{name, memProp(v)}}, nil
	}
	return nil, nil
}

// cpuQuotaProps is runc's mapping: systemd takes the quota as µs per second
// and rounds it to whole percent, so it is rounded up to 10 ms per second
// (the file, written after, has the exact value).
func cpuQuotaProps(quota int64, period uint64) []UnitProperty {
	perSec := uint64(math.MaxUint64)
	if quota != Unlimited && period > 0 {
		perSec = uint64(quota) * 1000000 / period
		if perSec%10000 != 0 {
			perSec = (perSec/10000 + 1) * 10000
		}
	}
	return []UnitProperty{{"CPUQuotaPerSecUSec", perSec}, {"CPUQuotaPeriodUSec", period}}
}

func memProp(v int64) uint64 {
	if v == Unlimited {
		return math.MaxUint64
	}
	return uint64(v)
}

// setUnit records content of w's file in w's unit. The call gets a context
// of its own: like the file writes and their undo it must not be cut short.
func (m *Manager) setUnit(w Write, content string) error {
	if m.systemd == nil || w.Unit == "" {
		return nil
	}
	props, err := m.unitProps(w.Cgroup, w.File, content)
	if err != nil || len(props) == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.systemd.SetUnitProperties(ctx, w.Unit, props); err != nil {
		return fmt.Errorf("systemd: set %v on %s: %w", props, w.Unit, err)
	}
	return nil
}

// dbusSystemd talks to systemd over D-Bus: the system bus, or systemd's
// private socket when there is no bus daemon (go-systemd's NewWithContext).
// It connects on first use and again after a failed call.
type dbusSystemd struct {
	mu   sync.Mutex
	conn *sddbus.Conn
}

// SystemdDBus returns the D-Bus Systemd.
func SystemdDBus() Systemd { return &dbusSystemd{} }

func (d *dbusSystemd) SetUnitProperties(ctx context.Context, unit string, props []UnitProperty) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.conn == nil {
		// The connection lives as long as the context it is made with: not
		// the call's, which ends with the call.
		c, err := sddbus.NewWithContext(context.Background())
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		d.conn = c
	}
	ps := make([]sddbus.Property, len(props))
	for i, p := range props {
		ps[i] = sddbus.Property{Name: p.Name, Value: godbus.MakeVariant(p.Value)}
	}
	err := d.conn.SetUnitPropertiesContext(ctx, unit, true, ps...)
	if err != nil && !d.conn.Connected() {
		d.conn.Close()
		d.conn = nil
	}
	return err
}
