package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/template"
)

// configData fills the containerd config templates.
type configData struct {
	Dir, Socket, Registry, Pause, CNIConfDir, CertsDir string
	StreamPort                                         int
	Mirrors                                            []string
	// Links are registry hosts that serve themselves over plain HTTP
	// (Registry.StartLink).
	Links []string
	// RunscConfig is the runsc.toml of handler runsc (2.x only), empty
	// without gVisor.
	RunscConfig string
}

// containerd 1.6 reads the version 2 format.
var config16 = template.Must(template.New("1.6").Parse(`# written by inplaced test/harness
version = 2
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"

[grpc]
  address = "{{.Socket}}"

[ttrpc]
  address = "{{.Socket}}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{.Pause}}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "{{.StreamPort}}"
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{{.Dir}}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{{.CNIConfDir}}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{{.Registry}}"]
    endpoint = ["http://{{.Registry}}"]
{{- range .Mirrors}}
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{{.}}"]
    endpoint = ["http://{{$.Registry}}"]
{{- end}}
{{- range .Links}}
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{{.}}"]
    endpoint = ["http://{{.}}"]
{{- end}}
`))

// containerd 2.x reads the version 3 format: the CRI plugin is split into
// images and runtime sections.
var config2 = template.Must(template.New("2.x").Parse(`# written by inplaced test/harness
version = 3
root = "{{.Dir}}/root"
state = "{{.Dir}}/state"

[grpc]
  address = "{{.Socket}}"

[ttrpc]
  address = "{{.Socket}}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/opt"

[plugins."io.containerd.nri.v1.nri"]
  socket_path = "{{.Dir}}/nri.sock"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "{{.StreamPort}}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{{.Pause}}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{{.CertsDir}}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{{.Dir}}/runc"
{{- if .RunscConfig}}
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{{.RunscConfig}}"
{{- end}}
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{{.CNIConfDir}}"
    max_conf_num = 1
`))

// runscTOML is the shim's options file for handler runsc: the runsc binary,
// its state root and logs under the instance's Dir (so that teardown finds
// the sandbox processes by Dir), and the systrap platform, which needs
// neither KVM nor ptrace's per-syscall stops.
const runscTOML = `# written by inplaced test/harness
binary_name = "%[1]s"
root = "%[2]s/runsc"

[runsc_config]
  platform = "systrap"
  debug-log = "%[2]s/runsc-log/"
`

const hostsTOML = `# written by inplaced test/harness
server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`

// writeConfig writes config.toml, the registry hosts dir (2.x) and the CNI
// conflist of c.
func (c *Containerd) writeConfig() error {
	d := configData{
		Dir:        c.Dir,
		Socket:     c.Socket,
		Registry:   c.Registry.Addr,
		Pause:      c.Images.Pause,
		CNIConfDir: filepath.Join(c.Dir, "net.d"),
		CertsDir:   filepath.Join(c.Dir, "certs.d"),
		StreamPort: c.StreamPort,
		Mirrors:    c.Mirrors,
		Links:      c.Registry.Links(),
	}
	tmpl := config2
	if c.Backend == Containerd16 {
		tmpl = config16
	}
	if c.Runsc {
		d.RunscConfig = filepath.Join(c.Dir, "runsc.toml")
		if err := os.WriteFile(d.RunscConfig, fmt.Appendf(nil, runscTOML, filepath.Join(GVisorBinDir(), "runsc"), c.Dir), 0o644); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, d); err != nil {
		return err
	}
	if err := os.WriteFile(c.ConfigPath, buf.Bytes(), 0o644); err != nil {
		return err
	}

	// 2.x: one hosts dir per registry host, all served by the harness
	// registry (a link by its own address).
	endpoints := map[string]string{c.Registry.Addr: c.Registry.Addr}
	for _, m := range c.Mirrors {
		endpoints[m] = c.Registry.Addr
	}
	for _, l := range d.Links {
		endpoints[l] = l
	}
	for host, endpoint := range endpoints {
		hostsDir := filepath.Join(d.CertsDir, host)
		if err := os.MkdirAll(hostsDir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(hostsDir, "hosts.toml"), fmt.Appendf(nil, hostsTOML, endpoint), 0o644); err != nil {
			return err
		}
	}

	if err := os.MkdirAll(d.CNIConfDir, 0o755); err != nil {
		return err
	}
	conflist, err := json.MarshalIndent(c.cniConfList(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d.CNIConfDir, "10-inplaced.conflist"), conflist, 0o644)
}

// cniConfList is a bridge on c.Bridge with host-local IPAM on c.Subnet (its
// state under c.Dir) and portmap for hostPort. No masquerading: pods need no
// way out, and the machine's NAT table stays as it was.
func (c *Containerd) cniConfList() map[string]any {
	ranges := [][]map[string]string{{{"subnet": c.Subnet}}}
	routes := []map[string]string{{"dst": "0.0.0.0/0"}}
	if c.Subnet6 != "" {
		ranges = append(ranges, []map[string]string{{"subnet": c.Subnet6}})
		routes = append(routes, map[string]string{"dst": "::/0"})
	}
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       c.NetworkName,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      c.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  ranges,
					"routes":  routes,
					"dataDir": filepath.Join(c.Dir, "cni-ipam"),
				},
			},
			map[string]any{
				"type":         "portmap",
				"capabilities": map[string]bool{"portMappings": true},
			},
		},
	}
}
