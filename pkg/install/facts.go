package install

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"time"
)

// Layout is how kubelet is configured on the node.
type Layout string

const (
	// Kubeadm: kubelet.service reading a KubeletConfiguration file
	// (containerRuntimeEndpoint, imageServiceEndpoint).
	Kubeadm Layout = "kubeadm"
	// K3s: the k3s or k3s-agent service, whose kubelet takes the endpoint
	// from k3s's config (config.yaml and config.yaml.d/).
	K3s Layout = "k3s"
)

// Host paths, in the host's view: the executor and Inspect put the host
// root in front.
const (
	ConfigDir   = "/etc/inplaced"
	ConfigPath  = "/etc/inplaced/config.yaml"
	RecordPath  = "/etc/inplaced/installed.json"
	UnitDir     = "/etc/systemd/system"
	StateDir    = "/var/lib/inplaced"
	RuntimeDir  = "/run/inplaced"
	ServiceUnit = "inplaced.service"
	// ArgsDropIn carries the chart's extra flags for inplaced (an ExecStart
	// of the payload's unit with the flags added); absent without any.
	ArgsDropIn = UnitDir + "/inplaced.service.d/50-installer-args.conf"
	// LockPath serialises installers on one node (an old pod still
	// terminating while the new one starts).
	LockPath = "/run/inplaced-installer.lock"

	KubeletUnit          = "kubelet.service"
	KubeletConfigDefault = "/var/lib/kubelet/config.yaml"
	K3sConfigDefault     = "/etc/rancher/k3s/config.yaml"
	// k3sDropInName sorts after the usual drop-ins, so its values win.
	k3sDropInName = "90-inplaced.yaml"
	// unitDropInName is the name of the ordering drop-in in kubelet's (or
	// k3s's) unit directory: After= and Wants= inplaced.
	unitDropInName = "10-inplaced.conf"

	// DefaultRuntimeEndpoint is kubelet's own default, used when its
	// configuration names none.
	DefaultRuntimeEndpoint = "unix:///run/containerd/containerd.sock"
)

// The payload's templates, at their repository paths.
const (
	payloadConfig         = "deploy/inplaced/config.yaml"
	payloadKubeletDropIn  = "deploy/kubelet/10-inplaced.conf"
	payloadK3sUnitDropIn  = "deploy/k3s/k3s-agent.service.d-10-inplaced.conf"
	payloadServiceUnitRel = "systemd/" + ServiceUnit
)

// FileRule maps payload files onto the host.
type FileRule struct {
	// Payload is a path or a glob in the payload.
	Payload string
	// Host is the host path, or a directory (ending in "/") the payload
	// file goes into under its own name.
	Host string
	Mode fs.FileMode
}

// HostFiles is every payload file copied to the host as it is. A unit the
// image carries is installed, enabled and started with no change here:
// inplaced.socket joins inplaced.service the release it appears in.
var HostFiles = []FileRule{
	{Payload: "bin/inplaced", Host: "/usr/local/bin/inplaced", Mode: 0o755},
	{Payload: "bin/inplacectl", Host: "/usr/local/bin/inplacectl", Mode: 0o755},
	{Payload: "systemd/*.socket", Host: UnitDir + "/", Mode: 0o644},
	{Payload: "systemd/*.service", Host: UnitDir + "/", Mode: 0o644},
}

// PayloadTemplates are read from the payload but written by the plan
// after changes (the config), or only for one layout (the drop-ins).
var PayloadTemplates = []string{payloadConfig, payloadKubeletDropIn, payloadK3sUnitDropIn}

// PayloadFile is one file the image carries.
type PayloadFile struct {
	// Source is where it is in the installer's filesystem; the executor
	// copies it from there.
	Source string
	Digest string
	Mode   fs.FileMode
	// Data is the content of a small file (units, templates); nil for
	// the binaries, which are copied from Source.
	Data []byte
}

// Payload is the image's files by payload path.
type Payload map[string]PayloadFile

// HostFile is one file as found on the host.
type HostFile struct {
	Exists bool
	Digest string
	Mode   fs.FileMode
	// Data is the content of a small file (configs, units, the record);
	// nil for a large one.
	Data []byte
}

// Digest is the hex SHA-256 of b, as HostFile and PayloadFile carry it.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// UnitState is a systemd unit as systemd reports it.
type UnitState struct {
	// Load is LoadState: loaded, not-found, ...
	Load string
	// Active is ActiveState: active, inactive, failed, activating, ...
	Active string
	// FileState is UnitFileState: enabled, disabled, static, ...
	FileState string
	// MainPID and Started (ExecMainStartTimestampMonotonic) name one run
	// of a service.
	MainPID uint32
	Started uint64
}

// Identity names one run of a service ("" when none runs): a restart, or a
// crash and restart, changes it.
func (u UnitState) Identity() string {
	if u.MainPID == 0 {
		return ""
	}
	return fmt.Sprintf("%d@%d", u.MainPID, u.Started)
}

func (u UnitState) running() bool {
	return u.Active == "active" || u.Active == "activating" || u.Active == "reloading"
}
func (u UnitState) enabled() bool {
	return u.FileState == "enabled" || u.FileState == "enabled-runtime"
}

// Facts is what Inspect found on the host: all that a plan decides from.
type Facts struct {
	// Files by host path: every file a plan may read or touch. A path
	// missing from the map is a file that does not exist.
	Files map[string]HostFile
	// Dirs lists the entries (names) of the directories whose drop-ins
	// count: k3s's config.yaml.d, kubelet's --config-dir.
	Dirs map[string][]string
	// Units by unit name.
	Units map[string]UnitState
	// KubeletUnit is the unit that runs kubelet (kubelet.service, k3s.service
	// or k3s-agent.service; "" when none was found) and KubeletArgs its main
	// process's command line.
	KubeletUnit string
	KubeletArgs []string
	// Annotation is the Node's inplaced.io/installed, nil when absent.
	Annotation *Installed
}

func (f Facts) file(path string) HostFile { return f.Files[path] }

func (f Facts) unit(name string) UnitState { return f.Units[name] }

// Record is the host's record of an install, at RecordPath: what
// uninstall puts back.
type Record struct {
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	Layout  Layout    `json:"layout"`
	// PreviousRuntimeEndpoint and PreviousImageEndpoint are what kubelet
	// used before ("" image: the runtime endpoint).
	PreviousRuntimeEndpoint string `json:"previousRuntimeEndpoint"`
	PreviousImageEndpoint   string `json:"previousImageEndpoint,omitempty"`
	// KubeletUnit is the unit restarted to point kubelet at an endpoint.
	KubeletUnit string `json:"kubeletUnit"`
	// KubeletConfig is the KubeletConfiguration file whose lines were
	// changed (kubeadm), and Lines each changed key's line as it was ("" for
	// a key that was absent).
	KubeletConfig string            `json:"kubeletConfig,omitempty"`
	Lines         map[string]string `json:"lines,omitempty"`
	// Files is every host file the installer wrote.
	Files []string `json:"files"`
	// StaleKubelet is the identity of the kubelet that ran when its
	// configuration last changed: while that one still runs, it has not
	// read the change.
	StaleKubelet string `json:"staleKubelet,omitempty"`
}

// Spec is what is to be installed.
type Spec struct {
	Layout   Layout
	Version  string
	NodeName string
	Payload  Payload
	// KubernetesMode gives inplaced kubelet's kubeconfig (the layout's).
	KubernetesMode bool
	// ConnectionHold and HoldMax are inplaced's connectionHold and holdMax
	// ("" keeps the template's).
	ConnectionHold string
	HoldMax        string
	// ExtraArgs are more flags for inplaced.
	ExtraArgs []string
	// Now is the time recorded for a change.
	Now time.Time
}
