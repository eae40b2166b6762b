package swap

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/inplaced/inplaced/pkg/internal/fakecri"
	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

func strp(s string) *string { return &s }

func TestCheckImmutable(t *testing.T) {
	yes := true
	uid := int64(0)
	for _, tc := range []struct {
		name   string
		change *inplacedv1.Change
		field  string // "" = accepted
	}{
		{"empty change", &inplacedv1.Change{}, ""},
		{"image, env, command, args, resources", &inplacedv1.Change{
			Image: strp("nginx:1.27"), SetEnv: map[string]string{"A": "1", "B_2": ""}, UnsetEnv: []string{"C"},
			SetCommand: true, Command: []string{"/bin/sh"}, SetArgs: true,
			Resources: &inplacedv1.Resources{CpuLimitMillis: 500, CpuRequestMillis: 250, MemoryLimitBytes: 1 << 20},
		}, ""},
		{"mounts", &inplacedv1.Change{Mounts: []string{"/a:/b"}}, "mounts"},
		{"devices", &inplacedv1.Change{Devices: []string{"/dev/fuse:/dev/fuse"}}, "devices"},
		{"privileged", &inplacedv1.Change{Privileged: &yes}, "privileged"},
		{"privileged false is still a request", &inplacedv1.Change{Privileged: new(bool)}, "privileged"},
		{"namespaces", &inplacedv1.Change{Namespaces: []string{"network=host"}}, "namespaces"},
		{"run_as_user", &inplacedv1.Change{RunAsUser: &uid}, "run_as_user"},
		{"capabilities", &inplacedv1.Change{AddCapabilities: []string{"NET_ADMIN"}}, "add_capabilities"},
		{"immutable wins over a valid image", &inplacedv1.Change{Image: strp("x:1"), Mounts: []string{"/a:/b"}}, "mounts"},
		{"env name empty", &inplacedv1.Change{SetEnv: map[string]string{"": "v"}}, "env"},
		{"env name with =", &inplacedv1.Change{SetEnv: map[string]string{"A=B": "v"}}, "env"},
		{"env name with NUL", &inplacedv1.Change{SetEnv: map[string]string{"A\x00": "v"}}, "env"},
		{"empty image", &inplacedv1.Change{Image: strp("")}, "image"},
		{"blank image", &inplacedv1.Change{Image: strp("  \t")}, "image"},
		{"negative cpu limit", &inplacedv1.Change{Resources: &inplacedv1.Resources{CpuLimitMillis: -1}}, "resources"},
		{"negative memory", &inplacedv1.Change{Resources: &inplacedv1.Resources{MemoryLimitBytes: -1}}, "resources"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkImmutable(tc.change)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("checkImmutable: %v, want nil", err)
				}
				return
			}
			var fe *fieldError
			if !errors.As(err, &fe) {
				t.Fatalf("checkImmutable = %v (%T), want a *fieldError for %q", err, err, tc.field)
			}
			if fe.field != tc.field {
				t.Errorf("field = %q, want %q (error %q)", fe.field, tc.field, err)
			}
			if !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Errorf("error %q does not name the field %q first", err, tc.field)
			}
		})
	}
}

func TestIsEmpty(t *testing.T) {
	for _, tc := range []struct {
		change *inplacedv1.Change
		want   bool
	}{
		{&inplacedv1.Change{}, true},
		{&inplacedv1.Change{Resources: &inplacedv1.Resources{}}, true},
		{&inplacedv1.Change{Image: strp("x")}, false},
		{&inplacedv1.Change{SetEnv: map[string]string{"A": ""}}, false},
		{&inplacedv1.Change{UnsetEnv: []string{"A"}}, false},
		{&inplacedv1.Change{SetCommand: true}, false}, // set to empty: use the image's
		{&inplacedv1.Change{SetArgs: true}, false},
		{&inplacedv1.Change{Command: []string{"x"}}, true}, // not marked as set
		{&inplacedv1.Change{Resources: &inplacedv1.Resources{MemoryLimitBytes: 1}}, false},
	} {
		if got := isEmpty(tc.change); got != tc.want {
			t.Errorf("isEmpty(%v) = %v, want %v", tc.change, got, tc.want)
		}
	}
}

func envString(kvs []*runtimeapi.KeyValue) string {
	var parts []string
	for _, kv := range kvs {
		parts = append(parts, kv.Key+"="+string(kv.Value))
	}
	return strings.Join(parts, ",")
}

func kvs(pairs ...string) []*runtimeapi.KeyValue {
	var out []*runtimeapi.KeyValue
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, &runtimeapi.KeyValue{Key: pairs[i], Value: []byte(pairs[i+1])})
	}
	return out
}

func TestEditEnv(t *testing.T) {
	for _, tc := range []struct {
		name  string
		envs  []*runtimeapi.KeyValue
		set   map[string]string
		unset []string
		want  string
	}{
		{"nothing", kvs("A", "1", "B", "2"), nil, nil, "A=1,B=2"},
		{"replace keeps position", kvs("A", "1", "B", "2", "C", "3"), map[string]string{"B": "two"}, nil, "A=1,B=two,C=3"},
		{"new ones appended sorted", kvs("A", "1"), map[string]string{"Z": "z", "M": "m"}, nil, "A=1,M=m,Z=z"},
		{"unset", kvs("A", "1", "B", "2", "C", "3"), nil, []string{"B"}, "A=1,C=3"},
		{"unset missing is fine", kvs("A", "1"), nil, []string{"NOPE"}, "A=1"},
		{"unset wins over set", kvs("A", "1", "B", "2"), map[string]string{"B": "x", "N": "n"}, []string{"B", "N"}, "A=1"},
		{"set to empty value", kvs("A", "1"), map[string]string{"A": ""}, nil, "A="},
		{"duplicates kept in place", kvs("A", "1", "A", "2"), map[string]string{"A": "x"}, nil, "A=x,A=x"},
		{"from nothing", nil, map[string]string{"B": "b", "A": "a"}, nil, "A=a,B=b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := envString(tc.envs)
			got := editEnv(tc.envs, tc.set, tc.unset)
			if s := envString(got); s != tc.want {
				t.Errorf("editEnv = %q, want %q", s, tc.want)
			}
			if s := envString(tc.envs); s != orig {
				t.Errorf("input changed: %q, was %q", s, orig)
			}
		})
	}
}

func baseConfig() *runtimeapi.ContainerConfig {
	pod := fakecri.PodConfig("default", "web", "uid-1")
	cfg := fakecri.ContainerConfig(pod, "app", 2, "sha256:old", "registry.local/app:v1", "abc123")
	cfg.Image.Annotations = map[string]string{"io.example/kind": "app"}
	return cfg
}

func TestApplyChange(t *testing.T) {
	t.Run("image keeps handler and annotations, sets user image", func(t *testing.T) {
		cfg := baseConfig()
		before := proto.Clone(cfg)
		out := applyChange(cfg, &inplacedv1.Change{Image: strp("registry.local/app:v2")}, "sha256:new", "registry.local/app:v2")
		want := &runtimeapi.ImageSpec{Image: "sha256:new", UserSpecifiedImage: "registry.local/app:v2",
			RuntimeHandler: "runc", Annotations: map[string]string{"io.example/kind": "app"}}
		if !proto.Equal(out.Image, want) {
			t.Errorf("image = %v, want %v", out.Image, want)
		}
		if !proto.Equal(cfg, before) {
			t.Errorf("applyChange mutated its input: %v", cfg)
		}
		// Everything else is as it was.
		out.Image = cfg.Image
		if !proto.Equal(out, cfg) {
			t.Errorf("image change touched more than the image:\n got %v\nwant %v", out, cfg)
		}
	})
	t.Run("no image change keeps the image", func(t *testing.T) {
		cfg := baseConfig()
		out := applyChange(cfg, &inplacedv1.Change{SetEnv: map[string]string{"MODE": "new"}}, "sha256:ignored", "ignored")
		if !proto.Equal(out.Image, cfg.Image) {
			t.Errorf("image = %v, want unchanged %v", out.Image, cfg.Image)
		}
	})
	t.Run("env set replace unset keep order", func(t *testing.T) {
		cfg := baseConfig()
		cfg.Envs = kvs("A", "1", "MODE", "old", "B", "2", "DROP", "x")
		out := applyChange(cfg, &inplacedv1.Change{SetEnv: map[string]string{"MODE": "new", "NEW": "n"}, UnsetEnv: []string{"DROP"}}, "", "")
		if got, want := envString(out.Envs), "A=1,MODE=new,B=2,NEW=n"; got != want {
			t.Errorf("envs = %q, want %q", got, want)
		}
		if got, want := envString(cfg.Envs), "A=1,MODE=old,B=2,DROP=x"; got != want {
			t.Errorf("input envs changed to %q", got)
		}
	})
	t.Run("command and args set", func(t *testing.T) {
		cfg := baseConfig()
		out := applyChange(cfg, &inplacedv1.Change{SetCommand: true, Command: []string{"/new"}, SetArgs: true, Args: []string{"-v"}}, "", "")
		if fmt.Sprint(out.Command) != "[/new]" || fmt.Sprint(out.Args) != "[-v]" {
			t.Errorf("command %q args %q, want [/new] [-v]", out.Command, out.Args)
		}
	})
	t.Run("command set to empty clears it", func(t *testing.T) {
		cfg := baseConfig()
		out := applyChange(cfg, &inplacedv1.Change{SetCommand: true}, "", "")
		if len(out.Command) != 0 {
			t.Errorf("command = %q, want empty (the image's entrypoint)", out.Command)
		}
		if fmt.Sprint(out.Args) != fmt.Sprint(cfg.Args) {
			t.Errorf("args = %q, want untouched %q", out.Args, cfg.Args)
		}
	})
	t.Run("command and args untouched unless set", func(t *testing.T) {
		cfg := baseConfig()
		out := applyChange(cfg, &inplacedv1.Change{Command: []string{"/ignored"}, Args: []string{"ignored"}, SetEnv: map[string]string{"X": "1"}}, "", "")
		if fmt.Sprint(out.Command) != fmt.Sprint(cfg.Command) || fmt.Sprint(out.Args) != fmt.Sprint(cfg.Args) {
			t.Errorf("command %q args %q, want untouched %q %q", out.Command, out.Args, cfg.Command, cfg.Args)
		}
	})
	t.Run("command slice is a copy", func(t *testing.T) {
		c := &inplacedv1.Change{SetCommand: true, Command: []string{"/a"}}
		out := applyChange(baseConfig(), c, "", "")
		c.Command[0] = "/changed"
		if out.Command[0] != "/a" {
			t.Errorf("command aliases the change: %q", out.Command)
		}
	})
	for _, tc := range []struct {
		name string
		r    *inplacedv1.Resources
		want *runtimeapi.LinuxContainerResources // on top of CpuShares 102, memory 64Mi
	}{
		{"cpu limit", &inplacedv1.Resources{CpuLimitMillis: 500},
			&runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 102, MemoryLimitInBytes: 64 << 20}},
		{"cpu limit 2 cores", &inplacedv1.Resources{CpuLimitMillis: 2000},
			&runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 200000, CpuShares: 102, MemoryLimitInBytes: 64 << 20}},
		{"cpu request", &inplacedv1.Resources{CpuRequestMillis: 250},
			&runtimeapi.LinuxContainerResources{CpuShares: 256, MemoryLimitInBytes: 64 << 20}},
		{"memory", &inplacedv1.Resources{MemoryLimitBytes: 128 << 20},
			&runtimeapi.LinuxContainerResources{CpuShares: 102, MemoryLimitInBytes: 128 << 20}},
		{"zero means unchanged", &inplacedv1.Resources{},
			&runtimeapi.LinuxContainerResources{CpuShares: 102, MemoryLimitInBytes: 64 << 20}},
	} {
		t.Run("resources "+tc.name, func(t *testing.T) {
			cfg := baseConfig()
			out := applyChange(cfg, &inplacedv1.Change{Resources: tc.r}, "", "")
			if !proto.Equal(out.Linux.Resources, tc.want) {
				t.Errorf("resources = %v, want %v", out.Linux.Resources, tc.want)
			}
			if cfg.Linux.Resources.CpuQuota != 0 || cfg.Linux.Resources.CpuShares != 102 || cfg.Linux.Resources.MemoryLimitInBytes != 64<<20 {
				t.Errorf("input resources mutated: %v", cfg.Linux.Resources)
			}
		})
	}
	t.Run("resources on a config without linux section", func(t *testing.T) {
		cfg := baseConfig()
		cfg.Linux = nil
		out := applyChange(cfg, &inplacedv1.Change{Resources: &inplacedv1.Resources{MemoryLimitBytes: 1 << 30, CpuRequestMillis: 1000}}, "", "")
		if got := out.GetLinux().GetResources(); got.GetMemoryLimitInBytes() != 1<<30 || got.GetCpuShares() != 1024 {
			t.Errorf("resources = %v", got)
		}
		if cfg.Linux != nil {
			t.Error("input config gained a linux section")
		}
	})
}

func TestMilliCPUToShares(t *testing.T) {
	for _, tc := range []struct{ milli, want int64 }{
		{0, 2}, {1, 2}, {1, 2}, {2, 2}, {3, 3}, {10, 10}, {100, 102}, {250, 256}, {1000, 1024},
		{1500, 1536}, {256000, 262144}, {300000, 262144},
	} {
		if got := MilliCPUToShares(tc.milli); got != tc.want {
			t.Errorf("MilliCPUToShares(%d) = %d, want %d", tc.milli, got, tc.want)
		}
	}
}

func TestNextAttempt(t *testing.T) {
	for _, tc := range []struct {
		name         string
		attempt      uint32
		restarts     string // "" = annotation absent
		wantAttempt  uint32
		wantRestarts string
	}{
		{"first restart", 0, "0", 1, "1"},
		{"attempt and count agree", 4, "4", 5, "5"},
		{"count ahead of attempt", 2, "7", 3, "8"},
		{"no annotation: count from attempt", 3, "", 4, "4"},
		{"bad annotation: count from attempt", 3, "x", 4, "4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := baseConfig()
			old.Metadata.Attempt = tc.attempt
			if tc.restarts == "" {
				delete(old.Annotations, AnnotationRestarts)
			} else {
				old.Annotations[AnnotationRestarts] = tc.restarts
			}
			pristine := proto.Clone(old).(*runtimeapi.ContainerConfig)
			cfg := proto.Clone(old).(*runtimeapi.ContainerConfig)
			// cfg shares nothing with old but is the same config, as the
			// engine passes it; also prove cfg's own maps are not written.
			sharedAnn := cfg.Annotations
			sharedMD := cfg.Metadata
			got := nextAttempt(cfg, old)
			if got != tc.wantAttempt || cfg.Metadata.Attempt != tc.wantAttempt {
				t.Errorf("attempt = %d (metadata %d), want %d", got, cfg.Metadata.Attempt, tc.wantAttempt)
			}
			if r := cfg.Annotations[AnnotationRestarts]; r != tc.wantRestarts {
				t.Errorf("restartCount = %q, want %q", r, tc.wantRestarts)
			}
			if want := fmt.Sprintf("app/%d.log", tc.wantAttempt); cfg.LogPath != want {
				t.Errorf("log_path = %q, want %q", cfg.LogPath, want)
			}
			if cfg.LogPath == old.LogPath {
				t.Errorf("log_path reuses the old one %q: kubelet's GC would delete the new log", old.LogPath)
			}
			if cfg.Metadata.Name != "app" {
				t.Errorf("name = %q", cfg.Metadata.Name)
			}
			// Labels and every other annotation, the hash first of all, unchanged.
			if !proto.Equal(&runtimeapi.ContainerConfig{Labels: cfg.Labels}, &runtimeapi.ContainerConfig{Labels: old.Labels}) {
				t.Errorf("labels changed: %v", cfg.Labels)
			}
			for k, v := range old.Annotations {
				if k == AnnotationRestarts {
					continue
				}
				if cfg.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want unchanged %q", k, cfg.Annotations[k], v)
				}
			}
			if cfg.Annotations[AnnotationHash] != "abc123" {
				t.Errorf("hash = %q, want abc123", cfg.Annotations[AnnotationHash])
			}
			wantKeys := len(old.Annotations)
			if tc.restarts == "" {
				wantKeys++
			}
			if len(cfg.Annotations) != wantKeys {
				t.Errorf("annotations %v: %d keys, want %d", cfg.Annotations, len(cfg.Annotations), wantKeys)
			}
			if !proto.Equal(old, pristine) {
				t.Errorf("nextAttempt mutated the config it follows")
			}
			if sharedMD.Attempt != tc.attempt {
				t.Errorf("nextAttempt wrote through cfg's old metadata (attempt %d)", sharedMD.Attempt)
			}
			if tc.restarts != "" && sharedAnn[AnnotationRestarts] != tc.restarts {
				t.Errorf("nextAttempt wrote through cfg's old annotation map (%q)", sharedAnn[AnnotationRestarts])
			}
		})
	}
	t.Run("after a newer config", func(t *testing.T) {
		// Rollback: the old config as the attempt after the failed new one.
		oldCfg := baseConfig() // attempt 2
		failed := baseConfig()
		nextAttempt(failed, oldCfg) // attempt 3
		rb := proto.Clone(oldCfg).(*runtimeapi.ContainerConfig)
		if got := nextAttempt(rb, failed); got != 4 || rb.Annotations[AnnotationRestarts] != "4" || rb.LogPath != "app/4.log" {
			t.Errorf("rollback attempt %d restarts %q log %q, want 4 4 app/4.log", got, rb.Annotations[AnnotationRestarts], rb.LogPath)
		}
		if rb.Image.Image != "sha256:old" {
			t.Errorf("rollback image = %q", rb.Image.Image)
		}
	})
	t.Run("no metadata", func(t *testing.T) {
		cfg := &runtimeapi.ContainerConfig{}
		if got := nextAttempt(cfg, &runtimeapi.ContainerConfig{}); got != 1 || cfg.Metadata.GetAttempt() != 1 {
			t.Errorf("attempt = %d", got)
		}
	})
}

func TestSummaryLeavesEnvValuesOut(t *testing.T) {
	cfg := baseConfig()
	cfg.Envs = kvs("PASSWORD", "hunter2", "MODE", "x")
	s := summary(cfg)
	if fmt.Sprint(s.Env) != "[PASSWORD MODE]" {
		t.Errorf("env = %v, want names only", s.Env)
	}
	if strings.Contains(fmt.Sprint(s), "hunter2") {
		t.Errorf("summary leaks an env value: %v", s)
	}
	if s.Image != "registry.local/app:v1" {
		t.Errorf("image = %q, want the user's reference", s.Image)
	}
	cfg.Image.UserSpecifiedImage = ""
	if s := summary(cfg); s.Image != "sha256:old" {
		t.Errorf("image without user reference = %q, want the ID", s.Image)
	}
}
