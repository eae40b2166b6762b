package resources

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/cgroups/v3"
)

// DefaultRoot is where the cgroup hierarchies are mounted on a normal host.
const DefaultRoot = "/sys/fs/cgroup"

// Manager reads and repairs container and pod cgroups under one root.
type Manager struct {
	root string
	v2   bool
	fs   FS
	page int64 // the kernel keeps memory limits in whole pages
	// systemd records written values in systemd-driver units (nil: files only).
	systemd    Systemd
	systemdSet bool

	// mu serialises Apply: two containers of one pod share the pod cgroup, and
	// the pod rule is a read-modify-write of its limits.
	mu sync.Mutex
}

// Option configures a Manager.
type Option func(*Manager)

// WithFS replaces the filesystem (tests: fake trees, injected failures).
func WithFS(fsys FS) Option { return func(m *Manager) { m.fs = fsys } }

// New returns a Manager for the hierarchies under root (DefaultRoot when
// empty). It detects the layout once: cgroup v2 when root is a unified
// hierarchy, otherwise cgroup v1 with one mount per controller under root
// (a hybrid host, with an empty cgroup2 at root/unified, counts as v1 because
// the controllers we need are on the v1 side).
func New(root string, opts ...Option) (*Manager, error) {
	if root == "" {
		root = DefaultRoot
	}
	m := &Manager{root: filepath.Clean(root), fs: OSFS(), page: int64(os.Getpagesize())}
	for _, o := range opts {
		o(m)
	}
	if m.fs == nil {
		return nil, errors.New("resources: nil FS")
	}
	if !m.systemdSet && m.root == DefaultRoot {
		m.systemd = SystemdDBus() // connects on the first systemd-driver write
	}
	v2, err := m.detectV2()
	if err != nil {
		return nil, err
	}
	m.v2 = v2
	return m, nil
}

// Version returns 1 or 2, the cgroup version of the layout under the root.
func (m *Manager) Version() int {
	if m.v2 {
		return 2
	}
	return 1
}

// detectV2 asks the containerd library on the real mount point, where it can
// look at the filesystem type; anywhere else (a fake tree in a temp dir) the
// statfs magic is meaningless, so it looks for the file only v2 has.
func (m *Manager) detectV2() (bool, error) {
	if m.root == DefaultRoot {
		switch cgroups.Mode() {
		case cgroups.Unified:
			return true, nil
		case cgroups.Legacy, cgroups.Hybrid:
			return false, nil
		default:
			return false, fmt.Errorf("resources: no cgroup hierarchy mounted at %s", m.root)
		}
	}
	_, err := m.fs.ReadFile(filepath.Join(m.root, "cgroup.controllers"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("resources: detect cgroup version under %s: %w", m.root, err)
	}
}
