package criinfo

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func fixture(t *testing.T, backend, name string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", backend, name))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"info": string(b)}
}

// Every accessor against what containerd 1.6 and 2.4 wrote for the same
// pod (testdata/README.md).
func TestContainerd(t *testing.T) {
	for _, tc := range []struct {
		backend            string
		pid, sandboxPid    int
		sandboxID          string
		containerCgroupDir string // the last element of the cgroups path is the container ID
		netns              string
	}{
		{"containerd-1.6", 22890, 22847, "3f40d9295ac77fadbb54c5d2b0538c5b017ffd6c703378487adff73bb144ca70",
			"/inplaced-test/web/39fbe5c41f4422b6d3a0572c47411b79664a33165a948aa97937deac5e3bf000",
			"/tmp/ipd1006733629/state/io.containerd.grpc.v1.cri/netns/cni-c532fd83-4ac7-4098-af36-b1ab08bc2fd1"},
		{"containerd-2.4", 22651, 22619, "444ea85e759bc30ef291e23848a61523473fa892691719d75583eb2edffc7674",
			"/inplaced-test/web/5109548d8020db54130c690bac2c424787e1ffc6a148f68ac6604a6fed763916",
			"/tmp/ipd641282790/state/io.containerd.grpc.v1.cri/netns/cni-80b5bf6f-727a-d411-f018-1da929293747"},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			c := ContainerOf(fixture(t, tc.backend, "container.json"))
			if c.Err() != nil {
				t.Fatal(c.Err())
			}
			if c.Pid() != tc.pid || c.SandboxID() != tc.sandboxID || c.RuntimeType() != "io.containerd.runc.v2" || c.CgroupsPath() != tc.containerCgroupDir {
				t.Errorf("container: pid %d, sandbox %s, runtime type %s, cgroups path %s", c.Pid(), c.SandboxID(), c.RuntimeType(), c.CgroupsPath())
			}
			want := &runtimeapi.LinuxContainerResources{CpuShares: 204, CpuQuota: 20000, CpuPeriod: 100000, MemoryLimitInBytes: 48 << 20}
			if got := c.Limits(); !proto.Equal(got, want) {
				t.Errorf("limits = %v, want %v", got, want)
			}
			cfg, err := c.Config()
			if err != nil {
				t.Fatal(err)
			}
			if got := envString(cfg.Envs); got != "MODE=old,EMPTY=,B64LIKE=b2xk" {
				t.Errorf("envs = %q: a value that happens to be base64 must stay as written", got)
			}
			if cfg.GetMetadata().GetName() != "app" || cfg.GetMetadata().GetAttempt() != 2 || cfg.GetLogPath() != "app/2.log" ||
				cfg.GetAnnotations()["io.kubernetes.container.ports"] != `[{"containerPort":8080,"protocol":"TCP"}]` ||
				cfg.GetLabels()["io.kubernetes.container.name"] != "app" {
				t.Errorf("config = %v", cfg)
			}
			if r := cfg.GetLinux().GetResources(); !proto.Equal(r, want) {
				t.Errorf("config resources = %v, want %v", r, want)
			}

			s := SandboxOf(fixture(t, tc.backend, "sandbox.json"))
			if s.Err() != nil {
				t.Fatal(s.Err())
			}
			if s.Pid() != tc.sandboxPid || s.RuntimeType() != "io.containerd.runc.v2" || s.NetNS() != tc.netns {
				t.Errorf("sandbox: pid %d, runtime type %s, netns %s", s.Pid(), s.RuntimeType(), s.NetNS())
			}
			sb, err := s.Config()
			if err != nil {
				t.Fatal(err)
			}
			oh := &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 25000, MemoryLimitInBytes: 160 << 20}
			if !proto.Equal(sb.GetLinux().GetOverhead(), oh) || sb.GetMetadata().GetName() != "web" ||
				sb.GetAnnotations()["inplaced.io/connection-hold"] != "queue" || sb.GetLinux().GetCgroupParent() != "/inplaced-test/web" {
				t.Errorf("sandbox config = %v", sb)
			}
		})
	}
}

// What is missing or malformed reads as the zero value, and Err or Config
// says why.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		info      map[string]string
		err       error  // of Err
		configErr string // of Config, when Err is nil
	}{
		{"no info", nil, ErrNoInfo, ""},
		{"other keys only", map[string]string{"pid": "1"}, ErrNoInfo, ""},
		{"empty", map[string]string{"info": ""}, ErrNoInfo, ""},
		{"not json", map[string]string{"info": "{"}, errors.New("decode verbose info"), ""},
		{"no config", map[string]string{"info": `{"pid": 1}`}, nil, ErrNoConfig.Error()},
		{"null config", map[string]string{"info": `{"config": null}`}, nil, ErrNoConfig.Error()},
		{"config of a bad shape", map[string]string{"info": `{"pid": 7, "config": {"metadata": "x"}}`}, nil, "decode config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := ContainerOf(tc.info), SandboxOf(tc.info)
			for _, err := range []error{c.Err(), s.Err()} {
				switch {
				case tc.err == nil && err != nil:
					t.Errorf("Err = %v, want none", err)
				case tc.err == ErrNoInfo && !errors.Is(err, ErrNoInfo):
					t.Errorf("Err = %v, want ErrNoInfo", err)
				case tc.err != nil && (err == nil || !strings.Contains(err.Error(), tc.err.Error())):
					t.Errorf("Err = %v, want %v", err, tc.err)
				}
			}
			_, cerr := c.Config()
			_, serr := s.Config()
			for _, err := range []error{cerr, serr} {
				want := tc.configErr
				if tc.err != nil {
					want = tc.err.Error()
				}
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Config: %v, want %q", err, want)
				}
			}
			if tc.err != nil && (c.Pid() != 0 || s.Pid() != 0 || c.Limits() != nil || s.NetNS() != "") {
				t.Errorf("unreadable info gave values: pid %d/%d, limits %v, netns %q", c.Pid(), s.Pid(), c.Limits(), s.NetNS())
			}
		})
	}
	// A config this build cannot decode hides nothing else.
	if c := ContainerOf(map[string]string{"info": `{"pid": 7, "config": {"metadata": "x"}}`}); c.Pid() != 7 {
		t.Errorf("pid = %d beside a bad config, want 7", c.Pid())
	}
}

// The spec's resources: limits as set, nil when there are none, zero for a
// resource the spec leaves out.
func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		name, info string
		want       *runtimeapi.LinuxContainerResources
	}{
		{"cpu and memory", `{"runtimeSpec":{"linux":{"resources":{"cpu":{"shares":5,"quota":20000,"period":100000},"memory":{"limit":50331648}}}}}`,
			&runtimeapi.LinuxContainerResources{CpuShares: 5, CpuQuota: 20000, CpuPeriod: 100000, MemoryLimitInBytes: 48 << 20}},
		{"memory only", `{"runtimeSpec":{"linux":{"resources":{"memory":{"limit":1024}}}}}`, &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1024}},
		{"devices only", `{"runtimeSpec":{"linux":{"resources":{"devices":[{"allow":false,"access":"rwm"}]}}}}`, &runtimeapi.LinuxContainerResources{}},
		{"no resources", `{"pid":42,"runtimeSpec":{"linux":{}}}`, nil},
	} {
		if got := ContainerOf(map[string]string{"info": tc.info}).Limits(); !proto.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%s: Limits = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A sandbox under gVisor as containerd reports it, and the last network
// namespace the spec names.
func TestSandboxNetNS(t *testing.T) {
	s := SandboxOf(map[string]string{"info": `{"pid":42,"runtimeType":"io.containerd.runsc.v1","runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`})
	if s.Pid() != 42 || s.RuntimeType() != "io.containerd.runsc.v1" || s.NetNS() != "/var/run/netns/cni-1" {
		t.Errorf("sandbox: pid %d, runtime type %s, netns %s", s.Pid(), s.RuntimeType(), s.NetNS())
	}
	if s := SandboxOf(map[string]string{"info": `{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}`}); s.NetNS() != "" {
		t.Errorf("a new network namespace has no path, got %q", s.NetNS())
	}
}

// What containerd 2.x does: json.Marshal of the CRI struct it was given,
// read back whole.
func TestConfigRoundTrip(t *testing.T) {
	want := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "app", Attempt: 3},
		Image:    &runtimeapi.ImageSpec{Image: "sha256:1", UserSpecifiedImage: "r/app:v1"},
		Envs:     []*runtimeapi.KeyValue{{Key: "A", Value: []byte("1")}, {Key: "UTF8", Value: []byte("Iñtër 🐹\n")}},
		Labels:   map[string]string{"io.kubernetes.container.name": "app"},
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuShares: 2, MemoryLimitInBytes: 1 << 20}},
	}
	cfgJSON, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"pid": 1, "config": json.RawMessage(cfgJSON)})
	got, err := ContainerOf(map[string]string{"info": string(info)}).Config()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Errorf("round trip:\n got %v\nwant %v", got, want)
	}

	sb := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "u1"},
		Annotations: map[string]string{"a": "b"}}
	sbJSON, _ := json.Marshal(map[string]any{"config": sb})
	gotSB, err := SandboxOf(map[string]string{"info": string(sbJSON)}).Config()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(gotSB, sb) {
		t.Errorf("sandbox config:\n got %v\nwant %v", gotSB, sb)
	}
}

// TestKeyValueJSONIsPlainString pins what Config relies on: the cri-api in
// go.mod encodes env values as plain JSON strings, like every containerd
// release writes them. A cri-api bump that goes back to base64 must fail
// here.
func TestKeyValueJSONIsPlainString(t *testing.T) {
	b, err := json.Marshal(&runtimeapi.KeyValue{Key: "MODE", Value: []byte("old")})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"key":"MODE","value":"old"}` {
		t.Errorf("KeyValue JSON = %s, want the plain-string form", b)
	}
}

func envString(kvs []*runtimeapi.KeyValue) string {
	s := make([]string, len(kvs))
	for i, kv := range kvs {
		s[i] = kv.Key + "=" + string(kv.Value)
	}
	return strings.Join(s, ",")
}
