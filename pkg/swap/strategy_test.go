package swap

import (
	"fmt"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/runtimeclass"
	"github.com/inplaced/inplaced/pkg/strategy"
)

func class(t *testing.T, handler string) runtimeclass.Class {
	t.Helper()
	tb, err := runtimeclass.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return tb.Lookup(handler, "")
}

// A pod without the annotation and a gVisor pod with it get today's plan,
// byte for byte, for every kind of swap: the strategy decided as a swap
// decides it, then planned.
func TestStrategyKeepsTodaysPlan(t *testing.T) {
	overlap := map[string]string{strategy.Annotation: "overlap"}
	for _, k := range planKinds {
		if k.spec.overlap {
			continue
		}
		today := fmt.Sprintf("%#v", planFor(k.spec))
		for _, tc := range []struct {
			what        string
			annotations map[string]string
			handler     string
			node        strategy.Strategy
		}{
			{"no annotation, runc", nil, "runc", strategy.StopFirst},
			{"no annotation, default handler", nil, "", strategy.StopFirst},
			{"gVisor with the annotation", overlap, "runsc", strategy.StopFirst},
			{"gVisor, the node's default overlap", nil, "runsc", strategy.Overlap},
			{"annotation stop-first, the node's default overlap", map[string]string{strategy.Annotation: "stop-first"}, "runc", strategy.Overlap},
		} {
			s, why := decideStrategy(strategyInput{annotations: tc.annotations, node: tc.node, kind: k.spec.kind,
				class: class(t, tc.handler), handler: tc.handler, config: &runtimeapi.ContainerConfig{}})
			spec := k.spec
			spec.overlap = s == strategy.Overlap
			if got := fmt.Sprintf("%#v", planFor(spec)); got != today {
				t.Errorf("%s, %s: strategy %s (%s): the plan is not today's:\n%s\nwant\n%s", k.name, tc.what, s, why, got, today)
			}
			if tc.handler == "runsc" && !strings.Contains(why, "runtime runsc has no host-side seccomp") {
				t.Errorf("%s, %s: why %q does not say why gVisor cannot overlap", k.name, tc.what, why)
			}
		}
	}
}

func TestDecideStrategy(t *testing.T) {
	runc := class(t, "runc")
	plain := &runtimeapi.ContainerConfig{}
	privileged := &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{
		SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}}
	for _, tc := range []struct {
		what      string
		in        strategyInput
		want      strategy.Strategy
		whyPrefix string
	}{
		{"the node's default", strategyInput{node: strategy.StopFirst}, strategy.StopFirst, "the node's default"},
		{"the annotation", strategyInput{annotations: map[string]string{strategy.Annotation: " Overlap"}, node: strategy.StopFirst},
			strategy.Overlap, "asked for by the pod's annotation"},
		{"the request wins over the annotation", strategyInput{requested: "stop-first", annotations: map[string]string{strategy.Annotation: "overlap"}},
			strategy.StopFirst, "asked for by the request"},
		{"a bad annotation is ignored, saying so", strategyInput{annotations: map[string]string{strategy.Annotation: "blue-green"}, node: strategy.Overlap},
			strategy.Overlap, `the node's default (--swap-strategy); annotation inplaced.io/swap-strategy="blue-green" ignored: use stop-first or overlap`},
		{"kubelet-driven", strategyInput{annotations: map[string]string{strategy.Annotation: "overlap"}, kind: KindKubelet, config: plain},
			strategy.Overlap, "asked for by the pod's annotation"},
		{"agent not running", strategyInput{requested: "overlap", kind: KindSwap, agent: "listen: permission denied"}, strategy.StopFirst,
			"overlap asked for by the request, not possible: agent not running: listen: permission denied"},
		{"privileged", strategyInput{requested: "overlap", kind: KindSwap, config: privileged}, strategy.StopFirst,
			"overlap asked for by the request, not possible: the container is privileged"},
		{"possible", strategyInput{requested: "overlap", kind: KindSwap, config: plain}, strategy.Overlap, "asked for by the request"},
	} {
		if tc.in.class == (runtimeclass.Class{}) {
			tc.in.class = runc
		}
		s, why := decideStrategy(tc.in)
		if s != tc.want || !strings.HasPrefix(why, tc.whyPrefix) {
			t.Errorf("%s: %s (%s), want %s (%s…)", tc.what, s, why, tc.want, tc.whyPrefix)
		}
	}
}

func TestMemoryFits(t *testing.T) {
	const mi = 1 << 20
	for _, tc := range []struct {
		pod, running, own int64
		ok                bool
	}{
		{0, 0, 0, true},               // no pod limit
		{0, 100 * mi, 100 * mi, true}, // no pod limit
		{256 * mi, 100 * mi, 100 * mi, true},
		{200 * mi, 100 * mi, 100 * mi, true},
		{199 * mi, 100 * mi, 100 * mi, false},
		{128 * mi, 64 * mi, 0, false}, // the container has no limit of its own
	} {
		why := memoryFits(tc.pod, tc.running, tc.own)
		if (why == "") != tc.ok || (!tc.ok && !strings.HasPrefix(why, "pod limits do not hold both containers")) {
			t.Errorf("memoryFits(%d, %d, %d) = %q, want fits %v", tc.pod, tc.running, tc.own, why, tc.ok)
		}
	}
}

func TestSeccompBase(t *testing.T) {
	sc := func(s *runtimeapi.LinuxContainerSecurityContext) *runtimeapi.ContainerConfig {
		return &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: s}}
	}
	for _, tc := range []struct {
		what string
		cfg  *runtimeapi.ContainerConfig
		kind runtimeapi.SecurityProfile_ProfileType
		path string
		caps string // a capability that must (+) or must not (-) be in the set
	}{
		{"none: unconfined", &runtimeapi.ContainerConfig{}, runtimeapi.SecurityProfile_Unconfined, "", ""},
		{"RuntimeDefault", sc(&runtimeapi.LinuxContainerSecurityContext{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}}),
			runtimeapi.SecurityProfile_RuntimeDefault, "", "+CAP_NET_BIND_SERVICE"},
		{"RuntimeDefault, NET_BIND_SERVICE dropped, SYS_ADMIN added", sc(&runtimeapi.LinuxContainerSecurityContext{
			Seccomp:      &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
			Capabilities: &runtimeapi.Capability{AddCapabilities: []string{"SYS_ADMIN"}, DropCapabilities: []string{"NET_BIND_SERVICE"}}}),
			runtimeapi.SecurityProfile_RuntimeDefault, "", "-CAP_NET_BIND_SERVICE"},
		{"RuntimeDefault, ALL dropped", sc(&runtimeapi.LinuxContainerSecurityContext{
			Seccomp:      &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault},
			Capabilities: &runtimeapi.Capability{DropCapabilities: []string{"ALL"}}}),
			runtimeapi.SecurityProfile_RuntimeDefault, "", "-CAP_CHOWN"},
		{"Localhost", sc(&runtimeapi.LinuxContainerSecurityContext{Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost, LocalhostRef: "/p.json"}}),
			runtimeapi.SecurityProfile_Localhost, "/p.json", ""},
		{"the deprecated path, runtime/default", sc(&runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "runtime/default"}),
			runtimeapi.SecurityProfile_RuntimeDefault, "", "+CAP_KILL"},
		{"the deprecated path, localhost/", sc(&runtimeapi.LinuxContainerSecurityContext{SeccompProfilePath: "localhost//etc/p.json"}),
			runtimeapi.SecurityProfile_Localhost, "/etc/p.json", ""},
	} {
		b, err := seccompBase(tc.cfg)
		if err != nil || b.Kind != tc.kind || b.Path != tc.path {
			t.Errorf("%s: %+v, %v; want %s %q", tc.what, b, err, tc.kind, tc.path)
			continue
		}
		if tc.caps != "" {
			has := false
			for _, c := range b.Capabilities {
				has = has || c == tc.caps[1:]
			}
			if has != (tc.caps[0] == '+') {
				t.Errorf("%s: capabilities %v, want %s", tc.what, b.Capabilities, tc.caps)
			}
		}
	}
	if _, err := seccompBase(&runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
		Seccomp: &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Localhost}}}}); err == nil {
		t.Error("a Localhost profile with no file was taken")
	}
}
