package swap

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
)

// sandboxIdentity is what an in-place swap must leave as it found it: the
// sandbox's IP, network namespace and, where the runtime reports one, its
// process (the pause process under runc, the sentry under gVisor, the VMM
// under Kata: a sandboxed runtime that rebuilt its sandbox would change it).
type sandboxIdentity struct {
	handler     string
	runtimeType string // containerd's, e.g. io.containerd.runsc.v1
	ip          string
	netns       string
	pid         int
}

// identityOf is the identity of a sandbox from its status and containerd's
// verbose info about it (other runtimes give none: IP and handler only).
func identityOf(st *runtimeapi.PodSandboxStatus, info criinfo.Sandbox) sandboxIdentity {
	return sandboxIdentity{handler: st.GetRuntimeHandler(), ip: st.GetNetwork().GetIp(),
		runtimeType: info.RuntimeType(), netns: info.NetNS(), pid: info.Pid()}
}

// netnsPath names the sandbox's network namespace, where the connection
// hold goes: the one its runtime spec names, else its process's; "" when
// neither is known.
func (id sandboxIdentity) netnsPath() string {
	switch {
	case id.netns != "":
		return id.netns
	case id.pid > 0:
		return fmt.Sprintf("/proc/%d/ns/net", id.pid)
	}
	return ""
}

// sandboxKept reads the sandbox again: kept means still READY with the same
// identity. A sandbox that cannot be read was not shown to be kept.
func (e *Engine) sandboxKept(sandboxID string, before sandboxIdentity) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps, err := e.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID, Verbose: true})
	if err != nil || ps.GetStatus().GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		return false
	}
	return identityOf(ps.GetStatus(), criinfo.SandboxOf(ps.GetInfo())) == before
}

// ownNetworkStack says why a connection hold cannot work in this sandbox,
// or "" when it can. gVisor's sentry runs its own TCP/IP stack and a Kata
// VM its own kernel: their listening sockets are not sockets of the pod's
// network namespace, so a hold there could never see the new process
// listen and would only run to its limit.
func (e *Engine) ownNetworkStack(id sandboxIdentity) string {
	c := e.classes.Lookup(id.handler, id.runtimeType)
	if !c.OwnNetworkStack() {
		return ""
	}
	return fmt.Sprintf("off: runtime handler %q runs its own network stack inside the sandbox, whose listeners a hold in the pod's network namespace cannot see "+
		"(runtime class: %s; a handler whose sockets live on the host kernel is declared in runtimeClasses with networkStack: %s)",
		id.handler, c.Source, runtimeclass.HostKernel)
}
