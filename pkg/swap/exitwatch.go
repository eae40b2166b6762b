package swap

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// exitWatch tells when the old container's processes are gone, which can be
// well before containerd answers its StopContainer: containerd answers only
// after it has torn the task down (the shim's delete, the rootfs unmount,
// the cgroup's removal), measured at 250–450 ms on this project's CI
// machines, and none of that concerns the new container, which has its own
// rootfs and cgroup and shares only the sandbox's namespaces. Once the old
// processes are gone their sockets are closed, so the new container can
// bind the same ports.
//
// It needs inplaced in the host's PID namespace (as a node daemon runs) and
// the runtime's verbose status naming the task's pid (containerd does);
// without either there is no watch and the swap waits for the stop's
// answer, as before.
type exitWatch struct {
	pidfd int
	// procs is the container cgroup's process list: empty once every
	// process is gone (a container in the pod's shared PID namespace can
	// leave children behind its init for a moment).
	procs string
}

// watchExit opens a watch on container id's main process, or returns nil
// when it cannot (no pid in the status, another PID namespace, the process
// already gone or not the container's).
func watchExit(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) *exitWatch {
	st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil || st.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if json.Unmarshal([]byte(st.GetInfo()["info"]), &info) != nil || info.Pid <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(info.Pid, 0)
	if err != nil {
		return nil
	}
	// The pidfd pins this process, not whatever gets the number later; the
	// process is the container's if its cgroup path names the container.
	procs := cgroupProcs(info.Pid, id)
	if procs == "" {
		unix.Close(fd)
		return nil
	}
	return &exitWatch{pidfd: fd, procs: procs}
}

// cgroupProcs is the cgroup.procs file of pid's cgroup, if that cgroup's
// path names container id ("" otherwise). v2's unified line, else v1's
// pids or memory controller.
func cgroupProcs(pid int, id string) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	var v2, v1 string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], id) {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = filepath.Join("/sys/fs/cgroup", parts[2], "cgroup.procs")
		case v1 == "" && (parts[1] == "pids" || strings.Contains(parts[1], "memory")):
			v1 = filepath.Join("/sys/fs/cgroup", parts[1], parts[2], "cgroup.procs")
		}
	}
	for _, p := range []string{v2, v1} {
		if p != "" {
			if _, err := os.Stat(p); err == nil {
				return p
			}
		}
	}
	return ""
}

// wait returns true once the process has exited and its cgroup holds no
// process, false if done is closed first (the stop answered: nothing to
// gain any more).
func (w *exitWatch) wait(done <-chan struct{}) bool {
	fds := []unix.PollFd{{Fd: int32(w.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 5)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 {
			break
		}
		select {
		case <-done:
			return false
		default:
		}
	}
	for {
		b, err := os.ReadFile(w.procs)
		if errors.Is(err, os.ErrNotExist) || (err == nil && len(strings.TrimSpace(string(b))) == 0) {
			return true
		}
		if err != nil {
			return false
		}
		select {
		case <-done:
			return false
		case <-time.After(time.Millisecond):
		}
	}
}

func (w *exitWatch) close() { unix.Close(w.pidfd) }
