// Package takeover hands the listening sockets of a container that is
// being replaced to its replacement, in the same pod network namespace, so
// that the two accept from one kernel socket for the overlap and the
// socket never closes: no connection is refused, none waits, and stopping
// the new container rolls the swap back.
//
// The new container is created with a seccomp profile (Profile: the pod's
// own rules plus a notify rule on bind and listenerPath naming the Agent's
// unix socket). runc connects to that socket when the container starts,
// and again on every runc exec, and sends the container's state (JSON)
// with the filter's notify fd. From then on every bind() in the container
// waits for the agent's answer:
//
//   - a bind of a port the old container listens on (Register names it,
//     by its init's pid) is answered by installing the old listening
//     socket at the new process's socket's fd number and returning 0: the
//     app's own socket is replaced, and its listen() on the listening
//     socket only sets the backlog;
//   - any other bind continues in the kernel as if there were no filter;
//   - a bind of such a port that cannot be handed over (another address,
//     V6ONLY or blocking mode, a privileged port the new process could not
//     bind itself) waits until the old container no longer listens on it
//     or the registration's deadline, then continues: the swap falls back
//     to stopping the old container first.
//
// Why a handover needs those checks: the new process gets the old socket's
// open file description, with its flags (O_NONBLOCK: a blocking and a
// non-blocking app cannot share one), its options, its cgroup data and
// its security label; options the new app set before bind() were on the
// socket that is discarded. The new process's own permission to bind a
// privileged port is checked because installing a socket skips it.
//
// A swap's part, as the engine drives it:
//
//	b, err := takeover.Profile(takeover.RuntimeDefault(boundingCaps), agentSocket, swapID)
//	// b is the new container's Localhost seccomp profile
//	err = agent.Register(takeover.Old{Swap: swapID, Pid: oldInitPid, Deadline: deadline})
//	// create and start the new container; Config.OnEvent reports
//	// HandedOver per port, or Refused (the swap falls back)
//	agent.Unregister(swapID) // committed or rolled back: later binds pass
//
// A bind costs one sock_diag dump of the pod's network namespace unless
// something listens on its port; only then are the old container's
// processes' fds looked at.
//
// The filter cannot be removed from a process. When every copy of its
// notify fd is closed (the agent died), each later bind() in that
// container fails with ENOSYS, and runc exec into it fails while nothing
// listens on the agent's socket ("failed to connect with seccomp agent").
// A restarted agent gets no fd for running containers, only for new ones
// and new execs: the fds must outlive the agent. File and Files return
// copies named after whose they are (container, swap), for systemd's fd
// store; Adopt serves one again after a restart; Detach hands them all to
// an agent taking over in the same process. While no agent reads a kept
// fd, the container's binds wait.
//
// Kernel 5.9 or later (SECCOMP_ADDFD_FLAG_SETFD; pidfd_getfd 5.6,
// SECCOMP_USER_NOTIF_FLAG_CONTINUE 5.5), runc 1.1 or later built with
// libseccomp 2.5 or later, and the agent as root in the host's PID
// namespace: the notification's pid is a pid of the receiver's namespace.
// Runtimes whose containers' syscalls never reach the host kernel's
// seccomp (gVisor, Kata) cannot be trapped.
package takeover
