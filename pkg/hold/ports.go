package hold

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/inplaced/inplaced/pkg/internal/netns"
)

// Ports is what Discover found.
type Ports struct {
	// Hold are the ports to hold: Observed, plus Declared ports nobody else
	// listens on.
	Hold []uint16
	// Observed are ports a listening socket of the container's processes
	// is bound to in the pod netns: authoritative, declarations are
	// optional.
	Observed []uint16
	// Others are ports a socket outside the container listens on (another
	// container of the pod): never held, even when declared.
	Others []uint16
}

// Discover finds the TCP ports the container with process pids listens on
// in the network namespace at netnsPath. declared (the container's declared
// ports) is a hint: a declared port is held too unless another process of the
// netns listens on it.
func Discover(netnsPath string, pids []int, declared []uint16) (Ports, error) {
	ns, err := netns.Open(netnsPath)
	if err != nil {
		return Ports{}, err
	}
	defer ns.Close()
	var d *diag
	if err := netns.Run(ns, func() (err error) { d, err = newDiag(); return err }); err != nil {
		return Ports{}, err
	}
	defer d.close()
	ls, err := d.listeners()
	if err != nil {
		return Ports{}, err
	}
	return classify(ls, socketInodes(pids), declared), nil
}

// classify splits listeners into the container's (inode among mine) and
// the others', and adds declared ports nobody else has.
func classify(ls []listener, mine map[uint32]bool, declared []uint16) Ports {
	var p Ports
	for _, l := range ls {
		if mine[l.inode] {
			p.Observed = appendNew(p.Observed, l.port)
		} else {
			p.Others = appendNew(p.Others, l.port)
		}
	}
	// A port both the container and someone else listen on (SO_REUSEPORT
	// across containers) is not the container's alone: leave it.
	p.Observed = slices.DeleteFunc(p.Observed, func(port uint16) bool { return slices.Contains(p.Others, port) })
	p.Hold = append(p.Hold, p.Observed...)
	for _, port := range declared {
		if port != 0 && !slices.Contains(p.Others, port) {
			p.Hold = appendNew(p.Hold, port)
		}
	}
	slices.Sort(p.Hold)
	slices.Sort(p.Observed)
	slices.Sort(p.Others)
	return p
}

func appendNew(s []uint16, v uint16) []uint16 {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// socketInodes returns the inodes of the sockets the processes hold open.
// A process that went away meanwhile is skipped.
func socketInodes(pids []int) map[uint32]bool {
	out := map[uint32]bool{}
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			link, err := os.Readlink(filepath.Join(dir, e.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			if n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 32); err == nil {
				out[uint32(n)] = true
			}
		}
	}
	return out
}
