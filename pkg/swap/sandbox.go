package swap

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

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

// sandboxVerbose is the part of containerd's verbose PodSandboxStatus info
// the identity uses; other runtimes leave it empty.
type sandboxVerbose struct {
	Pid         int    `json:"pid"`
	RuntimeType string `json:"runtimeType"`
	RuntimeSpec struct {
		Linux struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

func identityOf(ps *runtimeapi.PodSandboxStatusResponse) sandboxIdentity {
	id := sandboxIdentity{handler: ps.GetStatus().GetRuntimeHandler(), ip: ps.GetStatus().GetNetwork().GetIp()}
	var v sandboxVerbose
	if raw, ok := ps.GetInfo()["info"]; ok && json.Unmarshal([]byte(raw), &v) == nil {
		id.pid, id.runtimeType = v.Pid, v.RuntimeType
		for _, ns := range v.RuntimeSpec.Linux.Namespaces {
			if ns.Type == "network" {
				id.netns = ns.Path
			}
		}
	}
	return id
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
	return identityOf(ps) == before
}

// builtinClasses is the runtime class table without the config file's
// entries: a handler's class decides here only whether the sandbox has a
// network stack of its own, which no resize setting changes.
var builtinClasses, _ = runtimeclass.New(nil)

// ownNetworkStack says why a connection hold cannot work in this sandbox,
// or "" when it can. gVisor's sentry runs its own TCP/IP stack and a Kata
// VM its own kernel: their listening sockets are not sockets of the pod's
// network namespace, so a hold there could never see the new process
// listen and would only run to its limit.
func ownNetworkStack(id sandboxIdentity) string {
	c := builtinClasses.Lookup(id.handler, id.runtimeType)
	switch c.Enforcement {
	case runtimeclass.SandboxCgroup, runtimeclass.VM:
		return fmt.Sprintf("off: runtime handler %q (%s) runs its own network stack inside the sandbox, whose listeners a hold in the pod's network namespace cannot see", id.handler, c.Enforcement)
	}
	return ""
}
