// Package kubeclient is inplaced's Kubernetes API client: core/v1 only.
//
// k8s.io/client-go/kubernetes, its scheme and k8s.io/client-go/informers
// register every API group's types at init and link every group's client,
// informer and lister: about half of inplaced's executable and resident
// memory, for a daemon that reads and writes four core/v1 resources. This
// client makes the requests client-go's generated core/v1 clients make
// (their generic base, k8s.io/client-go/gentype, written out for the five
// calls used: gentype also has client-go's fake clients, which link
// k8s.io/client-go/testing and with it strategic merge patch, managed
// fields and the OpenAPI models) over a rest client whose scheme has only
// core/v1 and meta/v1. Same paths, verbs, subresources, query parameters,
// content types (protobuf preferred) and rate limits as
// kubernetes.Interface's CoreV1(): TestSameRequestsAsClientset.
//
// The interfaces name exactly the verbs inplaced uses, which are the verbs
// deploy/kubernetes/rbac.yaml grants, a pod's get for kubectl-inplace and a
// node's get and patch for inplaced-installer, which use this client too
// (the installer's ClusterRole in deploy/helm/inplaced grants those two and
// events create):
//
//	pods         list, watch, patch (and patch of pods/status); get (kubectl-inplace)
//	nodes        list, watch; get, patch (inplaced-installer)
//	secrets      get
//	events       create, patch
//
// cmd/inplaced's and cmd/kubectl-inplace's dependency tests keep the other
// API groups out.
package kubeclient

import (
	"context"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Scheme has core/v1 and the meta/v1 types every group version uses
// (options, Status, WatchEvent): all that inplaced decodes.
var Scheme = NewScheme(corev1.AddToScheme)

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

// NewScheme is a scheme with the meta/v1 types every group version uses
// and the group version addToScheme adds, built as
// k8s.io/client-go/kubernetes/scheme builds its own for every group: for a
// client of one group (inplaced-installer's of apps/v1) that links no other.
func NewScheme(addToScheme func(*runtime.Scheme) error) *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(addToScheme(s))
	return s
}

// Interface is what inplaced does with the API server.
type Interface interface {
	Pods(namespace string) PodInterface
	Nodes() NodeInterface
	Secrets(namespace string) SecretInterface
	Events() EventInterface
}

// PodInterface: the pods on this node, watched and patched; one pod read
// by name (kubectl-inplace).
type PodInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
}

// NodeInterface: this node's own object, watched; read and annotated by
// inplaced-installer.
type NodeInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error)
}

// SecretInterface: a pod's imagePullSecrets, read.
type SecretInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
}

// EventInterface: events about the node's pods, each written to its own
// namespace; a repeat patches the count of the first.
type EventInterface interface {
	Create(ctx context.Context, event *corev1.Event) (*corev1.Event, error)
	Patch(ctx context.Context, namespace, name string, data []byte) (*corev1.Event, error)
}

// Client implements Interface.
type Client struct {
	rest rest.Interface
}

var _ Interface = (*Client)(nil)

// NewForConfig returns a client for the API server of c, set up as
// k8s.io/client-go/kubernetes.NewForConfig sets up its CoreV1 client.
func NewForConfig(c *rest.Config) (*Client, error) {
	config := *c
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(&config)
	if err != nil {
		return nil, err
	}
	return NewForConfigAndClient(&config, httpClient)
}

// NewForConfigAndClient is NewForConfig with the given HTTP client, which
// takes precedence over c's transport settings.
func NewForConfigAndClient(c *rest.Config, h *http.Client) (*Client, error) {
	config := *c
	gv := corev1.SchemeGroupVersion
	config.GroupVersion = &gv
	config.APIPath = "/api"
	config.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientForConfigAndClient(&config, h)
	if err != nil {
		return nil, err
	}
	return &Client{rest: rc}, nil
}

// Pods returns the pods of namespace ("" for all).
func (c *Client) Pods(namespace string) PodInterface {
	return resource[*corev1.Pod, *corev1.PodList]{rest: c.rest, name: "pods", namespace: namespace,
		newObject: func() *corev1.Pod { return &corev1.Pod{} }, newList: func() *corev1.PodList { return &corev1.PodList{} }}
}

// Nodes returns the nodes.
func (c *Client) Nodes() NodeInterface {
	return resource[*corev1.Node, *corev1.NodeList]{rest: c.rest, name: "nodes",
		newObject: func() *corev1.Node { return &corev1.Node{} }, newList: func() *corev1.NodeList { return &corev1.NodeList{} }}
}

// Secrets returns the secrets of namespace.
func (c *Client) Secrets(namespace string) SecretInterface {
	return resource[*corev1.Secret, *corev1.SecretList]{rest: c.rest, name: "secrets", namespace: namespace,
		newObject: func() *corev1.Secret { return &corev1.Secret{} }, newList: func() *corev1.SecretList { return &corev1.SecretList{} }}
}

// resource is one core/v1 resource, requested as gentype.Client requests
// it (with gentype.PrefersProtobuf, as the generated core/v1 clients do).
type resource[T, L runtime.Object] struct {
	rest      rest.Interface
	name      string
	namespace string // "" for a cluster-scoped resource, or all namespaces
	newObject func() T
	newList   func() L
}

func (r resource[T, L]) request(req *rest.Request) *rest.Request {
	return req.UseProtobufAsDefaultIfPreferred(true).NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.name)
}

func (r resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newObject()
	err := r.request(r.rest.Get()).Name(name).VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

func (r resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newList()
	err := r.request(r.rest.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeoutOf(opts)).Do(ctx).Into(out)
	return out, err
}

func (r resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request(r.rest.Get()).VersionedParams(&opts, parameterCodec).Timeout(timeoutOf(opts)).Watch(ctx)
}

func (r resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := r.newObject()
	err := r.request(r.rest.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds != nil {
		return time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return 0
}

// Events returns the events client.
func (c *Client) Events() EventInterface { return events{rest: c.rest} }

// events makes the requests client-go's event sink (typedcorev1.EventSinkImpl)
// makes: to the event's namespace, JSON, a strategic merge patch.
type events struct {
	rest rest.Interface
}

func (e events) Create(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.rest.Post().NamespaceIfScoped(event.Namespace, event.Namespace != "").Resource("events").
		Body(event).Do(ctx).Into(out)
	return out, err
}

func (e events) Patch(ctx context.Context, namespace, name string, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := e.rest.Patch(types.StrategicMergePatchType).NamespaceIfScoped(namespace, namespace != "").Resource("events").
		Name(name).Body(data).Do(ctx).Into(out)
	return out, err
}
