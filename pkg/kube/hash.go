package kube

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"

	"k8s.io/apimachinery/pkg/util/dump"
)

// ContainerHash is kubelet's io.kubernetes.container.hash for a spec
// container (k8s.io/kubernetes pkg/kubelet/container.HashContainer since
// v1.31: FNV-32a over the dump of the JSON of {name, image}, written in hex
// by kuberuntime/labels.go). kubelet keeps a running container exactly when
// its annotation equals this for the current spec.
func ContainerHash(name, image string) string {
	j, _ := json.Marshal(map[string]string{"name": name, "image": image})
	h := fnv.New32a()
	// hashutil.DeepHashObject: reset, then fmt "%v" of dump.ForHash(obj).
	fmt.Fprintf(h, "%v", dump.ForHash(j))
	return strconv.FormatUint(uint64(h.Sum32()), 16)
}
