package swap

import (
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/criinfo"
	"github.com/inplaced/inplaced/pkg/runtimeclass"
)

func TestIdentityOf(t *testing.T) {
	ps := &runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{RuntimeHandler: "runsc", Network: &runtimeapi.PodSandboxNetworkStatus{Ip: "10.0.0.2"}},
		Info:   map[string]string{"info": `{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`},
	}
	want := sandboxIdentity{handler: "runsc", ip: "10.0.0.2", netns: "/var/run/netns/cni-1", pid: 42}
	if got := identityOf(ps.Status, criinfo.SandboxOf(ps.Info)); got != want {
		t.Errorf("identityOf = %+v, want %+v", got, want)
	}
	// A rebuilt sandbox process (a new sentry or VM) is a different identity.
	ps.Info["info"] = `{"pid":43,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/cni-1"}]}}}`
	if identityOf(ps.Status, criinfo.SandboxOf(ps.Info)) == want {
		t.Error("a new sandbox pid compares equal")
	}
}

// Whether a hold is tried follows the runtime class's network stack, the
// configured classes first.
func TestOwnNetworkStack(t *testing.T) {
	classes, err := runtimeclass.New([]runtimeclass.Class{
		{Handler: "runsc-hostnet", Enforcement: runtimeclass.SandboxCgroup, NetworkStack: runtimeclass.HostKernel},
		{Handler: "kata-fc", Enforcement: runtimeclass.SandboxCgroup},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{classes: classes}
	for _, c := range []struct {
		id   sandboxIdentity
		hold bool
	}{
		{sandboxIdentity{handler: ""}, true},
		{sandboxIdentity{handler: "runc"}, true},
		{sandboxIdentity{handler: "runsc"}, false},
		{sandboxIdentity{handler: "kata-qemu"}, false},
		{sandboxIdentity{handler: "", runtimeType: "io.containerd.runsc.v1"}, false},
		{sandboxIdentity{handler: "nvidia"}, true}, // unknown: the hold is tried
		{sandboxIdentity{handler: "runsc-hostnet", runtimeType: "io.containerd.runsc.v1"}, true},
		{sandboxIdentity{handler: "kata-fc"}, false},
	} {
		if why := e.ownNetworkStack(c.id); (why == "") != c.hold {
			t.Errorf("%+v: %q, want hold %v", c.id, why, c.hold)
		}
	}
}
