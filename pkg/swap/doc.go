// Package swap is the in-place swap engine: it replaces a running
// container's process with one built from its recorded CRI configuration plus
// a change (image, env, command, args, resources), inside the same pod
// sandbox, so the network namespace, IP, volumes and cgroup parent stay.
//
// A swap runs these steps; each is journaled (fsync) before it starts:
//
//	validate → pull → pre-stop → stop-old → create-new → start-new →
//	post-start → health-gate → commit | rollback
//
// Nothing is touched before the pull has succeeded. A failure after the old
// container was stopped rolls back: the new container is stopped and
// removed and the old configuration is created again (next attempt) and
// started. After a crash, Recover reads the journal and converges each
// unfinished swap: forward when the new container exists and runs, back
// otherwise. At every point a container name of a pod has a container that
// kubelet would adopt, or would recreate itself.
//
// The new container keeps every label and annotation kubelet set — in
// particular io.kubernetes.container.hash, so kubelet adopts it — with
// metadata.attempt and io.kubernetes.container.restartCount one higher and
// log_path <name>/<attempt>.log, exactly like a kubelet restart.
package swap
