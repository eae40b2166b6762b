// Package netns opens network namespaces and runs code inside one: the
// connection hold (pkg/hold) creates its sockets and netfilter tables in
// the pod's namespace, the takeover agent (pkg/takeover) reads a
// per-namespace sysctl there.
package netns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on a locked OS thread that has entered the network namespace
// ns. Sockets created by fn belong to ns for their whole life. If the
// thread cannot return to its own namespace it stays locked, and the Go
// runtime discards it when the goroutine ends.
func Run(ns *os.File, fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace %s: %w", ns.Name(), err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("return from network namespace %s: %w", ns.Name(), err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Open opens a network namespace file (/proc/<pid>/ns/net or a bind mount
// such as /var/run/netns/<name>) and checks that it is one.
func Open(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		f.Close()
		return nil, fmt.Errorf("%s is not a network namespace", path)
	}
	return f, nil
}
