// Package swap is the in-place swap engine: it replaces a running
// container's process with one built from its recorded CRI configuration plus
// a change (image, env, command, args, resources), inside the same pod
// sandbox, so the network namespace, IP, volumes and cgroup parent stay.
//
// A swap is decided, then done: planFor returns its steps — name, journal
// step, action, undo — for each kind of swap, and run.execute carries any
// plan out. Each journaled step is written (fsync) before it starts. The
// steps of each kind, in brackets those a request adds (drain, post-start),
// may skip (pre-stop) or the pod and the engine's settings decide (hold:
// new connections wait for the new process), rendered from the planner
// (TestDocStepOrder fails when this list and the planner differ):
//
//	node-local (inplacectl swap):
//		pull → create-new → [pre-stop] → [hold] → stop-old → start-new → [post-start] → health-gate → commit
//	request on the pod (inplaced.io/swap):
//		pull → create-new → [drain] → [pre-stop] → [hold] → stop-old → start-new → [post-start] → health-gate → commit
//	env from pod metadata:
//		pull → create-new → [pre-stop] → [hold] → stop-old → start-new → health-gate → commit
//	revert (inplacectl revert):
//		pull → create-new → [pre-stop] → [hold] → stop-old → start-new → [post-start] → health-gate → commit
//	kubelet-driven (pod spec image):
//		pull → create-new → [hold] → stop-old → start-new → commit
//	node-local, overlap (inplaced.io/swap-strategy: overlap):
//		pull → create-new → start-new → handover → [post-start] → health-gate → [pre-stop] → stop-old → commit
//	request on the pod, overlap:
//		pull → create-new → start-new → handover → [post-start] → health-gate → [drain] → [pre-stop] → stop-old → commit
//	kubelet-driven, overlap:
//		pull → create-new → start-new → handover → stop-old → commit
//	overlap, after a handover that did not complete:
//		[drain] → [pre-stop] → [hold] → stop-old → health-gate → commit
//	kubelet-driven overlap, after a handover that did not complete:
//		[hold] → stop-old → commit
//	any failure after stop-old (not kubelet-driven):
//		rollback
//
// An overlap swap (strategy overlap: the request's, the pod's annotation
// inplaced.io/swap-strategy or --swap-strategy; see chooseStrategy) creates
// the new container with a bind trap (a seccomp profile naming the Taker's
// agent) and starts it while the old one runs: its bind() of a port the old
// container listens on gets the old listening socket (handover), so both
// accept from one socket; the old one is stopped only once the new one has
// passed its health gate, and until then every undo removes the new
// container. A handover that does not complete within the hold's limit
// (the new image never binds the port, or the socket cannot be shared)
// goes on as stop-first with the hold. The record says which strategy ran
// and why.
//
// The new container is created while the old one still runs (containerd
// starts no process before StartContainer), so creating it is not
// downtime. Nothing is touched before the pull has succeeded. Each step
// carries the undo that brings the pod back from where it leaves it: up to
// stop-old the new container is removed and the old one runs on; a failure
// after the old container was stopped rolls back: the new container is
// stopped and removed and the old configuration is created again (next
// attempt) and started — or, for a kubelet-driven swap, the new container
// is removed and kubelet's own create follows. After a crash, Recover reads
// the journal and converges each unfinished swap, decided then done too:
// planRecovery decides from the entry and what the runtime reports —
// forward when the new container exists and runs, back otherwise — and the
// same executor's actions carry the plan out. At every point a container
// name of a pod has a container that kubelet would adopt, or would recreate
// itself.
//
// The new container keeps every label and annotation kubelet set — in
// particular io.kubernetes.container.hash, so kubelet adopts it — with
// metadata.attempt and io.kubernetes.container.restartCount one higher and
// log_path <name>/<attempt>.log, exactly like a kubelet restart.
package swap
