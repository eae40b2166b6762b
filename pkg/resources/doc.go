// Package resources makes an in-place resize of a container's CPU and memory
// exact: after the runtime's CRI UpdateContainerResources it reads the
// container's cgroup and its pod cgroup back and repairs what the runtime did
// not apply, in an order the kernel accepts, all or nothing.
//
// # Use
//
//	m, err := resources.New(resources.DefaultRoot)
//	t := resources.Target{CgroupsPath: spec.Linux.CgroupsPath, Driver: resources.DriverSystemd}
//	prev := resources.LimitsFromCRI(statusBefore.GetResources().GetLinux()) // optional
//	// runtime.UpdateContainerResources(ctx, req) first, then:
//	res, err := m.Apply(ctx, t, resources.LimitsFromCRI(req.GetLinux()), &prev)
//
// Read returns both cgroups' values and memory usage; Plan is the pure part
// of Apply (the ordered list of writes), for tests and dry runs.
//
// # Layout
//
// cgroup v1 (one mount per controller, a hybrid host counts as v1):
//
//	<root>/cpu/<cgroup>/cpu.cfs_quota_us, cpu.cfs_period_us, cpu.shares
//	<root>/memory/<cgroup>/memory.limit_in_bytes, memory.memsw.limit_in_bytes, memory.usage_in_bytes
//
// cgroup v2 (one unified hierarchy, v2 when <root>/cgroup.controllers exists):
//
//	<root>/<cgroup>/cpu.max ("<quota|max> <period>"), cpu.weight, memory.max, memory.current
//
// <cgroup> comes from the OCI spec's linux.cgroupsPath: as is for the
// cgroupfs driver ("/kubepods/burstable/pod<uid>/<id>"); expanded for the
// systemd driver ("kubepods-burstable-pod<uid>.slice:cri-containerd:<id>" is
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope").
// The pod cgroup is the container cgroup's parent.
//
// # Order
//
// Memory first, then the CPU limit, then the CPU request, as kubelet does.
// For each, a pod value that goes up is written before the container's and one
// that goes down after it: the v1 kernel refuses a child CPU quota above its
// parent's (EINVAL, seen with containerd on this project's machines), and a
// container memory limit above the pod's would not be the limit in effect.
// On v1, memory.memsw.limit_in_bytes (which containerd sets equal to the
// memory limit) moves with the memory limit, before it on a raise and after
// it on a lowering, because the kernel refuses a memory limit above memsw.
// Quota and period of one v1 cgroup are ordered so that the rate in between
// never exceeds the larger of the old and new rates.
//
// # The pod rule
//
// kubelet sets a pod's limit to the sum of its containers' limits (its
// request to the sum of their requests). Resizing one container must move
// the pod by that container's change and nothing else, so siblings keep
// their room:
//
//	pod' = pod + (want - from), never below want
//
// where from is the container's value before the resize: prev when the
// caller passes it (exact), otherwise what the container's cgroup has when
// Apply reads it. Without prev the rule degrades gracefully: if the runtime
// failed to apply a value (the usual v1 CPU raise), the container still
// has the old value and the delta is exact; if the runtime did apply it,
// the delta is 0 and the pod is only raised to the container's new limit
// when that would exceed it. The floor ("never below want") is what keeps a
// pod from sitting under its own container whatever the history.
//
// Special cases: an unlimited pod stays unlimited; a container that becomes
// unlimited makes its pod unlimited (a sum with ∞ in it); a container that was
// unlimited and gets a limit leaves the pod as it is, floor aside, because
// the other terms of the sum are not known here. CPU quota is compared as a
// rate in the pod's own period, which this package never changes. The CPU
// request (shares, weight) moves by the same delta with no floor. A memory
// lowering to or below usage is refused (ErrBelowUsage), for the container
// and for the pod, before anything is written, as kubelet refuses it.
//
// Apply with prev is not idempotent for the pod: after a success, running it
// again would move the pod a second time. After a failure everything was
// restored, so retrying with the same prev is safe; a reconciliation that
// does not know whether an earlier Apply succeeded passes nil.
//
// # cpu.weight
//
// v1 shares become v2 weight with the linear formula kubelet uses for pod
// cgroups (SharesToWeight). Newer runc and the containerd cgroups library
// use a quadratic mapping for containers; a container weight that matches
// either formula counts as applied and is left alone, so we never fight the
// runtime over its own choice.
//
// # Why files and not the containerd cgroups library's Update/Stat
//
// The library (github.com/containerd/cgroups/v3) detects the host's cgroup
// mode (cgroups.Mode, used for DefaultRoot). Its cpu.max format
// (cgroup2.NewCPUMax) and its shares-to-weight conversion
// (cgroup2.ConvertCPUSharesToCgroupV2Value) are copied here as newCPUMax and
// sharesToWeightQuadratic rather than called: importing package cgroup2
// links its Manager and with it github.com/cilium/ebpf into inplaced (1.5 MB
// of binary, 0.2 to 0.8 MB of resident memory at start), and a test keeps
// the copies equal to the library's. Its Update and Stat are not used,
// because:
//   - Update writes several files in its own order (v1 cpu: shares, period,
//     quota) with os.WriteFile, and stops at the first error without saying
//     which files it had changed, so it can neither follow the pod/container
//     order above nor be undone exactly.
//   - it writes through the os package, so a test cannot make the N-th write
//     fail, and a fake tree must contain every file its Stat opens.
//   - Stat does not report CPU quota, period or shares, and its v2 reader
//     returns 0 for an unreadable memory.current, which would let a lowering
//     pass the usage check.
//
// So every read and write goes through the FS interface (OSFS on a host, a
// wrapper or fake in tests), one file at a time, each write read back.
//
// # Concurrency
//
// A Manager serialises its Applies: two containers of one pod share the pod
// cgroup, and the pod rule reads and then writes it. Other writers (kubelet
// resizing the pod itself) are not locked out; each write re-reads its file
// first so an undo restores what was really there.
package resources
