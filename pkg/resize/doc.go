// Package resize changes a running container's CPU and memory limits in
// place, exactly and all or nothing. It serves two callers:
//
//   - the control API (inplacectl resize), through Resizer.Resize, and
//   - kubelet's own in-place resize (KEP-1287), through
//     Resizer.UpdateContainerResources, installed as the relay's interceptor
//     for CRI UpdateContainerResources.
//
// # Why more than the runtime's UpdateContainerResources
//
// containerd's UpdateContainerResources runs `runc update` with the whole
// resource set. On cgroup v1 runc writes memory before CPU and stops at the
// first error, so a CPU quota above the pod cgroup's quota fails with EINVAL
// after the memory limit has already changed: the runtime neither raises the
// pod nor undoes what it did. Package resources knows the order the kernel
// accepts; this package wraps the runtime call with it.
//
// # The cgroup method (runc sandboxes)
//
//  1. Read the container's and the pod's cgroups (resources.Manager.Read).
//  2. Refuse, before anything changes, what kubelet refuses: a memory limit
//     at or below current usage (errkind.Refused — FailedPrecondition at the edge —, stating usage and
//     the requested limit), and values the kernel would reject
//     (errkind.Invalid).
//  3. resources.Manager.Apply raises the pod cgroup where the container's new
//     values need room (pod first on a raise), then calls the runtime's
//     UpdateContainerResources, so that its own record (the container spec
//     containerd reports in ContainerStatus) follows and it changes the
//     container itself, then writes whatever the runtime did not apply and
//     lowers the pod (container first on a lowering), memory before CPU, each
//     write read back, its own writes undone on failure. With the systemd
//     cgroup driver each write also sets the unit's property, as runc does.
//  4. Whether or not the runtime succeeded, the files are repaired in 3.
//  5. Read back once more: the container's cgroup must have exactly the
//     request, and the pod cgroup at least that.
//  6. If the runtime had failed in step 3 (the pod was too small), call it
//     again now that the pod has room: it succeeds and its record matches
//     the cgroups. If that second call fails the cgroups still have the
//     request; the record's error says the backend's record lags.
//
// If step 4 or 5 fails, everything is put back: the runtime is asked for the
// previous values (it may have changed some before failing), then Apply
// repairs the cgroups to them, leaving the pod as it was. The answer is
// errkind.Aborted when the previous values are in effect again, errkind.Internal
// when they could not all be restored; either way the message states what is
// in effect, and the ResizeRecord rides along as a status detail.
//
// Once the runtime has been called, the caller's cancellation no longer stops
// the resize: a half-done resize is worse than a late answer.
//
// # The pod rule, per caller
//
// The control API moves the pod cgroup by the container's change (prev,
// see package resources), counting the container for no less than the
// limits kubelet creates it with (its recorded create, moved by kubelet's
// own resizes since): kubelet does not know of the control API's resize and
// creates the container again (a restart, a swap's new container) with its
// own limits, which cgroup v1 refuses above the pod's CPU quota. A lowering
// under those limits leaves the pod where it is (podPrev). kubelet resizes the
// pod cgroup itself, before (raise) or after (lowering) its
// UpdateContainerResources, so for kubelet's calls the pod is only raised
// when it would sit below the container (prev = nil), and only the
// container's usage is checked: kubelet checks the pod's before it lowers it.
//
// # The backend method (VM sandboxes)
//
// For sandboxes whose runtime handler is a VM (Kata: host cgroups do not
// reach the guest), for containers whose runtime does not expose a
// cgroupsPath, and for running containers whose cgroup inplaced cannot see
// (its own cgroup namespace), the resize goes through the runtime only and is verified
// through ContainerStatus resources; the record says method "backend". The
// usage check uses CRI ContainerStats when the runtime reports memory.
//
// # Records
//
// Every resize of a resolved container, refused, failed or applied, is
// stored (store.PutResize) with the caller's uid and pid (none for kubelet),
// the values before (from), the request (to), what is in effect, the method,
// the cgroup files inplaced wrote itself (repaired) and the duration.
// kubelet's UpdateContainerResources calls that change no CPU or memory limit
// (cpuset updates of the CPU manager) are passed through and not recorded.
package resize
