package swap

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	inplacedv1 "github.com/inplaced/inplaced/proto/inplaced/v1"
)

// Annotations and labels kubelet sets (pkg/kubelet/kuberuntime/labels.go).
const (
	LabelPodName          = "io.kubernetes.pod.name"
	LabelPodNamespace     = "io.kubernetes.pod.namespace"
	LabelPodUID           = "io.kubernetes.pod.uid"
	LabelContainerName    = "io.kubernetes.container.name"
	AnnotationHash        = "io.kubernetes.container.hash"
	AnnotationRestarts    = "io.kubernetes.container.restartCount"
	AnnotationPreStop     = "io.kubernetes.container.preStopHandler"
	AnnotationGracePeriod = "io.kubernetes.pod.terminationGracePeriod"
)

// fieldError is an InvalidArgument about one field of a change.
type fieldError struct {
	field, why string
}

func (e *fieldError) Error() string { return fmt.Sprintf("%s: %s", e.field, e.why) }

// checkImmutable refuses what cannot change in place, and values no
// container could be created with. The control API carries the immutable
// fields so that a request for them fails loudly rather than being dropped.
func checkImmutable(c *inplacedv1.Change) error {
	if err := checkCreateOnlyFields(c); err != nil {
		return err
	}
	if err := checkEnvNames(c); err != nil {
		return err
	}
	return checkValues(c)
}

// checkCreateOnlyFields refuses the fields a runtime sets when it creates a
// container and never after: changing them means a new pod.
func checkCreateOnlyFields(c *inplacedv1.Change) error {
	const recreate = "cannot change in place: the pod must be recreated"
	switch {
	case len(c.GetMounts()) > 0:
		return &fieldError{"mounts", recreate}
	case len(c.GetDevices()) > 0:
		return &fieldError{"devices", recreate}
	case c.Privileged != nil:
		return &fieldError{"privileged", "security context " + recreate}
	case len(c.GetNamespaces()) > 0:
		return &fieldError{"namespaces", recreate}
	case c.RunAsUser != nil:
		return &fieldError{"run_as_user", "security context " + recreate}
	case len(c.GetAddCapabilities()) > 0:
		return &fieldError{"add_capabilities", "security context " + recreate}
	}
	return nil
}

// checkEnvNames refuses variable names the environment cannot carry: an
// empty name, or one with '=' or NUL, does not survive being written as
// NAME=VALUE and read back.
func checkEnvNames(c *inplacedv1.Change) error {
	for k := range c.GetSetEnv() {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &fieldError{"env", fmt.Sprintf("invalid variable name %q", k)}
		}
	}
	return nil
}

// checkValues refuses an image or resources no container could be created
// with, so that the request fails as invalid before any target is resolved
// or any image pulled.
func checkValues(c *inplacedv1.Change) error {
	if c.Image != nil && strings.TrimSpace(c.GetImage()) == "" {
		return &fieldError{"image", "empty image reference"}
	}
	if r := c.GetResources(); r != nil && (r.CpuLimitMillis < 0 || r.CpuRequestMillis < 0 || r.MemoryLimitBytes < 0) {
		return &fieldError{"resources", "negative value"}
	}
	return nil
}

// isEmpty reports whether a change changes nothing.
func isEmpty(c *inplacedv1.Change) bool {
	return c.Image == nil && len(c.SetEnv) == 0 && len(c.UnsetEnv) == 0 && !c.SetCommand && !c.SetArgs &&
		(c.Resources == nil || proto.Equal(c.Resources, &inplacedv1.Resources{}))
}

// applyChange returns a copy of cfg with the change applied. imageRef is the
// pulled image (its ID, as kubelet passes it); userImage is what the caller
// asked for.
func applyChange(cfg *runtimeapi.ContainerConfig, c *inplacedv1.Change, imageRef, userImage string) *runtimeapi.ContainerConfig {
	out := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	if c.Image != nil {
		spec := &runtimeapi.ImageSpec{Image: imageRef, UserSpecifiedImage: userImage}
		if cfg.Image != nil {
			spec.RuntimeHandler = cfg.Image.RuntimeHandler
			spec.Annotations = cfg.Image.Annotations
		}
		out.Image = spec
	}
	if len(c.SetEnv) > 0 || len(c.UnsetEnv) > 0 {
		out.Envs = editEnv(out.Envs, c.SetEnv, c.UnsetEnv)
	}
	if c.SetCommand {
		out.Command = append([]string(nil), c.Command...)
	}
	if c.SetArgs {
		out.Args = append([]string(nil), c.Args...)
	}
	if r := c.GetResources(); r != nil {
		applyResources(out, r)
	}
	return out
}

func editEnv(envs []*runtimeapi.KeyValue, set map[string]string, unset []string) []*runtimeapi.KeyValue {
	drop := map[string]bool{}
	for _, k := range unset {
		drop[k] = true
	}
	seen := map[string]bool{}
	var out []*runtimeapi.KeyValue
	for _, kv := range envs {
		if drop[kv.Key] {
			continue
		}
		if v, ok := set[kv.Key]; ok {
			out = append(out, &runtimeapi.KeyValue{Key: kv.Key, Value: []byte(v)})
			seen[kv.Key] = true
			continue
		}
		out = append(out, &runtimeapi.KeyValue{Key: kv.Key, Value: kv.Value})
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		if !seen[k] && !drop[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, &runtimeapi.KeyValue{Key: k, Value: []byte(set[k])})
	}
	return out
}

// applyResources sets limits like kubelet computes them from a pod spec.
func applyResources(cfg *runtimeapi.ContainerConfig, r *inplacedv1.Resources) {
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{}
	}
	if cfg.Linux.Resources == nil {
		cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{}
	}
	lr := cfg.Linux.Resources
	if r.CpuLimitMillis > 0 {
		lr.CpuPeriod = 100000
		lr.CpuQuota = r.CpuLimitMillis * 100000 / 1000
	}
	if r.CpuRequestMillis > 0 {
		lr.CpuShares = MilliCPUToShares(r.CpuRequestMillis)
	}
	if r.MemoryLimitBytes > 0 {
		lr.MemoryLimitInBytes = r.MemoryLimitBytes
	}
}

// MilliCPUToShares is kubelet's conversion (pkg/kubelet/cm/helpers_linux.go).
func MilliCPUToShares(milli int64) int64 {
	if milli == 0 {
		return 2
	}
	shares := milli * 1024 / 1000
	if shares < 2 {
		return 2
	}
	if shares > 262144 {
		return 262144
	}
	return shares
}

// nextAttempt prepares cfg as the next restart of old: attempt and restart
// count one higher than the newest of (old attempt, old restart count), and
// a fresh log path (never the old one: kubelet's GC deletes <log_path>*).
func nextAttempt(cfg *runtimeapi.ContainerConfig, after *runtimeapi.ContainerConfig) uint32 {
	attempt := after.GetMetadata().GetAttempt() + 1
	restarts := restartCount(after) + 1
	if cfg.Metadata == nil {
		cfg.Metadata = &runtimeapi.ContainerMetadata{}
	} else {
		cfg.Metadata = proto.Clone(cfg.Metadata).(*runtimeapi.ContainerMetadata)
	}
	cfg.Metadata.Attempt = attempt
	ann := make(map[string]string, len(cfg.Annotations))
	for k, v := range cfg.Annotations {
		ann[k] = v
	}
	if _, ok := ann[AnnotationRestarts]; ok || restarts > 0 {
		ann[AnnotationRestarts] = strconv.Itoa(int(restarts))
	}
	cfg.Annotations = ann
	cfg.LogPath = fmt.Sprintf("%s/%d.log", cfg.Metadata.Name, attempt)
	return attempt
}

func restartCount(cfg *runtimeapi.ContainerConfig) uint32 {
	n, err := strconv.Atoi(cfg.GetAnnotations()[AnnotationRestarts])
	if err != nil || n < 0 {
		return cfg.GetMetadata().GetAttempt()
	}
	return uint32(n)
}

// summary is the part of a config a swap changes, for records. Env values
// are left out: they may be secrets.
func summary(cfg *runtimeapi.ContainerConfig) *inplacedv1.ConfigSummary {
	s := &inplacedv1.ConfigSummary{Command: cfg.Command, Args: cfg.Args}
	if cfg.Image != nil {
		s.Image = cfg.Image.UserSpecifiedImage
		if s.Image == "" {
			s.Image = cfg.Image.Image
		}
	}
	for _, kv := range cfg.Envs {
		s.Env = append(s.Env, kv.Key)
	}
	return s
}

// AnnotationTerminationMessagePath is where kubelet mounts the termination
// message file; the host side of that mount is new for every container
// kubelet creates (a random file name under the pod's container dir).
const AnnotationTerminationMessagePath = "io.kubernetes.container.terminationMessagePath"

// ConfigDiff names the top-level fields in which kubelet's config for a
// container differs from the config inplaced prepared, ignoring what must
// differ between two instances of one spec container: the host file behind
// the termination message mount. Empty means the prepared container is what
// kubelet asked for.
func ConfigDiff(kubelet, prepared *runtimeapi.ContainerConfig) []string {
	a, b := instanceNeutral(kubelet), instanceNeutral(prepared)
	var out []string
	fields := a.ProtoReflect().Descriptor().Fields()
	for n := 0; n < fields.Len(); n++ {
		fd := fields.Get(n)
		x, y := &runtimeapi.ContainerConfig{}, &runtimeapi.ContainerConfig{}
		if a.ProtoReflect().Has(fd) {
			x.ProtoReflect().Set(fd, a.ProtoReflect().Get(fd))
		}
		if b.ProtoReflect().Has(fd) {
			y.ProtoReflect().Set(fd, b.ProtoReflect().Get(fd))
		}
		if !proto.Equal(x, y) {
			out = append(out, string(fd.Name()))
		}
	}
	return out
}

func instanceNeutral(cfg *runtimeapi.ContainerConfig) *runtimeapi.ContainerConfig {
	c := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	tm := c.GetAnnotations()[AnnotationTerminationMessagePath]
	for _, m := range c.Mounts {
		if tm != "" && m.ContainerPath == tm {
			m.HostPath = ""
		}
	}
	// kubelet builds the service link variables from a map: their order
	// differs from one create to the next.
	sort.SliceStable(c.Envs, func(i, j int) bool { return c.Envs[i].Key < c.Envs[j].Key })
	return c
}
