package install

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inplaced/inplaced/pkg/kubeclient"
)

// Component is the installer's name in the events it writes.
const Component = "inplaced-installer"

// NodeClient is this node's object through the API: read (the annotation,
// the Ready condition), annotated, and given events. The verbs it uses —
// nodes get and patch, events create — are the installer's ClusterRole.
type NodeClient struct {
	Client kubeclient.Interface
	Name   string
	Now    func() time.Time
}

var _ Node = (*NodeClient)(nil)

func (n *NodeClient) Get(ctx context.Context) (*corev1.Node, error) {
	return n.Client.Nodes().Get(ctx, n.Name, metav1.GetOptions{})
}

// Annotate sets or removes one annotation with a JSON merge patch: no read
// first, no conflict with kubelet's own status writes.
func (n *NodeClient) Annotate(ctx context.Context, key string, value *string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{key: value}}})
	if err != nil {
		return err
	}
	_, err = n.Client.Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// Event records an event about the Node, in namespace default as kubelet
// records its node's events.
func (n *NodeClient) Event(ctx context.Context, eventType, reason, message string) error {
	node, err := n.Get(ctx)
	if err != nil {
		return err
	}
	now := metav1.NewTime(n.now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: fmt.Sprintf("%s.%x", n.Name, now.UnixNano())},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: node.UID},
		Reason:         reason, Message: message, Type: eventType,
		Source:         corev1.EventSource{Component: Component, Host: n.Name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "inplaced.io/installer", ReportingInstance: n.Name,
	}
	_, err = n.Client.Events().Create(ctx, ev)
	return err
}

func (n *NodeClient) now() time.Time {
	if n.Now == nil {
		return time.Now()
	}
	return n.Now()
}
