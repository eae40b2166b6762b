package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inplaced/inplaced/pkg/runtimeclass"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want []string // substrings of the error, all of them; none = valid
	}{
		{"bare socket path endpoint", func(c *Config) { c.RuntimeEndpoint = "/run/containerd/containerd.sock" }, nil},
		{"separate image endpoint", func(c *Config) { c.ImageEndpoint = "unix:///run/other.sock" }, nil},
		{"relative listen", func(c *Config) { c.Listen = "inplaced.sock" }, []string{"--listen", "absolute"}},
		{"empty listen", func(c *Config) { c.Listen = "" }, []string{"--listen", "absolute"}},
		{"relative control socket", func(c *Config) { c.ControlSocket = "./control.sock" }, []string{"--control-socket", "absolute"}},
		{"relative state dir", func(c *Config) { c.StateDir = "var/lib/inplaced" }, []string{"--state-dir", "absolute"}},
		{"same socket twice", func(c *Config) { c.ControlSocket = c.Listen }, []string{"--listen and --control-socket", "different"}},
		{"runtime endpoint is our own socket", func(c *Config) { c.RuntimeEndpoint = "unix://" + c.Listen }, []string{"--runtime-endpoint", "loop"}},
		{"runtime endpoint is our own socket, bare path", func(c *Config) { c.RuntimeEndpoint = c.Listen }, []string{"--runtime-endpoint", "loop"}},
		{"image endpoint is our own socket", func(c *Config) { c.ImageEndpoint = "unix://" + c.Listen }, []string{"--image-endpoint", "loop"}},
		{"tcp endpoint", func(c *Config) { c.RuntimeEndpoint = "tcp://127.0.0.1:1234" }, []string{"--runtime-endpoint", "unix://"}},
		{"relative image endpoint", func(c *Config) { c.ImageEndpoint = "containerd.sock" }, []string{"--image-endpoint"}},
		{"bad log level", func(c *Config) { c.LogLevel = "verbose" }, []string{"--log-level", "verbose"}},
		{"bad log format", func(c *Config) { c.LogFormat = "text" }, []string{"--log-format", "text"}},
		{"grpc relay", func(c *Config) { c.Relay = "grpc" }, nil},
		{"bad relay", func(c *Config) { c.Relay = "h2" }, []string{"--relay", "h2", "router"}},
		{"connection hold drop", func(c *Config) { c.ConnectionHold = "drop" }, nil},
		{"connection hold spelled as the annotation may be", func(c *Config) { c.ConnectionHold = " Off" }, nil},
		{"bad connection hold", func(c *Config) { c.ConnectionHold = "park" }, []string{`--connection-hold "park": use queue, drop or off`}},
		{"overlap", func(c *Config) { c.SwapStrategy = "overlap" }, nil},
		{"bad swap strategy", func(c *Config) { c.SwapStrategy = "blue-green" }, []string{`--swap-strategy "blue-green": use stop-first or overlap`}},
		{"relative takeover socket", func(c *Config) { c.TakeoverSocket = "t.sock" }, []string{"takeoverSocket", "absolute"}},
		{"takeover socket on the control socket", func(c *Config) { c.TakeoverSocket = c.ControlSocket }, []string{"takeoverSocket"}},
		{"hold max too long", func(c *Config) { c.HoldMax = Duration(6 * time.Minute) }, []string{"--hold-max 6m0s", "up to 5m"}},
		{"zero shutdown grace", func(c *Config) { c.ShutdownGrace = 0 }, []string{"shutdownGrace", "--shutdown-grace"}},
		{"zero fence timeout", func(c *Config) { c.FenceTimeout = 0 }, []string{"fenceTimeout"}},
		{"negative health min runtime", func(c *Config) { c.HealthMinRuntime = Duration(-time.Second) }, []string{"healthMinRuntime"}},
		{"zero health min runtime is fine", func(c *Config) { c.HealthMinRuntime = 0 }, nil},
		{"credential provider config without bin dir", func(c *Config) { c.ImageCredentialProviderConfig = "/" },
			[]string{"--image-credential-provider-config", "--image-credential-provider-bin-dir", "both"}},
		{"credential provider paths that do not exist", func(c *Config) {
			c.ImageCredentialProviderConfig, c.ImageCredentialProviderBinDir = "/nonexistent/a.yaml", "/nonexistent/bin"
		}, []string{"--image-credential-provider-config: stat /nonexistent/a.yaml", "--image-credential-provider-bin-dir: stat", "kubelet's value"}},
		{"credential provider paths that exist", func(c *Config) { c.ImageCredentialProviderConfig, c.ImageCredentialProviderBinDir = "/", "/" }, nil},
		{"every problem at once", func(c *Config) {
			c.Listen, c.LogLevel, c.LogFormat = "rel.sock", "loud", "xml"
		}, []string{"--listen", "--log-level", "--log-format"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate = nil, want an error about %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestEffectiveImageEndpoint(t *testing.T) {
	c := Default()
	if c.EffectiveImageEndpoint() != c.RuntimeEndpoint {
		t.Errorf("empty image endpoint = %q, want the runtime's", c.EffectiveImageEndpoint())
	}
	c.ImageEndpoint = "unix:///run/img.sock"
	if c.EffectiveImageEndpoint() != "unix:///run/img.sock" {
		t.Errorf("image endpoint = %q", c.EffectiveImageEndpoint())
	}
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	t.Run("missing default file", func(t *testing.T) {
		c, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), false)
		if err != nil {
			t.Fatalf("Load = %v, want the defaults", err)
		}
		if !reflect.DeepEqual(c, Default()) {
			t.Errorf("config = %+v, want the defaults", c)
		}
	})
	t.Run("missing explicit file", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "absent.yaml")
		if _, err := Load(p, true); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("Load = %v, want an error naming %s", err, p)
		}
	})
	t.Run("unreadable default path", func(t *testing.T) {
		// A directory is not a missing file: that is an error even by default.
		if _, err := Load(t.TempDir(), false); err == nil {
			t.Error("Load of a directory: want an error")
		}
	})
	t.Run("values over defaults", func(t *testing.T) {
		p := write(t, `
listen: /run/x/inplaced.sock
runtimeEndpoint: unix:///run/k3s/containerd/containerd.sock
logLevel: debug
healthMinRuntime: 500ms
fenceTimeout: 1m30s
vmRuntimeHandlers: [kata-qemu]
`)
		c, err := Load(p, true)
		if err != nil {
			t.Fatal(err)
		}
		want := Default()
		want.Listen = "/run/x/inplaced.sock"
		want.RuntimeEndpoint = "unix:///run/k3s/containerd/containerd.sock"
		want.LogLevel = "debug"
		want.HealthMinRuntime = Duration(500 * time.Millisecond)
		want.FenceTimeout = Duration(90 * time.Second)
		want.VMRuntimeHandlers = []string{"kata-qemu"}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("config =\n%+v\nwant\n%+v", c, want)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("Validate: %v", err)
		}
	})
	t.Run("older spelling of shutdownGrace", func(t *testing.T) {
		// The file an earlier version installed (deploy/inplaced/config.yaml
		// had shutdownTimeout) loads after an upgrade, with its value.
		c, err := Load(write(t, "shutdownTimeout: 20s\n"), true)
		if err != nil {
			t.Fatal(err)
		}
		if c.ShutdownGrace != Duration(20*time.Second) || c.ShutdownTimeout != 0 {
			t.Errorf("shutdownTimeout: 20s loaded as grace %s, timeout %s; want grace 20s", c.ShutdownGrace.D(), c.ShutdownTimeout.D())
		}
	})
	t.Run("empty file", func(t *testing.T) {
		c, err := Load(write(t, ""), true)
		if err != nil || !reflect.DeepEqual(c, Default()) {
			t.Errorf("empty file: %+v, %v", c, err)
		}
	})
	for name, body := range map[string]string{
		"unknown key":                  "listen: /run/a.sock\nlistenAddress: /run/b.sock\n",
		"misspelt key":                 "logLevle: debug\n",
		"bad duration":                 "shutdownGrace: ten seconds\n",
		"bare number":                  "shutdownGrace: 10\n", // would be 10 ns
		"older spelling, bad duration": "shutdownTimeout: ten seconds\n",
		"both spellings":               "shutdownGrace: 5s\nshutdownTimeout: 20s\n",
		"wrong type":                   "vmRuntimeHandlers: kata\n",
		"not yaml":                     "listen: [\n",
		"duplicate":                    "listen: /a.sock\nlisten: /b.sock\n",
	} {
		t.Run(name, func(t *testing.T) {
			p := write(t, body)
			if c, err := Load(p, true); err == nil {
				t.Errorf("Load = %+v, want an error", c)
			} else if !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestDurationJSON(t *testing.T) {
	b, err := json.Marshal(Duration(1500 * time.Millisecond))
	if err != nil || string(b) != `"1.5s"` {
		t.Errorf("Marshal = %s, %v", b, err)
	}
	var d Duration
	if err := json.Unmarshal(b, &d); err != nil || d.D() != 1500*time.Millisecond {
		t.Errorf("Unmarshal = %v, %v", d, err)
	}
	if err := json.Unmarshal([]byte(`"2h"`), &d); err != nil || d.D() != 2*time.Hour {
		t.Errorf("Unmarshal 2h = %v, %v", d, err)
	}
	if err := json.Unmarshal([]byte(`"soon"`), &d); err == nil || !strings.Contains(err.Error(), `"10s"`) {
		t.Errorf("Unmarshal soon: %v, want an error with an example", err)
	}
}

func TestRuntimeClasses(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte(`
runtimeClasses:
- handler: kata-fc
  enforcement: sandbox-cgroup
  podOverhead: {cpu: 250m, memory: 64Mi}
- handler: secure*
  enforcement: vm
- handler: runsc-hostnet
  enforcement: sandbox-cgroup
  networkStack: host-kernel
vmRuntimeHandlers: [kata-old]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	tab, err := c.RuntimeClassTable()
	if err != nil {
		t.Fatal(err)
	}
	if cl := tab.Lookup("kata-fc", ""); cl.Enforcement != runtimeclass.SandboxCgroup || cl.Overhead != (runtimeclass.Overhead{CPUMillis: 250, MemoryBytes: 64 << 20}) {
		t.Errorf("kata-fc: %+v", cl)
	}
	for _, h := range []string{"secure-1", "kata-old"} {
		if cl := tab.Lookup(h, ""); cl.Enforcement != runtimeclass.VM || cl.Source != "config" || !cl.OwnNetworkStack() {
			t.Errorf("%s: %+v, want vm with a network stack of its own from config", h, cl)
		}
	}
	if cl := tab.Lookup("runsc-hostnet", ""); cl.Enforcement != runtimeclass.SandboxCgroup || cl.NetworkStack != runtimeclass.HostKernel {
		t.Errorf("runsc-hostnet: %+v, want sandbox-cgroup on the host kernel's network stack", cl)
	}
	if cl := tab.Lookup("kata-fc", ""); cl.NetworkStack != runtimeclass.SandboxStack {
		t.Errorf("kata-fc names no network stack: %+v, want the sandbox's, as every sandbox-cgroup runtime known", cl)
	}

	c.RuntimeClasses[2].NetworkStack = "host"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `network stack "host": want host-kernel or sandbox`) {
		t.Errorf("Validate of a bad network stack: %v", err)
	}
	c.RuntimeClasses[2].NetworkStack = ""
	c.RuntimeClasses[1].Enforcement = "cgroups"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `enforcement "cgroups": want container-cgroups, sandbox-cgroup or vm`) {
		t.Errorf("Validate of a bad enforcement: %v", err)
	}
}
