package takeover

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetNSOf runs fn on a locked OS thread that has entered the network
// namespace of process pid. If the thread cannot return to its own
// namespace it stays locked, and the Go runtime discards it when the
// goroutine ends.
func inNetNSOf(pid int, fn func() error) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("own network namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter the network namespace of %d: %w", pid, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("return from the network namespace of %d: %w", pid, err)
	}
	runtime.UnlockOSThread()
	return ferr
}
