package takeover

import (
	"fmt"
	"os"

	"github.com/inplaced/inplaced/pkg/internal/netns"
)

// inNetNSOf runs fn on a locked OS thread that has entered the network
// namespace of process pid (see netns.Run).
func inNetNSOf(pid int, fn func() error) error {
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return fmt.Errorf("network namespace of %d: %w", pid, err)
	}
	defer ns.Close()
	return netns.Run(ns, fn)
}
