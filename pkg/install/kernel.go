package install

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/inplaced/inplaced/pkg/hold"
	"github.com/inplaced/inplaced/pkg/internal/mountinfo"
)

// HostKernel looks at the host through its /proc (the pod's own with
// hostPID): every process's network namespace, and PID 1's mounts.
type HostKernel struct {
	Proc string
}

var _ Kernel = HostKernel{}

// RemoveHoldTables walks every network namespace a process is in (pods'
// included) and deletes the connection hold's tables there. A stopped
// inplaced leaves none (the tables carry the owner flag); a kernel older
// than 5.12 has no such flag and keeps a killed inplaced's.
func (k HostKernel) RemoveHoldTables(ctx context.Context) ([]string, error) {
	es, err := os.ReadDir(k.Proc)
	if err != nil {
		return nil, err
	}
	seen := map[uint64]bool{}
	var found []string
	var errs []error
	for _, e := range es {
		if _, err := strconv.Atoi(e.Name()); err != nil || ctx.Err() != nil {
			continue
		}
		ns := filepath.Join(k.Proc, e.Name(), "ns", "net")
		var st syscall.Stat_t
		if err := syscall.Stat(ns, &st); err != nil || seen[st.Ino] {
			continue // gone meanwhile, or a namespace already seen
		}
		seen[st.Ino] = true
		removed, err := hold.Remove(ns)
		for _, t := range removed {
			found = append(found, fmt.Sprintf("%s (network namespace of pid %s)", t, e.Name()))
		}
		errs = append(errs, err)
	}
	return found, errors.Join(append(errs, ctx.Err())...)
}

// Mounts lists PID 1's mounts at or under paths.
func (k HostKernel) Mounts(_ context.Context, paths []string) ([]string, error) {
	f, err := os.Open(filepath.Join(k.Proc, "1", "mountinfo"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := mountinfo.Unescape(fields[4])
		for _, p := range paths {
			if mp == p || strings.HasPrefix(mp, p+"/") {
				out = append(out, mp)
			}
		}
	}
	return out, sc.Err()
}
