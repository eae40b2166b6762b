package resources

import (
	"fmt"
	"path"
	"strings"
)

// Cgroup drivers, as kubelet's and containerd's SystemdCgroup setting name them.
const (
	DriverCgroupfs = "cgroupfs"
	DriverSystemd  = "systemd"
)

// Target names one container's cgroup.
type Target struct {
	// CgroupsPath is linux.cgroupsPath of the container's OCI runtime spec:
	// "/kubepods/burstable/pod<uid>/<id>" (cgroupfs) or
	// "kubepods-burstable-pod<uid>.slice:cri-containerd:<id>" (systemd).
	CgroupsPath string
	// Driver is DriverCgroupfs or DriverSystemd; empty means "guess from the
	// path's shape" (systemd paths are "slice:prefix:name", never absolute).
	Driver string
}

// driver is the driver named, or guessed from the path's shape.
func (t Target) driver() string {
	if t.Driver != "" {
		return t.Driver
	}
	if !strings.HasPrefix(t.CgroupsPath, "/") && strings.Count(t.CgroupsPath, ":") == 2 {
		return DriverSystemd
	}
	return DriverCgroupfs
}

// units returns the systemd units that own the container's and the pod's
// cgroups ("cri-containerd-<id>.scope", "kubepods-burstable-pod<uid>.slice")
// with the systemd driver, and empty names with cgroupfs. With the systemd
// driver every cgroup is a unit named as its directory.
func (t Target) units() (container, pod string, err error) {
	if t.driver() != DriverSystemd {
		return "", "", nil
	}
	ctr, p, err := t.cgroups()
	if err != nil {
		return "", "", err
	}
	return path.Base(ctr), path.Base(p), nil
}

// cgroups returns the container's cgroup and its parent, the pod cgroup, as
// paths relative to a hierarchy root ("/kubepods/.../<id>").
func (t Target) cgroups() (container, pod string, err error) {
	driver := t.driver()
	switch driver {
	case DriverCgroupfs:
		container, err = cgroupfsPath(t.CgroupsPath)
	case DriverSystemd:
		container, err = systemdPath(t.CgroupsPath)
	default:
		return "", "", fmt.Errorf("%w: unknown cgroup driver %q", ErrInvalidTarget, t.Driver)
	}
	if err != nil {
		return "", "", err
	}
	pod = path.Dir(container)
	if pod == "/" {
		return "", "", fmt.Errorf("%w: %q has no parent (pod) cgroup", ErrInvalidTarget, t.CgroupsPath)
	}
	return container, pod, nil
}

func cgroupfsPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: cgroupfs path %q is not absolute", ErrInvalidTarget, p)
	}
	// The path comes from the runtime; refuse anything that would lead out of
	// the hierarchy rather than trusting Clean to fold it away.
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: cgroupfs path %q contains ..", ErrInvalidTarget, p)
		}
	}
	return path.Clean(p), nil
}

// systemdPath turns "slice:prefix:name" into the cgroup path systemd creates
// for it, the way runc does: the slice expands into its ancestors
// ("a-b.slice" → "/a.slice/a-b.slice") and the container is the scope
// "<prefix>-<name>.scope", unless name is itself a slice.
func systemdPath(p string) (string, error) {
	parts := strings.Split(p, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("%w: systemd path %q is not slice:prefix:name", ErrInvalidTarget, p)
	}
	slice, prefix, name := parts[0], parts[1], parts[2]
	if slice == "" {
		slice = "system.slice" // runc's default
	}
	dir, err := expandSlice(slice)
	if err != nil {
		return "", err
	}
	if name == "" || strings.Contains(name, "/") || strings.Contains(prefix, "/") {
		return "", fmt.Errorf("%w: systemd path %q has a bad unit name", ErrInvalidTarget, p)
	}
	unit := name
	if !strings.HasSuffix(name, ".slice") {
		unit = name + ".scope"
		if prefix != "" {
			unit = prefix + "-" + unit
		}
	}
	return path.Join(dir, unit), nil
}

func expandSlice(slice string) (string, error) {
	const suffix = ".slice"
	if len(slice) <= len(suffix) || !strings.HasSuffix(slice, suffix) || strings.Contains(slice, "/") {
		return "", fmt.Errorf("%w: invalid systemd slice %q", ErrInvalidTarget, slice)
	}
	name := strings.TrimSuffix(slice, suffix)
	if name == "-" {
		return "/", nil // the root slice
	}
	var dir, prefix string
	for _, component := range strings.Split(name, "-") {
		if component == "" {
			return "", fmt.Errorf("%w: invalid systemd slice %q", ErrInvalidTarget, slice)
		}
		dir += "/" + prefix + component + suffix
		prefix += component + "-"
	}
	return dir, nil
}

// Sandbox returns a Target that names the pod cgroup containing t's container
// as its own cgroup (and so the pod's parent, a QoS or slice cgroup, as its
// "pod"): for runtimes whose host cgroups govern only the whole sandbox
// (gVisor, Kata with sandbox_cgroup_only), Read, Plan and Apply on it work
// on the pod cgroup, with the parent raised only where the pod needs room.
func (t Target) Sandbox() (Target, error) {
	_, pod, err := t.cgroups()
	if err != nil {
		return Target{}, err
	}
	if path.Dir(pod) == "/" && t.driver() == DriverCgroupfs {
		return Target{}, fmt.Errorf("%w: pod cgroup %s of %q has no parent", ErrInvalidTarget, pod, t.CgroupsPath)
	}
	if t.driver() == DriverCgroupfs {
		return Target{CgroupsPath: pod, Driver: DriverCgroupfs}, nil
	}
	// systemd: the pod is a slice, named as a unit of its parent slice
	// ("kubepods-burstable.slice::kubepods-burstable-pod<uid>.slice").
	parent := path.Base(path.Dir(pod))
	if parent == "/" || parent == "." {
		parent = "-.slice"
	}
	return Target{CgroupsPath: parent + "::" + path.Base(pod), Driver: DriverSystemd}, nil
}
